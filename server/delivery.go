package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/delayd/delayd/dispatcher"
	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/server/rpcerr"
	"github.com/delayd/delayd/server/wire"
	"github.com/delayd/delayd/storage"
)

// Delivery limits that are not per namespace.
const (
	// maxReasonBytes is the longest nack reason kept; longer is cut.
	maxReasonBytes = 1024
	// maxExtendBy is the longest ExtendLease.extend_by.
	maxExtendBy = 12 * time.Hour
	// msgShuttingDown ends Subscribe streams when the server stops.
	msgShuttingDown = "server shutting down, reconnect"
)

// deliveryService implements delaydv1.DeliveryServiceServer. Subscribe hands
// the stream to the dispatcher, whose Serve runs in the stream's goroutine
// (the stream's only sender); AckTasks, NackTasks and ExtendLease make one
// store call per request, answer per token, and tell the dispatcher which
// deliveries of its streams were settled or extended, so their credit
// comes back at once.
type deliveryService struct {
	delaydv1.UnimplementedDeliveryServiceServer

	opts   Options
	limits Limits
	logger *slog.Logger
}

func newDeliveryService(opts Options) *deliveryService {
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &deliveryService{opts: opts, limits: opts.Limits, logger: logger}
}

// Subscribe streams due tasks of one namespace until the client goes away or
// the server shuts down (then UNAVAILABLE: reconnect). Headers are sent as
// soon as the stream is registered, so a client that waits for them knows
// it is subscribed.
func (s *deliveryService) Subscribe(req *delaydv1.SubscribeRequest, stream delaydv1.DeliveryService_SubscribeServer) error {
	ctx := stream.Context()
	ns := req.GetNamespace()
	inFlight, kinds, err := s.openStream(ctx, ns, req.GetMaxInFlight(), req.GetKinds())
	if err != nil {
		return err
	}
	// The stream guard (guard/streamguard.go) holds the stream's caps and cancels
	// ctx when its key is revoked or its namespace deleted; it then answers
	// the stream's status.
	err = s.opts.Subscriptions.Serve(ctx, dispatcher.Subscriber{
		Namespace:   ns,
		MaxInFlight: inFlight,
		Kinds:       kinds,
		Ready:       func() error { return stream.SendHeader(metadata.MD{}) },
		Send: func(d storage.Delivery) error {
			return stream.Send(&delaydv1.SubscribeResponse{Delivery: deliveryToProto(d)})
		},
	})
	return s.streamEnded(ctx, err)
}

// inFlight validates a max_in_flight field (0: the default).
func (s *deliveryService) inFlight(v int32) (int, error) {
	inFlight := int(v)
	switch {
	case inFlight == 0:
		return s.limits.DefaultInFlight, nil
	case inFlight < 0 || inFlight > s.limits.MaxInFlight:
		return 0, rpcerr.Invalidf("max_in_flight", "is %d; allowed: 1-%d, or 0 for %d",
			inFlight, s.limits.MaxInFlight, s.limits.DefaultInFlight)
	}
	return inFlight, nil
}

// openStream validates what opens a Subscribe or StreamDeliveries stream
// and checks that the namespace delivers to streams; it returns the
// stream's max_in_flight and kinds, or a status error to return as is.
func (s *deliveryService) openStream(ctx context.Context, ns string, maxInFlight int32, rawKinds []string) (int, []string, error) {
	if err := validateNamespace("namespace", ns); err != nil {
		return 0, nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	inFlight, err := s.inFlight(maxInFlight)
	if err != nil {
		return 0, nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	kinds, err := subscribeKinds(rawKinds)
	if err != nil {
		return 0, nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	pol, err := policyOrCreate(ctx, s.opts.Tenancy, s.logger, ns)
	if err != nil {
		return 0, nil, err
	}
	if pol.Push.Enabled() {
		// Its due tasks go to the push target; a stream would take a share
		// of them from it.
		disabled := ""
		if s.opts.PushAllow == nil || !s.opts.PushAllow.Enabled() {
			disabled = " (push is disabled on this server, --push-allow is empty: the tasks wait for a replica that pushes)"
		}
		return 0, nil, status.Errorf(codes.FailedPrecondition,
			"namespace %q delivers its tasks to its HTTP push target (policy.push.url)%s; Subscribe is refused while push is set: turn push off (update policy.push with an empty url) to consume over Subscribe", ns, disabled)
	}
	return inFlight, kinds, nil
}

// streamEnded is the status a Subscribe or StreamDeliveries stream ends
// with, given Serve's error.
func (s *deliveryService) streamEnded(ctx context.Context, err error) error {
	switch {
	case errors.Is(err, dispatcher.ErrStopped):
		return status.Error(codes.Unavailable, msgShuttingDown)
	case ctx.Err() != nil:
		return status.FromContextError(ctx.Err()).Err()
	}
	return rpcerr.ToStatus(ctx, s.logger, err)
}

// WatchDeliveries streams copies of the namespace's deliveries, made by
// this replica or (when the dispatcher has a feed) by any replica, until
// the client goes away or the server shuts down. Headers are sent as soon as
// the watch is registered, so a client that waits for them knows no later
// delivery of this replica escapes it (another replica's: see
// dispatcher.FeedRecheck). Copies carry no token.
func (s *deliveryService) WatchDeliveries(req *delaydv1.WatchDeliveriesRequest, stream delaydv1.DeliveryService_WatchDeliveriesServer) error {
	ctx := stream.Context()
	ns := req.GetNamespace()
	if err := validateNamespace("namespace", ns); err != nil {
		return rpcerr.ToStatus(ctx, s.logger, err)
	}
	if _, err := lookupPolicy(ctx, s.opts.Tenancy, s.logger, ns); err != nil {
		return err
	}
	err := s.opts.Subscriptions.Watch(ctx, dispatcher.Watcher{
		Namespace: ns,
		Ready:     func() error { return stream.SendHeader(metadata.MD{}) },
		Send: func(w dispatcher.Watched) error {
			return stream.Send(&delaydv1.WatchDeliveriesResponse{
				Task:          wire.Task(w.Delivery.Task),
				LeaseDeadline: wire.Time(w.Delivery.LeaseDeadline),
				DeliveryTime:  wire.Time(w.SentAt),
				Missed:        w.Missed,
			})
		},
	})
	switch {
	case errors.Is(err, dispatcher.ErrStopped):
		return status.Error(codes.Unavailable, msgShuttingDown)
	case ctx.Err() != nil:
		return status.FromContextError(ctx.Err()).Err()
	case errors.Is(err, dispatcher.ErrWatchBehind):
		return status.Errorf(codes.ResourceExhausted,
			"the watch was ended: a copy could not be sent for %v, as this client stopped reading; watch again and read as the copies come "+
				"(a watch holds at most %d KiB of copies for a slow reader, the rest are counted as missed)",
			dispatcher.DefaultWatchStall, dispatcher.DefaultWatchBufferBytes>>10)
	}
	return rpcerr.ToStatus(ctx, s.logger, err)
}

// AckTasks acks deliveries; the tasks are deleted. Answers per token.
func (s *deliveryService) AckTasks(ctx context.Context, req *delaydv1.AckTasksRequest) (*delaydv1.AckTasksResponse, error) {
	results, err := s.ack(ctx, req.GetNamespace(), req.GetTokens())
	if err != nil {
		return nil, err
	}
	return &delaydv1.AckTasksResponse{Results: results}, nil
}

// ack is AckTasks (and a StreamDeliveries request's ack_tokens): one result
// per token, or a status error to return as is.
func (s *deliveryService) ack(ctx context.Context, ns string, raw []string) ([]*delaydv1.TokenResult, error) {
	b, err := s.decodeBatch(ns, raw)
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	if len(b.tokens) > 0 {
		statuses, err := s.opts.Store.Ack(ctx, ns, b.tokens)
		if err == nil && len(statuses) != len(b.tokens) {
			err = fmt.Errorf("ack: store answered %d statuses for %d tokens", len(statuses), len(b.tokens))
		}
		if err != nil {
			return nil, rpcerr.ToStatus(ctx, s.logger, err)
		}
		s.settle(ctx, ns, b.tokens, statuses)
		for i, st := range statuses {
			b.results[b.index[i]].Status = wire.TokenStatus(st)
		}
	}
	return b.results, nil
}

// NackTasks gives deliveries back for a retry (or to dead letters when their
// attempts are used up). Answers per token.
func (s *deliveryService) NackTasks(ctx context.Context, req *delaydv1.NackTasksRequest) (*delaydv1.NackTasksResponse, error) {
	results, err := s.nack(ctx, req.GetNamespace(), req.GetTokens(), req.GetRetryAfter(), req.GetReason())
	if err != nil {
		return nil, err
	}
	return &delaydv1.NackTasksResponse{Results: results}, nil
}

// nack is NackTasks (and a StreamDeliveries request's nacks): one result
// per token, or a status error to return as is.
func (s *deliveryService) nack(ctx context.Context, ns string, raw []string, retryAfter *durationpb.Duration, reason string) ([]*delaydv1.TokenResult, error) {
	b, err := s.decodeBatch(ns, raw)
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	pol, err := lookupPolicy(ctx, s.opts.Tenancy, s.logger, ns)
	if err != nil {
		return nil, err
	}
	opts := storage.NackOptions{
		Reason:      truncateUTF8(reason, maxReasonBytes),
		MaxAttempts: pol.MaxAttempts,
		Backoff:     pol.Backoff,
	}
	if retryAfter != nil {
		d, err := durationField("retry_after", retryAfter, 0, pol.MaxDelay)
		if err != nil {
			return nil, rpcerr.ToStatus(ctx, s.logger, err)
		}
		opts.RetryAfter = &d
	}
	if len(b.tokens) > 0 {
		statuses, moved, err := s.opts.Store.Nack(ctx, ns, b.tokens, opts)
		if err == nil && len(statuses) != len(b.tokens) {
			err = fmt.Errorf("nack: store answered %d statuses for %d tokens", len(statuses), len(b.tokens))
		}
		if err != nil {
			return nil, rpcerr.ToStatus(ctx, s.logger, err)
		}
		s.settle(ctx, ns, b.tokens, statuses)
		for i, st := range statuses {
			b.results[b.index[i]].Status = wire.TokenStatus(st)
		}
		for _, m := range moved {
			if m.State == storage.StateScheduled {
				// The retry may be due before the dispatcher's planned wake.
				s.opts.Subscriptions.Notify(ns)
				break
			}
		}
	}
	return b.results, nil
}

// ExtendLease moves lease deadlines to now + extend_by (default: the
// namespace's ack timeout). Answers per token with the new deadline.
func (s *deliveryService) ExtendLease(ctx context.Context, req *delaydv1.ExtendLeaseRequest) (*delaydv1.ExtendLeaseResponse, error) {
	results, err := s.extend(ctx, req.GetNamespace(), req.GetTokens(), req.GetExtendBy())
	if err != nil {
		return nil, err
	}
	return &delaydv1.ExtendLeaseResponse{Results: results}, nil
}

// extend is ExtendLease (and a StreamDeliveries request's extends): one
// result per token, or a status error to return as is.
func (s *deliveryService) extend(ctx context.Context, ns string, raw []string, extendBy *durationpb.Duration) ([]*delaydv1.TokenResult, error) {
	b, err := s.decodeBatch(ns, raw)
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	pol, err := lookupPolicy(ctx, s.opts.Tenancy, s.logger, ns)
	if err != nil {
		return nil, err
	}
	by := pol.AckTimeout
	if extendBy != nil {
		if by, err = durationField("extend_by", extendBy, time.Millisecond, maxExtendBy); err != nil {
			return nil, rpcerr.ToStatus(ctx, s.logger, err)
		}
	}
	if len(b.tokens) > 0 {
		res, err := s.opts.Store.Extend(ctx, ns, b.tokens, by)
		if err == nil && len(res) != len(b.tokens) {
			err = fmt.Errorf("extend: store answered %d results for %d tokens", len(res), len(b.tokens))
		}
		if err != nil {
			return nil, rpcerr.ToStatus(ctx, s.logger, err)
		}
		extended := make([]storage.Token, 0, len(res))
		for i, r := range res {
			out := b.results[b.index[i]]
			out.Status = wire.TokenStatus(r.Status)
			if r.Status == storage.TokenOK {
				out.LeaseDeadline = wire.Time(r.LeaseDeadline)
				extended = append(extended, b.tokens[i])
			}
		}
		if len(extended) > 0 {
			s.opts.Subscriptions.LeaseExtended(ns, extended, by)
		}
	}
	return b.results, nil
}

// tokenBatch is a decoded Ack/Nack/Extend request: one result per request
// token, in request order, and the tokens of the request's namespace to
// hand to the store (tokens[i] answers results[index[i]]). Tokens of another
// namespace are answered NOT_FOUND and malformed ones MALFORMED, without
// reaching the store.
type tokenBatch struct {
	results []*delaydv1.TokenResult
	tokens  []storage.Token
	index   []int
}

func (s *deliveryService) decodeBatch(ns string, raw []string) (tokenBatch, error) {
	if err := validateNamespace("namespace", ns); err != nil {
		return tokenBatch{}, err
	}
	if err := validateBatchSize("tokens", len(raw), s.limits.MaxBatch); err != nil {
		return tokenBatch{}, err
	}
	b := tokenBatch{
		results: make([]*delaydv1.TokenResult, len(raw)),
		tokens:  make([]storage.Token, 0, len(raw)),
		index:   make([]int, 0, len(raw)),
	}
	for i, r := range raw {
		tok, err := decodeToken(r)
		if err != nil {
			// Answered like an unknown token, per token: one bad string
			// never costs the call its other verdicts.
			b.results[i] = &delaydv1.TokenResult{Token: r, Status: delaydv1.TokenStatus_TOKEN_STATUS_MALFORMED}
			continue
		}
		b.results[i] = &delaydv1.TokenResult{Token: r, Status: delaydv1.TokenStatus_TOKEN_STATUS_NOT_FOUND}
		if tok.Namespace != ns {
			continue // A token is only valid in its own namespace.
		}
		b.tokens = append(b.tokens, tok)
		b.index = append(b.index, i)
	}
	return b, nil
}

// settle gives the credit of the deliveries an ack or nack answered back to
// their streams, on this replica or (those the store settled) another.
func (s *deliveryService) settle(ctx context.Context, ns string, tokens []storage.Token, statuses []storage.TokenStatus) {
	settled := make([]bool, len(tokens))
	for i := range tokens {
		settled[i] = i < len(statuses) && statuses[i] == storage.TokenOK
	}
	s.opts.Subscriptions.Settle(ctx, ns, tokens, settled)
}

// deliveryToProto converts a delivery to its wire form.
func deliveryToProto(d storage.Delivery) *delaydv1.Delivery {
	return &delaydv1.Delivery{
		Task:          wire.Task(d.Task),
		Token:         encodeToken(d.Token),
		LeaseDeadline: wire.Time(d.LeaseDeadline),
	}
}

// maxSubscribeKinds bounds SubscribeRequest.kinds (each kind is an
// argument of every pop for the stream).
const maxSubscribeKinds = 32

// subscribeKinds validates SubscribeRequest.kinds and drops duplicates;
// nil means every kind.
func subscribeKinds(in []string) ([]string, error) {
	if len(in) > maxSubscribeKinds {
		return nil, rpcerr.Invalidf("kinds", "has %d kinds; allowed: at most %d (empty: every kind)", len(in), maxSubscribeKinds)
	}
	var out []string
	for i, k := range in {
		if err := validateKind(fmt.Sprintf("kinds[%d]", i), k); err != nil {
			return nil, err
		}
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out, nil
}

// lookupPolicy returns ns's policy, or a status error to return as is:
// NotFound when the namespace does not exist. It never creates the
// namespace, even when the server auto-creates them: a read, a verdict or an
// admin call naming a typo must not leave a namespace behind. Only calls that
// put a namespace to use create it (policyOrCreate).
func lookupPolicy(ctx context.Context, policies Tenancy, logger *slog.Logger, ns string) (storage.Policy, error) {
	n, err := policies.Namespace(ctx, ns, false)
	return policyStatus(ctx, logger, ns, n.Policy, err)
}

// policyOrCreate is lookupPolicy for UpsertTask, BatchUpsertTasks and
// Subscribe: with auto-create on, an unknown namespace is created.
func policyOrCreate(ctx context.Context, policies Tenancy, logger *slog.Logger, ns string) (storage.Policy, error) {
	n, err := policies.Namespace(ctx, ns, true)
	return policyStatus(ctx, logger, ns, n.Policy, err)
}

// policyStatus turns a policy lookup's error into the status to answer.
func policyStatus(ctx context.Context, logger *slog.Logger, ns string, pol storage.Policy, err error) (storage.Policy, error) {
	if errors.Is(err, storage.ErrNotFound) {
		return storage.Policy{}, status.Errorf(codes.NotFound, "namespace %q not found", ns)
	}
	if err != nil {
		return storage.Policy{}, rpcerr.ToStatus(ctx, logger, fmt.Errorf("policy: %w", err))
	}
	return pol, nil
}

// durationField validates a Duration request field: a valid duration in
// [lo, hi] (hi 0 = no upper bound).
func durationField(field string, d *durationpb.Duration, lo, hi time.Duration) (time.Duration, error) {
	if err := d.CheckValid(); err != nil {
		return 0, rpcerr.Invalidf(field, "is not a valid duration")
	}
	v := d.AsDuration()
	if v < lo || (hi > 0 && v > hi) {
		if hi > 0 {
			return 0, rpcerr.Invalidf(field, "is %s; allowed: %s to %s", v, lo, humanDuration(hi))
		}
		return 0, rpcerr.Invalidf(field, "is %s; allowed: at least %s", v, lo)
	}
	return v, nil
}

// truncateUTF8 cuts s to at most n bytes without splitting a character.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
