// Package rpcerr is the one mapping from an error to the gRPC status a
// client sees (ToStatus), shared by the services and the guard, and the
// field errors validation returns (Invalidf, InvalidWrap). Only messages
// written here reach a client; a store's own error text goes to the log.
package rpcerr

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"syscall"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"

	"github.com/delayd/delayd/server/wire"
	"github.com/delayd/delayd/storage"
)

// Messages clients see for store failures. They are fixed text: a store's
// own error text (addresses, commands, driver messages) never reaches a
// client; it goes to the log.
const (
	MsgUnavailable    = "store unavailable, safe to retry"
	MsgInternal       = "internal error; it has been logged"
	MsgNotFound       = "not found"
	MsgExists         = "already exists"
	MsgQuota          = "namespace quota exceeded: max_pending_tasks reached"
	MsgNotEmpty       = "namespace not empty: remove or purge its tasks first"
	MsgStale          = "stale generation: the task changed concurrently; retry"
	MsgBadPageToken   = "page_token is not a token this server issued; start again with an empty page_token"
	MsgNamespaceEnded = "the namespace was deleted (and perhaps re-created) while the request was in flight; nothing was written"
)

// FieldError is a client mistake in one request field. Its text names the
// field and says what is allowed; ToStatus turns it into InvalidArgument.
type FieldError struct {
	Field string // e.g. "tasks[3].id"
	Msg   string // e.g. "is required: 1-128 characters of [A-Za-z0-9._-]"
}

func (e *FieldError) Error() string { return e.Field + " " + e.Msg }

// Invalidf returns a FieldError for field with a formatted message. The
// message follows the field name: Invalidf("page_size", "is %d; allowed: 0-1000", n)
// reads "page_size is -1; allowed: 0-1000".
func Invalidf(field, format string, args ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// InvalidWrap returns a FieldError for field whose message is err's text.
// Use it only with errors written for clients (the storage name validators).
func InvalidWrap(field string, err error) error {
	return &FieldError{Field: field, Msg: err.Error()}
}

// ToStatus is THE mapping from an error to the gRPC status a client sees.
// Every handler of the services and the guard returns its errors through
// it.
//
//   - a *FieldError (validation)          → InvalidArgument, its text
//   - an error that already is a status   → unchanged
//   - ctx (the request's) ended           → Canceled / DeadlineExceeded
//   - storage.ErrNotFound                 → NotFound
//   - storage.ErrUnavailable, a deadline of a store call, a network error
//     → Unavailable "store unavailable, safe to retry"
//   - storage.ErrQuotaExceeded            → ResourceExhausted
//   - storage.ErrAlreadyExists            → AlreadyExists
//   - storage.ErrNotEmpty                 → FailedPrecondition
//   - storage.ErrStale                    → Aborted
//   - storage.ErrInvalidCursor            → InvalidArgument (page_token)
//   - a *storage.ConflictError (a failed create_only or if_generation)
//     → AlreadyExists / FailedPrecondition with details (conflictStatus)
//   - anything else                       → Internal, generic message
//
// Only messages written in this package reach the client; whenever the code
// is Unavailable or Internal the real error is logged with the method name.
// ToStatus(ctx, logger, nil) is nil.
func ToStatus(ctx context.Context, logger *slog.Logger, err error) error {
	if err == nil {
		return nil
	}
	var fe *FieldError
	if errors.As(err, &fe) {
		return status.Error(codes.InvalidArgument, fe.Error())
	}
	if _, ok := err.(interface{ GRPCStatus() *status.Status }); ok {
		return err
	}
	var ce *storage.ConflictError
	if errors.As(err, &ce) {
		return conflictStatus(ce).Err()
	}
	code, msg := classify(err)
	if code == codes.Unavailable || code == codes.Internal {
		// The request's own deadline or cancellation is the client's doing,
		// not the store's; say so instead of blaming the store.
		if ctxErr := ctx.Err(); ctxErr != nil {
			return status.FromContextError(ctxErr).Err()
		}
		logError(ctx, logger, code, err)
	}
	return status.Error(code, msg)
}

// classify picks the code and the client-safe message for err.
func classify(err error) (codes.Code, string) {
	switch {
	case errors.Is(err, storage.ErrNotFound):
		return codes.NotFound, MsgNotFound
	case errors.Is(err, storage.ErrQuotaExceeded):
		return codes.ResourceExhausted, MsgQuota
	case errors.Is(err, storage.ErrAlreadyExists):
		return codes.AlreadyExists, MsgExists
	case errors.Is(err, storage.ErrNotEmpty):
		return codes.FailedPrecondition, MsgNotEmpty
	case errors.Is(err, storage.ErrStale):
		return codes.Aborted, MsgStale
	case errors.Is(err, storage.ErrInvalidCursor):
		return codes.InvalidArgument, MsgBadPageToken
	case errors.Is(err, storage.ErrNamespaceEnded):
		return codes.NotFound, MsgNamespaceEnded
	case isUnavailable(err):
		return codes.Unavailable, MsgUnavailable
	default:
		return codes.Internal, MsgInternal
	}
}

// isUnavailable reports whether err means a store could not be reached in
// time. Stores wrap such errors with storage.ErrUnavailable; the other cases
// are a safety net for a store that forgot to.
func isUnavailable(err error) bool {
	if errors.Is(err, storage.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne)
}

func logError(ctx context.Context, logger *slog.Logger, code codes.Code, err error) {
	if logger == nil {
		return
	}
	method, _ := grpc.Method(ctx)
	level := slog.LevelError
	if code == codes.Unavailable {
		level = slog.LevelWarn
	}
	logger.LogAttrs(ctx, level, "request failed",
		slog.String("grpc.method", method),
		slog.String("grpc.code", code.String()),
		slog.String("error", err.Error()))
}

// ErrorInfo domain and reasons of the conditional writes' errors (see the
// TaskService comment in task.proto).
const (
	errorDomain          = "delayd.v1"
	reasonTaskExists     = "TASK_EXISTS"
	reasonGenerationDiff = "GENERATION_MISMATCH"
)

// conflictStatus is the status of a conditional write that changed
// nothing: AlreadyExists (create_only; the task exists) or
// FailedPrecondition (if_generation; another generation, or with
// if_incarnation another incarnation, is stored). Its details are a
// google.rpc.ErrorInfo whose metadata holds the stored version
// ("generation" and "incarnation", "0" when there is no task) and, for
// FailedPrecondition, the one expected ("expected", and
// "expected_incarnation" when one was sent); then the stored task when
// there is one.
func conflictStatus(ce *storage.ConflictError) *status.Status {
	gen := strconv.FormatInt(ce.Task.Generation, 10)
	var st *status.Status
	info := &errdetails.ErrorInfo{Domain: errorDomain, Metadata: map[string]string{
		"generation": gen, "incarnation": strconv.FormatInt(ce.Task.Incarnation, 10)}}
	if errors.Is(ce.Err, storage.ErrGenerationMismatch) {
		want := ce.Expected
		info.Reason = reasonGenerationDiff
		info.Metadata["expected"] = strconv.FormatInt(want.Generation, 10)
		if want.Incarnation != 0 {
			info.Metadata["expected_incarnation"] = strconv.FormatInt(want.Incarnation, 10)
		}
		switch {
		case ce.Task.ID == "":
			st = status.Newf(codes.FailedPrecondition, "the task does not exist (generation 0), not at generation %d (if_generation); nothing changed", want.Generation)
		case ce.Task.Generation == want.Generation:
			st = status.Newf(codes.FailedPrecondition, "task %q is another incarnation (%d, not %d: removed and created again since it was read); nothing changed: read it again and decide",
				ce.Task.ID, ce.Task.Incarnation, want.Incarnation)
		default:
			st = status.Newf(codes.FailedPrecondition, "task %q is at generation %d, not %d (if_generation); nothing changed: read it again and decide", ce.Task.ID, ce.Task.Generation, want.Generation)
		}
	} else {
		info.Reason = reasonTaskExists
		st = status.Newf(codes.AlreadyExists, "task %q already exists (generation %d); create_only changed nothing", ce.Task.ID, ce.Task.Generation)
	}
	details := []protoadapt.MessageV1{info}
	if ce.Task.ID != "" {
		details = append(details, wire.Task(ce.Task))
	}
	if ds, err := st.WithDetails(details...); err == nil {
		return ds
	}
	return st
}
