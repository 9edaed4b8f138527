package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/schedule"
	"github.com/delayd/delayd/server/rpcerr"
	"github.com/delayd/delayd/server/wire"
	"github.com/delayd/delayd/storage"
)

// Schedules is what ScheduleService asks of the scheduler: its
// operations, over storage's schedule type. *schedule.Scheduler
// implements it.
type Schedules interface {
	Create(ctx context.Context, sc storage.Schedule, paused bool) (storage.Schedule, error)
	Get(ctx context.Context, ns, id string) (storage.Schedule, error)
	List(ctx context.Context, ns, after string, limit int) ([]storage.Schedule, bool, error)
	Update(ctx context.Context, ns, id string, ifVersion int64, change func(*storage.Schedule)) (storage.Schedule, int64, error)
	Pause(ctx context.Context, ns, id string) (storage.Schedule, int64, error)
	Resume(ctx context.Context, ns, id string) (storage.Schedule, error)
	Delete(ctx context.Context, ns, id string, ifVersion int64) (int64, error)
	Preview(ctx context.Context, sc storage.Schedule, after time.Time, count int) ([]schedule.Firing, schedule.Rule, error)
	// Drop deletes every schedule of a deleted namespace.
	Drop(ctx context.Context, ns string) (int64, error)
	// Forecast counts the firings ns's schedules have not created yet, in
	// the buckets of storage.Forecast from now; partial: not all counted.
	Forecast(ctx context.Context, ns string, now time.Time) (f storage.Forecast, partial bool, err error)
}

var _ Schedules = (*schedule.Scheduler)(nil)

// scheduleTokenState marks ListSchedules' page tokens (encodePageToken's
// state byte), so a ListTasks token is refused there and the reverse.
const scheduleTokenState = storage.State(0xfe)

// Preview bounds.
const (
	defaultPreviewCount = 10
	maxPreviewCount     = 1000
)

// scheduleService implements delaydv1.ScheduleServiceServer over the
// scheduler: validation and conversion here, the rules and the writes in
// package schedule.
type scheduleService struct {
	delaydv1.UnimplementedScheduleServiceServer

	opts   Options
	logger *slog.Logger
}

func newScheduleService(opts Options) *scheduleService {
	return &scheduleService{opts: opts, logger: opts.Logger}
}

// status is the answer to a scheduler error about schedule id of ns;
// field prefixes a definition's *schedule.FieldError ("schedule.").
func (s *scheduleService) status(ctx context.Context, err error, ns, id, field string) error {
	var fe *schedule.FieldError
	var qe *schedule.QuotaError
	var ve *schedule.VersionError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &fe):
		return rpcerr.ToStatus(ctx, s.logger, rpcerr.Invalidf(field+fe.Field, "%s", fe.Msg))
	case errors.As(err, &qe):
		return status.Error(codes.ResourceExhausted, qe.Error())
	case errors.As(err, &ve):
		return status.Error(codes.FailedPrecondition, ve.Error())
	case errors.Is(err, storage.ErrNotFound):
		return status.Errorf(codes.NotFound, "schedule %q not found in namespace %q", id, ns)
	case errors.Is(err, storage.ErrAlreadyExists):
		return status.Errorf(codes.AlreadyExists, "schedule %q exists in namespace %q", id, ns)
	}
	return rpcerr.ToStatus(ctx, s.logger, err)
}

// names validates a request's namespace and schedule id and checks the
// namespace exists (create: auto-create it when that is on).
func (s *scheduleService) names(ctx context.Context, nsField, ns, idField, id string, create bool) error {
	if err := validateNamespace(nsField, ns); err != nil {
		return rpcerr.ToStatus(ctx, s.logger, err)
	}
	if idField != "" {
		if err := storage.ValidateScheduleID(id); err != nil {
			return rpcerr.ToStatus(ctx, s.logger, rpcerr.InvalidWrap(idField, err))
		}
	}
	lookup := lookupPolicy
	if create {
		lookup = policyOrCreate
	}
	_, err := lookup(ctx, s.opts.Tenancy, s.logger, ns)
	return err
}

// CreateSchedule implements delaydv1.ScheduleServiceServer.
func (s *scheduleService) CreateSchedule(ctx context.Context, req *delaydv1.CreateScheduleRequest) (*delaydv1.CreateScheduleResponse, error) {
	in := req.GetSchedule()
	if in == nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, rpcerr.Invalidf("schedule", "is required"))
	}
	if err := s.names(ctx, "schedule.namespace", in.GetNamespace(), "schedule.id", in.GetId(), true); err != nil {
		return nil, err
	}
	sc, err := scheduleFromProto("schedule.", in)
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	out, err := s.opts.Schedules.Create(ctx, sc, req.GetPaused())
	if err != nil {
		return nil, s.status(ctx, err, sc.Namespace, sc.ID, "schedule.")
	}
	return &delaydv1.CreateScheduleResponse{Schedule: scheduleToProto(out)}, nil
}

// GetSchedule implements delaydv1.ScheduleServiceServer.
func (s *scheduleService) GetSchedule(ctx context.Context, req *delaydv1.GetScheduleRequest) (*delaydv1.GetScheduleResponse, error) {
	if err := s.names(ctx, "namespace", req.GetNamespace(), "id", req.GetId(), false); err != nil {
		return nil, err
	}
	out, err := s.opts.Schedules.Get(ctx, req.GetNamespace(), req.GetId())
	if err != nil {
		return nil, s.status(ctx, err, req.GetNamespace(), req.GetId(), "")
	}
	return &delaydv1.GetScheduleResponse{Schedule: scheduleToProto(out)}, nil
}

// ListSchedules implements delaydv1.ScheduleServiceServer.
func (s *scheduleService) ListSchedules(ctx context.Context, req *delaydv1.ListSchedulesRequest) (*delaydv1.ListSchedulesResponse, error) {
	ns := req.GetNamespace()
	if err := s.names(ctx, "namespace", ns, "", "", false); err != nil {
		return nil, err
	}
	size, err := pageSize(req.GetPageSize())
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	after, err := decodePageToken(req.GetPageToken(), ns, scheduleTokenState)
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	page, more, err := s.opts.Schedules.List(ctx, ns, after, size)
	if err != nil {
		return nil, s.status(ctx, err, ns, "", "")
	}
	resp := &delaydv1.ListSchedulesResponse{Schedules: make([]*delaydv1.Schedule, len(page))}
	for i, sc := range page {
		resp.Schedules[i] = scheduleToProto(sc)
	}
	if more && len(page) > 0 {
		resp.NextPageToken = encodePageToken(ns, scheduleTokenState, page[len(page)-1].ID)
	}
	return resp, nil
}

// UpdateSchedule implements delaydv1.ScheduleServiceServer.
func (s *scheduleService) UpdateSchedule(ctx context.Context, req *delaydv1.UpdateScheduleRequest) (*delaydv1.UpdateScheduleResponse, error) {
	in := req.GetSchedule()
	if in == nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, rpcerr.Invalidf("schedule", "is required"))
	}
	ns, id := in.GetNamespace(), in.GetId()
	if err := s.names(ctx, "schedule.namespace", ns, "schedule.id", id, false); err != nil {
		return nil, err
	}
	change, err := scheduleChange(in, req.GetUpdateMask().GetPaths())
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	if req.GetIfVersion() < 0 {
		return nil, rpcerr.ToStatus(ctx, s.logger, rpcerr.Invalidf("if_version", "is %d; allowed: 0 (any) or a version", req.GetIfVersion()))
	}
	out, removed, err := s.opts.Schedules.Update(ctx, ns, id, req.GetIfVersion(), change)
	if err != nil {
		return nil, s.status(ctx, err, ns, id, "schedule.")
	}
	return &delaydv1.UpdateScheduleResponse{Schedule: scheduleToProto(out), RemovedFirings: removed}, nil
}

// PauseSchedule implements delaydv1.ScheduleServiceServer.
func (s *scheduleService) PauseSchedule(ctx context.Context, req *delaydv1.PauseScheduleRequest) (*delaydv1.PauseScheduleResponse, error) {
	if err := s.names(ctx, "namespace", req.GetNamespace(), "id", req.GetId(), false); err != nil {
		return nil, err
	}
	out, removed, err := s.opts.Schedules.Pause(ctx, req.GetNamespace(), req.GetId())
	if err != nil {
		return nil, s.status(ctx, err, req.GetNamespace(), req.GetId(), "")
	}
	return &delaydv1.PauseScheduleResponse{Schedule: scheduleToProto(out), RemovedFirings: removed}, nil
}

// ResumeSchedule implements delaydv1.ScheduleServiceServer.
func (s *scheduleService) ResumeSchedule(ctx context.Context, req *delaydv1.ResumeScheduleRequest) (*delaydv1.ResumeScheduleResponse, error) {
	if err := s.names(ctx, "namespace", req.GetNamespace(), "id", req.GetId(), false); err != nil {
		return nil, err
	}
	out, err := s.opts.Schedules.Resume(ctx, req.GetNamespace(), req.GetId())
	if err != nil {
		return nil, s.status(ctx, err, req.GetNamespace(), req.GetId(), "")
	}
	return &delaydv1.ResumeScheduleResponse{Schedule: scheduleToProto(out)}, nil
}

// DeleteSchedule implements delaydv1.ScheduleServiceServer.
func (s *scheduleService) DeleteSchedule(ctx context.Context, req *delaydv1.DeleteScheduleRequest) (*delaydv1.DeleteScheduleResponse, error) {
	if err := s.names(ctx, "namespace", req.GetNamespace(), "id", req.GetId(), false); err != nil {
		return nil, err
	}
	if req.GetIfVersion() < 0 {
		return nil, rpcerr.ToStatus(ctx, s.logger, rpcerr.Invalidf("if_version", "is %d; allowed: 0 (any) or a version", req.GetIfVersion()))
	}
	removed, err := s.opts.Schedules.Delete(ctx, req.GetNamespace(), req.GetId(), req.GetIfVersion())
	if err != nil {
		return nil, s.status(ctx, err, req.GetNamespace(), req.GetId(), "")
	}
	return &delaydv1.DeleteScheduleResponse{RemovedFirings: removed}, nil
}

// PreviewSchedule implements delaydv1.ScheduleServiceServer.
func (s *scheduleService) PreviewSchedule(ctx context.Context, req *delaydv1.PreviewScheduleRequest) (*delaydv1.PreviewScheduleResponse, error) {
	ns := req.GetNamespace()
	if err := s.names(ctx, "namespace", ns, "", "", false); err != nil {
		return nil, err
	}
	count := int(req.GetCount())
	switch {
	case count == 0:
		count = defaultPreviewCount
	case count < 0 || count > maxPreviewCount:
		return nil, rpcerr.ToStatus(ctx, s.logger, rpcerr.Invalidf("count", "is %d; allowed: 1-%d, or 0 for %d", count, maxPreviewCount, defaultPreviewCount))
	}
	var sc storage.Schedule
	var err error
	field := "schedule."
	switch id, def := req.GetId(), req.GetSchedule(); {
	case id != "" && def != nil:
		return nil, rpcerr.ToStatus(ctx, s.logger, rpcerr.Invalidf("schedule", "is set together with id; give one: a stored schedule's id, or a definition to try"))
	case id != "":
		if err := storage.ValidateScheduleID(id); err != nil {
			return nil, rpcerr.ToStatus(ctx, s.logger, rpcerr.InvalidWrap("id", err))
		}
		if sc, err = s.opts.Schedules.Get(ctx, ns, id); err != nil {
			return nil, s.status(ctx, err, ns, id, "")
		}
		field = ""
	case def != nil:
		def.Namespace = ns
		if def.GetId() == "" {
			def.Id = "preview"
		}
		if sc, err = scheduleFromProto("schedule.", def); err != nil {
			return nil, rpcerr.ToStatus(ctx, s.logger, err)
		}
		if _, err := schedule.Validate(sc, time.Now()); err != nil {
			return nil, s.status(ctx, err, ns, sc.ID, "schedule.")
		}
	default:
		return nil, rpcerr.ToStatus(ctx, s.logger, rpcerr.Invalidf("id", "and schedule are both empty; give a stored schedule's id, or a definition to try"))
	}
	var after time.Time
	if req.GetAfter() != nil {
		if err := req.GetAfter().CheckValid(); err != nil {
			return nil, rpcerr.ToStatus(ctx, s.logger, rpcerr.Invalidf("after", "is not a valid timestamp"))
		}
		after = req.GetAfter().AsTime()
	}
	firings, rule, err := s.opts.Schedules.Preview(ctx, sc, after, count)
	if err != nil {
		return nil, s.status(ctx, err, ns, sc.ID, field)
	}
	loc := rule.Location()
	resp := &delaydv1.PreviewScheduleResponse{TimeZone: loc.String(), TzDataVersion: schedule.TZDataVersion(),
		Firings: make([]*delaydv1.ScheduleFiring, len(firings))}
	for i, f := range firings {
		local := f.Slot.In(loc)
		resp.Firings[i] = &delaydv1.ScheduleFiring{SlotTime: wire.Time(f.Slot), DueTime: wire.Time(f.Due), TaskId: f.ID,
			LocalTime: fmt.Sprintf("%s %s", local.Format(time.RFC3339), local.Format("MST"))}
	}
	return resp, nil
}
