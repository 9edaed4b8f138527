package server

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"
	"unicode"
	"unicode/utf8"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/server/rpcerr"
	"github.com/delayd/delayd/storage"
)

// Request limits that are not per namespace.
const (
	// maxKindLen is the most characters (not bytes) a kind may have.
	maxKindLen = 128
	// defaultPageSize is used when ListTasks asks for page_size 0.
	defaultPageSize = 100
	// maxPageSize is the largest page ListTasks serves.
	maxPageSize = 1000
	// maxPageTokenLen bounds a page token before it is decoded.
	maxPageTokenLen = 4096
)

// minDueTime is the earliest due_time accepted.
var minDueTime = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// Validation happens at the edge, before any store call. Every error is a
// *rpcerr.FieldError naming the field (with its index inside a batch, e.g.
// "tasks[3].id") and what is allowed.

func validateNamespace(field, ns string) error {
	if err := storage.ValidateNamespace(ns); err != nil {
		return rpcerr.InvalidWrap(field, err)
	}
	return nil
}

func validateTaskID(field, id string) error {
	if err := storage.ValidateTaskID(id); err != nil {
		return rpcerr.InvalidWrap(field, err)
	}
	return nil
}

// validateKind accepts "" or up to maxKindLen printable characters of valid
// UTF-8 (no control characters).
func validateKind(field, kind string) error {
	if !utf8.ValidString(kind) {
		return rpcerr.Invalidf(field, "is not valid UTF-8; allowed: at most %d printable characters", maxKindLen)
	}
	if n := utf8.RuneCountInString(kind); n > maxKindLen {
		return rpcerr.Invalidf(field, "is %d characters long; at most %d printable characters are allowed", n, maxKindLen)
	}
	for i, r := range kind {
		if !unicode.IsPrint(r) {
			return rpcerr.Invalidf(field, "has the non-printable character %U at byte %d; allowed: at most %d printable characters", r, i, maxKindLen)
		}
	}
	return nil
}

func validatePayload(field string, payload []byte, limit int) error {
	if limit > 0 && len(payload) > limit {
		return rpcerr.Invalidf(field, "is %d bytes; at most %d bytes are allowed in this namespace", len(payload), limit)
	}
	return nil
}

// upsertSpec validates one UpsertTaskRequest and turns it into a store spec.
// prefix is "" for UpsertTask and "tasks[i]." inside a batch; batchNS is the
// batch's namespace ("" for UpsertTask, where req.Namespace is checked by the
// caller). now is the server clock, used only for the horizon check: the
// store resolves delays with its own clock.
func upsertSpec(prefix string, req *delaydv1.UpsertTaskRequest, batchNS string, pol storage.Policy, now time.Time) (storage.UpsertSpec, error) {
	if batchNS != "" && req.GetNamespace() != "" && req.GetNamespace() != batchNS {
		return storage.UpsertSpec{}, rpcerr.Invalidf(prefix+"namespace", "is %q; it must be empty or equal the batch namespace %q", req.GetNamespace(), batchNS)
	}
	if err := validateTaskID(prefix+"id", req.GetId()); err != nil {
		return storage.UpsertSpec{}, err
	}
	if err := validateKind(prefix+"kind", req.GetKind()); err != nil {
		return storage.UpsertSpec{}, err
	}
	if err := validatePayload(prefix+"payload", req.GetPayload(), pol.MaxPayloadBytes); err != nil {
		return storage.UpsertSpec{}, err
	}
	ifv, err := ifVersionOf(prefix, req.GetIfGeneration(), req.GetIfIncarnation())
	if err != nil {
		return storage.UpsertSpec{}, err
	}
	if req.GetCreateOnly() && req.GetIfGeneration() != 0 {
		return storage.UpsertSpec{}, rpcerr.Invalidf(prefix+"if_generation", "is %d with create_only set; set at most one of them (create_only expects no task, if_generation an existing one)", req.GetIfGeneration())
	}
	spec := storage.UpsertSpec{ID: req.GetId(), Kind: req.GetKind(), Payload: req.GetPayload(),
		CreateOnly: req.GetCreateOnly(), IfGeneration: ifv.Generation, IfIncarnation: ifv.Incarnation}
	switch w := req.GetWhen().(type) {
	case *delaydv1.UpsertTaskRequest_DueTime:
		if err := w.DueTime.CheckValid(); err != nil {
			return storage.UpsertSpec{}, rpcerr.Invalidf(prefix+"due_time", "is not a valid timestamp; allowed: 0001-01-01 to 9999-12-31 UTC")
		}
		due := w.DueTime.AsTime()
		if due.Before(minDueTime) {
			// The epoch and year 1 are what an unset time field turns into
			// in many clients; a store could not read them back as sent.
			return storage.UpsertSpec{}, rpcerr.Invalidf(prefix+"due_time", "is %s; allowed: %s or later (a past time means due now), or use delay",
				due.Format(time.RFC3339), minDueTime.Format(time.RFC3339))
		}
		if pol.MaxDelay > 0 && due.Sub(now) > pol.MaxDelay {
			return storage.UpsertSpec{}, rpcerr.Invalidf(prefix+"due_time", "is %s; at most %s ahead (the namespace's horizon, until %s) is allowed",
				due.UTC().Format(time.RFC3339), humanDuration(pol.MaxDelay), now.Add(pol.MaxDelay).UTC().Format(time.RFC3339))
		}
		// A time in the past means due now.
		spec.DueTime = due
	case *delaydv1.UpsertTaskRequest_Delay:
		if err := w.Delay.CheckValid(); err != nil {
			return storage.UpsertSpec{}, rpcerr.Invalidf(prefix+"delay", "is not a valid duration; allowed: 0 to the namespace's horizon (%s)", humanDuration(pol.MaxDelay))
		}
		d := w.Delay.AsDuration()
		if d < 0 {
			return storage.UpsertSpec{}, rpcerr.Invalidf(prefix+"delay", "is %s; it must not be negative (use 0s for due now)", d)
		}
		if pol.MaxDelay > 0 && d > pol.MaxDelay {
			return storage.UpsertSpec{}, rpcerr.Invalidf(prefix+"delay", "is %s; at most %s (the namespace's horizon) is allowed",
				humanDuration(d), humanDuration(pol.MaxDelay))
		}
		spec.Delay = d
	default:
		return storage.UpsertSpec{}, rpcerr.Invalidf(prefix+"due_time", "or %sdelay is required: set exactly one of them", prefix)
	}
	return spec, nil
}

// validateBatchSize checks the number of items of a batch call.
func validateBatchSize(field string, n, limit int) error {
	if n == 0 {
		return rpcerr.Invalidf(field, "is empty; 1-%d items are allowed", limit)
	}
	if n > limit {
		return rpcerr.Invalidf(field, "has %d items; at most %d are allowed", n, limit)
	}
	return nil
}

// validateBatchPayload checks that a batch's payloads total at most limit
// bytes, so the store call and the reply (which carries them back) stay
// bounded however many items the batch has.
func validateBatchPayload(items []*delaydv1.UpsertTaskRequest, limit int) error {
	total := 0
	for _, it := range items {
		total += len(it.GetPayload())
	}
	if limit > 0 && total > limit {
		return rpcerr.Invalidf("tasks", "carry %d payload bytes in total; at most %d are allowed in one call: split the batch", total, limit)
	}
	return nil
}

// pageSize resolves ListTasks' page_size: 0 means defaultPageSize.
func pageSize(n int32) (int, error) {
	switch {
	case n == 0:
		return defaultPageSize, nil
	case n < 0 || n > maxPageSize:
		return 0, rpcerr.Invalidf("page_size", "is %d; allowed: 1-%d, or 0 for %d", n, maxPageSize, defaultPageSize)
	}
	return int(n), nil
}

// taskView resolves a listing's view: whether it leaves payloads out.
// UNSPECIFIED is FULL, what listings returned before views existed.
func taskView(v delaydv1.TaskView) (noPayload bool, err error) {
	switch v {
	case delaydv1.TaskView_TASK_VIEW_UNSPECIFIED, delaydv1.TaskView_TASK_VIEW_FULL:
		return false, nil
	case delaydv1.TaskView_TASK_VIEW_BASIC:
		return true, nil
	}
	return false, rpcerr.Invalidf("view", "is %d; allowed: TASK_VIEW_BASIC (no payloads), TASK_VIEW_FULL, or unset for FULL", int32(v))
}

// listState resolves ListTasks' state: UNSPECIFIED means SCHEDULED.
func listState(s delaydv1.TaskState) (storage.State, error) {
	switch s {
	case delaydv1.TaskState_TASK_STATE_UNSPECIFIED, delaydv1.TaskState_TASK_STATE_SCHEDULED:
		return storage.StateScheduled, nil
	case delaydv1.TaskState_TASK_STATE_DELIVERED:
		return storage.StateDelivered, nil
	case delaydv1.TaskState_TASK_STATE_DEAD:
		return storage.StateDead, nil
	}
	return 0, rpcerr.Invalidf("state", "is %d; allowed: TASK_STATE_SCHEDULED, TASK_STATE_DELIVERED, TASK_STATE_DEAD (UNSPECIFIED means SCHEDULED)", int32(s))
}

// A ListTasks page token is opaque to clients. It carries the store's
// cursor bound to the namespace and state it was issued for, so a token from
// another list is rejected instead of silently paging the wrong set. Layout
// before base64url: version (1 byte) | state (1) | len(ns) (1) | ns | cursor.
// The token is not signed: the store still treats the cursor as untrusted
// input, and a token can only ever page through its request's namespace.
const pageTokenVersion = 1

func encodePageToken(ns string, state storage.State, cursor string) string {
	if cursor == "" {
		return ""
	}
	b := make([]byte, 0, 3+len(ns)+len(cursor))
	b = append(b, pageTokenVersion, byte(state), byte(len(ns)))
	b = append(b, ns...)
	b = append(b, cursor...)
	return base64.RawURLEncoding.EncodeToString(b)
}

// decodePageToken returns the store cursor in token, which must have been
// issued for ns and state. "" decodes to "" (the first page).
func decodePageToken(token, ns string, state storage.State) (string, error) {
	if token == "" {
		return "", nil
	}
	const again = "; start again with an empty page_token"
	bad := rpcerr.Invalidf("page_token", "is not a token this server issued"+again)
	if len(token) > maxPageTokenLen {
		return "", bad
	}
	b, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || len(b) < 3 || b[0] != pageTokenVersion {
		return "", bad
	}
	n := int(b[2])
	if len(b) <= 3+n { // the cursor is never empty
		return "", bad
	}
	if b[1] != byte(state) || string(b[3:3+n]) != ns {
		return "", rpcerr.Invalidf("page_token", "was issued for another namespace or state"+again)
	}
	return string(b[3+n:]), nil
}

// humanDuration prints whole days as "366 days" and the rest as
// time.Duration does.
func humanDuration(d time.Duration) string {
	const day = 24 * time.Hour
	if d >= day && d%day == 0 {
		return fmt.Sprintf("%d days", d/day)
	}
	if d > day {
		return fmt.Sprintf("%.1f days", d.Hours()/24)
	}
	return d.String()
}

// ifVersionOf validates if_generation (0, unconditional, or the generation
// last read) and if_incarnation (0, any, or the incarnation last read; only
// with if_generation). prefix is "" or "tasks[i]." inside a batch.
func ifVersionOf(prefix string, gen, inc int64) (storage.Version, error) {
	if gen < 0 {
		return storage.Version{}, rpcerr.Invalidf(prefix+"if_generation", "is %d; allowed: 0 (unconditional) or the generation last read (1 or more)", gen)
	}
	if inc < 0 {
		return storage.Version{}, rpcerr.Invalidf(prefix+"if_incarnation", "is %d; allowed: 0 (any) or the incarnation last read", inc)
	}
	if inc != 0 && gen == 0 {
		return storage.Version{}, rpcerr.Invalidf(prefix+"if_incarnation", "is %d without if_generation; set if_generation too (the generation last read)", inc)
	}
	return storage.Version{Generation: gen, Incarnation: inc}, nil
}

// maxRemoveIDs is the most ids one RemoveTasks call may name (the store's
// batch).
const maxRemoveIDs = 1000

// removeTasksParams validates a RemoveTasksRequest (all but its
// namespace) and turns it into store parameters.
func removeTasksParams(req *delaydv1.RemoveTasksRequest) (storage.RemoveTasksParams, error) {
	ids, f := req.GetIds(), req.GetFilter()
	switch {
	case len(ids) > 0 && f != nil:
		return storage.RemoveTasksParams{}, rpcerr.Invalidf("filter", "is set together with ids; set exactly one of ids and filter")
	case len(ids) == 0 && f == nil:
		return storage.RemoveTasksParams{}, rpcerr.Invalidf("ids", "or filter is required: set exactly one of them")
	case len(ids) > 0:
		if len(ids) > maxRemoveIDs {
			return storage.RemoveTasksParams{}, rpcerr.Invalidf("ids", "has %d items; at most %d are allowed", len(ids), maxRemoveIDs)
		}
		if req.GetPageToken() != "" {
			return storage.RemoveTasksParams{}, rpcerr.Invalidf("page_token", "is set with ids; it only continues a filter")
		}
		for i, id := range ids {
			if err := validateTaskID(fmt.Sprintf("ids[%d]", i), id); err != nil {
				return storage.RemoveTasksParams{}, err
			}
		}
		return storage.RemoveTasksParams{IDs: ids}, nil
	}
	if f.GetKind() == "" && f.GetIdPrefix() == "" && f.GetState() == delaydv1.TaskState_TASK_STATE_UNSPECIFIED {
		return storage.RemoveTasksParams{}, rpcerr.Invalidf("filter", "is empty; set at least one of kind, id_prefix and state (to drop every task of a namespace, delete the namespace with force)")
	}
	if err := validateKind("filter.kind", f.GetKind()); err != nil {
		return storage.RemoveTasksParams{}, err
	}
	if f.GetIdPrefix() != "" {
		if err := validateTaskID("filter.id_prefix", f.GetIdPrefix()); err != nil {
			return storage.RemoveTasksParams{}, err
		}
	}
	filter := storage.TaskFilter{Kind: f.GetKind(), IDPrefix: f.GetIdPrefix()}
	if f.GetState() != delaydv1.TaskState_TASK_STATE_UNSPECIFIED {
		st, err := listState(f.GetState())
		if err != nil {
			return storage.RemoveTasksParams{}, rpcerr.Invalidf("filter.state", "is %d; allowed: TASK_STATE_UNSPECIFIED (any), TASK_STATE_SCHEDULED, TASK_STATE_DELIVERED, TASK_STATE_DEAD", int32(f.GetState()))
		}
		filter.State = st
	}
	cursor, err := decodeRemoveToken(req.GetPageToken(), req.GetNamespace(), filter)
	if err != nil {
		return storage.RemoveTasksParams{}, err
	}
	return storage.RemoveTasksParams{Filter: filter, Cursor: cursor}, nil
}

// A RemoveTasks page token carries the store's walk cursor bound to the
// namespace and filter it was issued for. Layout before base64url:
// version (1 byte) | FNV-1a 64 of namespace and filter (8) | cursor.
const removeTokenVersion = 2

func filterHash(ns string, f storage.TaskFilter) []byte {
	h := fnv.New64a()
	for _, part := range []string{ns, f.Kind, f.IDPrefix, strconv.Itoa(int(f.State))} {
		h.Write([]byte(part))
		h.Write([]byte{0})
	}
	return h.Sum(nil)
}

func encodeRemoveToken(ns string, f storage.TaskFilter, cursor string) string {
	if cursor == "" {
		return ""
	}
	b := append([]byte{removeTokenVersion}, filterHash(ns, f)...)
	return base64.RawURLEncoding.EncodeToString(append(b, cursor...))
}

func decodeRemoveToken(token, ns string, f storage.TaskFilter) (string, error) {
	if token == "" {
		return "", nil
	}
	const again = "; start again with an empty page_token"
	b, err := base64.RawURLEncoding.DecodeString(token)
	if len(token) > maxPageTokenLen || err != nil || len(b) <= 9 || b[0] != removeTokenVersion {
		return "", rpcerr.Invalidf("page_token", "is not a token this server issued"+again)
	}
	if !bytes.Equal(b[1:9], filterHash(ns, f)) {
		return "", rpcerr.Invalidf("page_token", "was issued for another namespace or filter"+again)
	}
	return string(b[9:]), nil
}
