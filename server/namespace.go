package server

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/server/guard"
	"github.com/delayd/delayd/server/rpcerr"
	"github.com/delayd/delayd/server/wire"
	"github.com/delayd/delayd/storage"
)

// deadLetterBatch is the most dead letters one store call requeues or
// purges when a request says all; the request loops over such batches.
const deadLetterBatch = 1000

// maxDeadLetterBatches bounds the batches of one "all" request (10 million
// tasks), so a namespace whose tasks keep dying cannot keep it looping.
const maxDeadLetterBatches = 10000

// namespaceService implements delaydv1.NamespaceServiceServer: stats and the
// dead-letter RPCs here; the namespace and API-key RPCs answer Unimplemented
// until the tenancy work adds them (as methods reading s.opts).
type namespaceService struct {
	delaydv1.UnimplementedNamespaceServiceServer

	opts   Options
	limits Limits
	logger *slog.Logger
	guard  *guard.Guard // ends this replica's streams of a revoked key or deleted namespace
}

func newNamespaceService(opts Options, g *guard.Guard) *namespaceService {
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &namespaceService{opts: opts, limits: opts.Limits, logger: logger, guard: g}
}

// lateScan is how many of the earliest due tasks GetNamespaceStats reads to
// find the one waiting longest.
const lateScan = 256

// oldestLateFrom is the earliest storage.LateFrom among the first lateScan
// due tasks of ns: the later of due time and creation, as the delivery
// lateness metric measures, so a task written with a due time long past
// does not count as years late. Beyond the first lateScan due tasks (all
// created after their due times) a task waiting longer is not seen.
func (s *namespaceService) oldestLateFrom(ctx context.Context, ns string, now time.Time) (time.Time, error) {
	page, _, err := s.opts.Store.List(ctx, ns, storage.ListParams{State: storage.StateScheduled, Limit: lateScan, NoPayload: true})
	if err != nil {
		return time.Time{}, err
	}
	oldest := now
	for i := range page {
		if page[i].DueTime.After(now) {
			break // in due order: the rest are not due yet
		}
		if from := storage.LateFrom(page[i]); from.Before(oldest) {
			oldest = from
		}
	}
	return oldest, nil
}

// GetNamespaceStats counts the namespace's tasks per state and says how late
// the oldest due, undelivered task is (by the store's clock), measured from
// the later of its due time and its creation (storage.LateFrom).
func (s *namespaceService) GetNamespaceStats(ctx context.Context, req *delaydv1.GetNamespaceStatsRequest) (*delaydv1.GetNamespaceStatsResponse, error) {
	ns := req.GetNamespace()
	if err := validateNamespace("namespace", ns); err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	n, err := s.opts.Tenancy.Namespace(ctx, ns, false)
	pol, err := policyStatus(ctx, s.logger, ns, n.Policy, err)
	if err != nil {
		return nil, err
	}
	st, err := s.opts.Store.Stats(ctx, ns)
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, fmt.Errorf("stats: %w", err))
	}
	dk, err := s.opts.Store.DueKinds(ctx, ns)
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, fmt.Errorf("stats: due kinds: %w", err))
	}
	resp := &delaydv1.GetNamespaceStatsResponse{
		Scheduled:         st.Scheduled,
		Delivered:         st.Delivered,
		Dead:              st.Dead,
		DueNow:            st.DueNow,
		OldestDueLateness: durationpb.New(0),
		Paused:            pol.Paused,
		DueByKind:         dk.Counts,
		DueByKindPartial:  dk.Partial,
		MaxDispatchRate:   pol.MaxDispatchRate,
		Push:              pol.Push.Enabled(),
	}
	if st.DueNow > 0 && !st.OldestDue.IsZero() && st.OldestDue.Before(st.Now) {
		from, err := s.oldestLateFrom(ctx, ns, st.Now)
		if err != nil {
			return nil, rpcerr.ToStatus(ctx, s.logger, fmt.Errorf("stats: oldest due: %w", err))
		}
		if from.Before(st.Now) {
			resp.OldestDueLateness = durationpb.New(st.Now.Sub(from))
		}
	}
	fc, err := s.opts.History.Forecast(ctx, ns)
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, fmt.Errorf("stats: forecast: %w", err))
	}
	// The schedules' firings not created yet fall due too: added to the
	// tasks' counts, and shown apart.
	ff, partial, err := s.opts.Schedules.Forecast(ctx, ns, fc.Now)
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, fmt.Errorf("stats: firings forecast: %w", err))
	}
	forecastToProto(resp, addForecast(fc, ff))
	resp.FiringsPerMinute, resp.FiringsPerHour, resp.FiringsPartial = ff.PerMinute, ff.PerHour, partial
	if s.opts.Recent != nil {
		recentToProto(resp, s.opts.Recent.Deliveries(ns, n.Incarnation()))
	}
	return resp, nil
}

// ListDeadLetters pages through dead tasks, oldest death first.
func (s *namespaceService) ListDeadLetters(ctx context.Context, req *delaydv1.ListDeadLettersRequest) (*delaydv1.ListDeadLettersResponse, error) {
	ns := req.GetNamespace()
	if err := validateNamespace("namespace", ns); err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	size, err := pageSize(req.GetPageSize())
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	cursor, err := decodePageToken(req.GetPageToken(), ns, storage.StateDead)
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	noPayload, err := taskView(req.GetView())
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	if _, err := lookupPolicy(ctx, s.opts.Tenancy, s.logger, ns); err != nil {
		return nil, err
	}
	tasks, next, err := s.opts.Store.List(ctx, ns, storage.ListParams{
		State: storage.StateDead, Limit: size, Cursor: cursor, MaxBytes: s.limits.MaxListBytes, NoPayload: noPayload,
	})
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, fmt.Errorf("list dead letters: %w", err))
	}
	resp := &delaydv1.ListDeadLettersResponse{
		Tasks:         make([]*delaydv1.Task, len(tasks)),
		NextPageToken: encodePageToken(ns, storage.StateDead, next),
	}
	for i, t := range tasks {
		resp.Tasks[i] = wire.Task(t)
	}
	return resp, nil
}

// RequeueDeadLetters moves dead tasks back to SCHEDULED with attempts reset,
// due after delay. With all, it works through the dead letters in bounded
// batches; if it is cut short (deadline, store down) it fails, and calling
// it again goes on where it stopped.
func (s *namespaceService) RequeueDeadLetters(ctx context.Context, req *delaydv1.RequeueDeadLettersRequest) (*delaydv1.RequeueDeadLettersResponse, error) {
	ns := req.GetNamespace()
	if err := s.validateDeadLetterIDs(ns, req.GetIds(), req.GetAll()); err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	pol, err := lookupPolicy(ctx, s.opts.Tenancy, s.logger, ns)
	if err != nil {
		return nil, err
	}
	var delay time.Duration
	if d := req.GetDelay(); d != nil {
		if delay, err = durationField("delay", d, 0, pol.MaxDelay); err != nil {
			return nil, rpcerr.ToStatus(ctx, s.logger, err)
		}
	}
	var requeued int64
	for i := 0; i < maxDeadLetterBatches; i++ {
		moved, err := s.opts.Store.Requeue(ctx, ns, storage.RequeueParams{
			IDs: req.GetIds(), All: req.GetAll(), Limit: deadLetterBatch, Delay: delay,
		})
		if err != nil {
			return nil, rpcerr.ToStatus(ctx, s.logger, fmt.Errorf("requeue dead letters: %w", err))
		}
		requeued += int64(len(moved))
		if !req.GetAll() || len(moved) < deadLetterBatch {
			break
		}
	}
	if requeued > 0 {
		s.opts.Subscriptions.Notify(ns)
	}
	return &delaydv1.RequeueDeadLettersResponse{Requeued: requeued}, nil
}

// PurgeDeadLetters deletes dead tasks for good. With all, it works through
// the dead letters in bounded batches.
func (s *namespaceService) PurgeDeadLetters(ctx context.Context, req *delaydv1.PurgeDeadLettersRequest) (*delaydv1.PurgeDeadLettersResponse, error) {
	ns := req.GetNamespace()
	if err := s.validateDeadLetterIDs(ns, req.GetIds(), req.GetAll()); err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	if _, err := lookupPolicy(ctx, s.opts.Tenancy, s.logger, ns); err != nil {
		return nil, err
	}
	var purged int64
	for i := 0; i < maxDeadLetterBatches; i++ {
		ids, err := s.opts.Store.Purge(ctx, ns, storage.PurgeParams{IDs: req.GetIds(), All: req.GetAll(), Limit: deadLetterBatch})
		if err != nil {
			return nil, rpcerr.ToStatus(ctx, s.logger, fmt.Errorf("purge dead letters: %w", err))
		}
		purged += int64(len(ids))
		if !req.GetAll() || len(ids) < deadLetterBatch {
			break
		}
	}
	return &delaydv1.PurgeDeadLettersResponse{Purged: purged}, nil
}

// validateDeadLetterIDs checks namespace, and ids against all: either 1 to
// MaxBatch valid ids, or all with no ids.
func (s *namespaceService) validateDeadLetterIDs(ns string, ids []string, all bool) error {
	if err := validateNamespace("namespace", ns); err != nil {
		return err
	}
	if all {
		if len(ids) > 0 {
			return rpcerr.Invalidf("ids", "has %d items; it must be empty when all is set", len(ids))
		}
		return nil
	}
	if len(ids) == 0 {
		return rpcerr.Invalidf("ids", "is empty; name 1-%d task ids, or set all", s.limits.MaxBatch)
	}
	if err := validateBatchSize("ids", len(ids), s.limits.MaxBatch); err != nil {
		return err
	}
	for i, id := range ids {
		if err := validateTaskID(fmt.Sprintf("ids[%d]", i), id); err != nil {
			return err
		}
	}
	return nil
}
