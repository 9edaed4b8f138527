package client

import (
	"context"
	"fmt"
	"iter"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
)

// Schedules is the typed client of ScheduleService: recurring tasks of a
// namespace, each slot of which delayd turns into an ordinary task (a
// firing) that subscribers receive like any other. Get one with
// [Client.Schedules]; it shares the Client's connection, API key (produce
// or admin scope on the namespace) and timeout, and is safe for concurrent
// use. Reads, pause and resume are retried on Unavailable as the task
// calls are; create, update and delete are not (a retry of a create that
// went through answers AlreadyExists).
type Schedules struct {
	rpc delaydv1.ScheduleServiceClient
}

// Schedules returns the schedule client over c's connection.
func (c *Client) Schedules() *Schedules {
	return &Schedules{rpc: delaydv1.NewScheduleServiceClient(c.conn)}
}

// Catch-up policies of [Schedule.CatchUp]: what a schedule does with the
// slots it missed (delayd was down, or the schedule paused).
const (
	// CatchUpNone skips them (the default).
	CatchUpNone = "none"
	// CatchUpLatest fires the latest (within CatchUpWindow, if set).
	CatchUpLatest = "latest"
	// CatchUpAll fires every one within CatchUpWindow (required).
	CatchUpAll = "all"
)

// Overlap policies of [Schedule.Overlap]: what a schedule does with a slot
// while its previous firing is still scheduled or in flight.
const (
	// OverlapAllow fires it (the default).
	OverlapAllow = "allow"
	// OverlapSkip skips it.
	OverlapSkip = "skip"
)

// Schedule is a recurring task: a rule (Cron in TimeZone, or Every) and
// the task each slot fires. Fields below State are set by delayd.
type Schedule struct {
	// Namespace and ID name it; the ID is 1-64 characters of [A-Za-z0-9._-].
	Namespace string `json:"namespace"`
	ID        string `json:"id"`
	// Description is free text for people.
	Description string `json:"description,omitempty"`
	// Cron is a 5-field expression ("0 9 * * 1-5") or a shorthand
	// (@hourly, @daily, @weekly, @monthly, @yearly), in TimeZone. Exactly
	// one of Cron and Every.
	Cron string `json:"cron,omitempty"`
	// Every is a fixed rate in absolute time, whole seconds (1 s to 366
	// days), anchored at Start or the Unix epoch.
	Every time.Duration `json:"every,omitempty"`
	// TimeZone is an IANA name ("Europe/Berlin"); "" is UTC.
	TimeZone string `json:"time_zone,omitempty"`
	// Start and End bound the slots; zero: none.
	Start time.Time `json:"start_time,omitzero"`
	End   time.Time `json:"end_time,omitzero"`
	// MaxFirings ends the schedule after that many; 0 = no limit.
	MaxFirings int64 `json:"max_firings,omitempty"`
	// CatchUp is CatchUpNone (""), CatchUpLatest or CatchUpAll, and
	// CatchUpWindow how far back a missed slot may be.
	CatchUp       string        `json:"catch_up,omitempty"`
	CatchUpWindow time.Duration `json:"catch_up_window,omitempty"`
	// Overlap is OverlapAllow ("") or OverlapSkip.
	Overlap string `json:"overlap,omitempty"`
	// Jitter spreads each firing's due time over [slot, slot+Jitter).
	Jitter time.Duration `json:"jitter,omitempty"`
	// Kind, Payload and IDPrefix are what each firing's task carries (its
	// id is IDPrefix + ID + "." + the slot as 20060102T150405Z).
	Kind     string `json:"kind,omitempty"`
	Payload  []byte `json:"payload,omitempty"`
	IDPrefix string `json:"id_prefix,omitempty"`

	// State is "active", "paused" or "done".
	State string `json:"state,omitempty"`
	// Fired counts firings created, Skipped slots skipped.
	Fired   int64 `json:"fired"`
	Skipped int64 `json:"skipped"`
	// LastSlot and LastTaskID are the latest firing's slot and task id.
	LastSlot   time.Time `json:"last_slot_time,omitzero"`
	LastTaskID string    `json:"last_task_id,omitempty"`
	// NextSlot is the next slot to decide; zero when done.
	NextSlot time.Time `json:"next_slot_time,omitzero"`
	// Version is compared by UpdateSchedule's and DeleteSchedule's
	// ifVersion.
	Version    int64     `json:"version,omitempty"`
	CreateTime time.Time `json:"create_time,omitzero"`
	UpdateTime time.Time `json:"update_time,omitzero"`
}

// Firing is one firing a preview lists.
type Firing struct {
	// Slot is the slot's instant; Local the same in the schedule's zone
	// (RFC 3339 with offset, and the zone's abbreviation).
	Slot  time.Time `json:"slot_time"`
	Local string    `json:"local_time"`
	// TaskID is the firing's task id; Due its due time (slot + jitter).
	TaskID string    `json:"task_id"`
	Due    time.Time `json:"due_time"`
}

// Preview is the next firings of a schedule.
type Preview struct {
	Firings []Firing `json:"firings"`
	// TimeZone the local times are in, and the tz database release that
	// resolved it.
	TimeZone      string `json:"time_zone"`
	TZDataVersion string `json:"tz_data_version"`
}

// ScheduleFields are the names [Schedules.Update] accepts in its fields
// list.
var ScheduleFields = []string{"description", "cron", "every", "time_zone", "start_time", "end_time", "max_firings",
	"catch_up", "catch_up_window", "overlap", "jitter", "task", "task.kind", "task.payload", "task.id_prefix"}

func (s Schedule) proto() *delaydv1.Schedule {
	p := &delaydv1.Schedule{Namespace: s.Namespace, Id: s.ID, Description: s.Description, TimeZone: s.TimeZone,
		MaxFirings: s.MaxFirings, Task: &delaydv1.ScheduleTaskTemplate{Kind: s.Kind, Payload: s.Payload, IdPrefix: s.IDPrefix}}
	switch {
	case s.Cron != "":
		p.Rule = &delaydv1.Schedule_Cron{Cron: s.Cron}
	case s.Every != 0:
		p.Rule = &delaydv1.Schedule_Every{Every: durationpb.New(s.Every)}
	}
	if !s.Start.IsZero() {
		p.StartTime = timestamppb.New(s.Start)
	}
	if !s.End.IsZero() {
		p.EndTime = timestamppb.New(s.End)
	}
	switch s.CatchUp {
	case CatchUpLatest:
		p.CatchUp = delaydv1.CatchUpPolicy_CATCH_UP_POLICY_LATEST
	case CatchUpAll:
		p.CatchUp = delaydv1.CatchUpPolicy_CATCH_UP_POLICY_ALL
	case CatchUpNone:
		p.CatchUp = delaydv1.CatchUpPolicy_CATCH_UP_POLICY_NONE
	case "":
	default:
		p.CatchUp = delaydv1.CatchUpPolicy(-1) // the server names the field and what is allowed
	}
	if s.CatchUpWindow != 0 {
		p.CatchUpWindow = durationpb.New(s.CatchUpWindow)
	}
	switch s.Overlap {
	case OverlapSkip:
		p.Overlap = delaydv1.OverlapPolicy_OVERLAP_POLICY_SKIP
	case OverlapAllow:
		p.Overlap = delaydv1.OverlapPolicy_OVERLAP_POLICY_ALLOW
	case "":
	default:
		p.Overlap = delaydv1.OverlapPolicy(-1)
	}
	if s.Jitter != 0 {
		p.Jitter = durationpb.New(s.Jitter)
	}
	return p
}

func scheduleFromProto(p *delaydv1.Schedule) Schedule {
	s := Schedule{Namespace: p.GetNamespace(), ID: p.GetId(), Description: p.GetDescription(), Cron: p.GetCron(),
		Every: p.GetEvery().AsDuration(), TimeZone: p.GetTimeZone(), MaxFirings: p.GetMaxFirings(),
		CatchUpWindow: p.GetCatchUpWindow().AsDuration(), Jitter: p.GetJitter().AsDuration(),
		Kind: p.GetTask().GetKind(), Payload: p.GetTask().GetPayload(), IDPrefix: p.GetTask().GetIdPrefix(),
		Fired: p.GetFired(), Skipped: p.GetSkipped(), LastTaskID: p.GetLastTaskId(), Version: p.GetVersion(),
		Start: timeFromProto(p.GetStartTime()), End: timeFromProto(p.GetEndTime()), LastSlot: timeFromProto(p.GetLastSlotTime()),
		NextSlot: timeFromProto(p.GetNextSlotTime()), CreateTime: timeFromProto(p.GetCreateTime()), UpdateTime: timeFromProto(p.GetUpdateTime()),
		CatchUp: strings.ToLower(strings.TrimPrefix(p.GetCatchUp().String(), "CATCH_UP_POLICY_")),
		Overlap: strings.ToLower(strings.TrimPrefix(p.GetOverlap().String(), "OVERLAP_POLICY_")),
		State:   strings.ToLower(strings.TrimPrefix(p.GetState().String(), "SCHEDULE_STATE_")),
	}
	return s
}

// Create creates schedule s (paused: it fires nothing until resumed) and
// returns it as stored, its first firings within the lookahead created.
func (c *Schedules) Create(ctx context.Context, s Schedule, paused bool) (Schedule, error) {
	resp, err := c.rpc.CreateSchedule(ctx, &delaydv1.CreateScheduleRequest{Schedule: s.proto(), Paused: paused})
	if err != nil {
		return Schedule{}, fmt.Errorf("delayd create schedule %s/%s: %w", s.Namespace, s.ID, err)
	}
	return scheduleFromProto(resp.GetSchedule()), nil
}

// Get returns a schedule. NotFound if there is none.
func (c *Schedules) Get(ctx context.Context, ns, id string) (Schedule, error) {
	resp, err := c.rpc.GetSchedule(ctx, &delaydv1.GetScheduleRequest{Namespace: ns, Id: id})
	if err != nil {
		return Schedule{}, fmt.Errorf("delayd get schedule %s/%s: %w", ns, id, err)
	}
	return scheduleFromProto(resp.GetSchedule()), nil
}

// List iterates over ns's schedules in id order, one page call at a time.
// An error ends the iteration after it is yielded.
func (c *Schedules) List(ctx context.Context, ns string) iter.Seq2[Schedule, error] {
	return func(yield func(Schedule, error) bool) {
		token := ""
		for {
			resp, err := c.rpc.ListSchedules(ctx, &delaydv1.ListSchedulesRequest{Namespace: ns, PageToken: token})
			if err != nil {
				yield(Schedule{}, fmt.Errorf("delayd list schedules %s: %w", ns, err))
				return
			}
			for _, s := range resp.GetSchedules() {
				if !yield(scheduleFromProto(s), nil) {
					return
				}
			}
			if token = resp.GetNextPageToken(); token == "" {
				return
			}
		}
	}
}

// Update sets the fields named in fields (from [ScheduleFields]) of the
// schedule s names to their values in s, if its version is ifVersion (0:
// any; FailedPrecondition otherwise). A change beyond the description
// removes the firings created but not due yet and decides their slots
// again. It returns the schedule as stored and how many firings it
// removed.
func (c *Schedules) Update(ctx context.Context, s Schedule, fields []string, ifVersion int64) (Schedule, int64, error) {
	resp, err := c.rpc.UpdateSchedule(ctx, &delaydv1.UpdateScheduleRequest{Schedule: s.proto(),
		UpdateMask: &fieldmaskpb.FieldMask{Paths: fields}, IfVersion: ifVersion})
	if err != nil {
		return Schedule{}, 0, fmt.Errorf("delayd update schedule %s/%s: %w", s.Namespace, s.ID, err)
	}
	return scheduleFromProto(resp.GetSchedule()), resp.GetRemovedFirings(), nil
}

// Pause stops a schedule's firings (removing those not due yet) and says
// how many it removed. Pausing a paused schedule changes nothing.
func (c *Schedules) Pause(ctx context.Context, ns, id string) (Schedule, int64, error) {
	resp, err := c.rpc.PauseSchedule(ctx, &delaydv1.PauseScheduleRequest{Namespace: ns, Id: id})
	if err != nil {
		return Schedule{}, 0, fmt.Errorf("delayd pause schedule %s/%s: %w", ns, id, err)
	}
	return scheduleFromProto(resp.GetSchedule()), resp.GetRemovedFirings(), nil
}

// Resume starts a paused schedule again; its catch-up policy decides the
// slots the pause missed.
func (c *Schedules) Resume(ctx context.Context, ns, id string) (Schedule, error) {
	resp, err := c.rpc.ResumeSchedule(ctx, &delaydv1.ResumeScheduleRequest{Namespace: ns, Id: id})
	if err != nil {
		return Schedule{}, fmt.Errorf("delayd resume schedule %s/%s: %w", ns, id, err)
	}
	return scheduleFromProto(resp.GetSchedule()), nil
}

// Delete deletes a schedule (at version ifVersion; 0: any) and the
// firings it created that are not due yet, and says how many those were.
func (c *Schedules) Delete(ctx context.Context, ns, id string, ifVersion int64) (int64, error) {
	resp, err := c.rpc.DeleteSchedule(ctx, &delaydv1.DeleteScheduleRequest{Namespace: ns, Id: id, IfVersion: ifVersion})
	if err != nil {
		return 0, fmt.Errorf("delayd delete schedule %s/%s: %w", ns, id, err)
	}
	return resp.GetRemovedFirings(), nil
}

// Preview lists the next count firings (0: 10) after `after` (zero: now)
// of the stored schedule ns/id, or, when def is not nil, of that
// definition (not stored; to try a rule before creating it).
func (c *Schedules) Preview(ctx context.Context, ns, id string, def *Schedule, after time.Time, count int) (Preview, error) {
	req := &delaydv1.PreviewScheduleRequest{Namespace: ns, Id: id, Count: int32(count)}
	if def != nil {
		req.Schedule = def.proto()
	}
	if !after.IsZero() {
		req.After = timestamppb.New(after)
	}
	resp, err := c.rpc.PreviewSchedule(ctx, req)
	if err != nil {
		return Preview{}, fmt.Errorf("delayd preview schedule %s/%s: %w", ns, id, err)
	}
	out := Preview{TimeZone: resp.GetTimeZone(), TZDataVersion: resp.GetTzDataVersion()}
	for _, f := range resp.GetFirings() {
		out.Firings = append(out.Firings, Firing{Slot: f.GetSlotTime().AsTime(), Local: f.GetLocalTime(), TaskID: f.GetTaskId(), Due: f.GetDueTime().AsTime()})
	}
	return out, nil
}
