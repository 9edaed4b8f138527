package server

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/server/rpcerr"
	"github.com/delayd/delayd/server/wire"
	"github.com/delayd/delayd/storage"
)

// Schedules between the wire and the domain. The edge checks what the wire
// form alone decides (a valid duration or timestamp, a known enumeration
// value, the kind's characters); package schedule checks the definition
// (schedule.Validate) and names the same fields.

// scheduleFromProto reads a schedule's definition; prefix names its
// message ("schedule.").
func scheduleFromProto(prefix string, p *delaydv1.Schedule) (storage.Schedule, error) {
	sc := storage.Schedule{Namespace: p.GetNamespace(), ID: p.GetId(), Description: p.GetDescription(),
		Cron: p.GetCron(), TimeZone: p.GetTimeZone(), MaxFirings: p.GetMaxFirings()}
	var err error
	if p.GetEvery() != nil {
		if sc.Every, err = durationField(prefix+"every", p.GetEvery(), time.Second, 0); err != nil {
			return storage.Schedule{}, err
		}
		if sc.Every == 0 {
			return storage.Schedule{}, rpcerr.Invalidf(prefix+"every", "is 0; allowed: 1s to 366 days")
		}
	}
	if sc.Start, err = timestampField(prefix+"start_time", p.GetStartTime()); err != nil {
		return storage.Schedule{}, err
	}
	if sc.End, err = timestampField(prefix+"end_time", p.GetEndTime()); err != nil {
		return storage.Schedule{}, err
	}
	if sc.CatchUp, err = catchUpFromProto(prefix+"catch_up", p.GetCatchUp()); err != nil {
		return storage.Schedule{}, err
	}
	if p.GetCatchUpWindow() != nil {
		if sc.CatchUpWindow, err = durationField(prefix+"catch_up_window", p.GetCatchUpWindow(), 0, 0); err != nil {
			return storage.Schedule{}, err
		}
	}
	if sc.Overlap, err = overlapFromProto(prefix+"overlap", p.GetOverlap()); err != nil {
		return storage.Schedule{}, err
	}
	if p.GetJitter() != nil {
		if sc.Jitter, err = durationField(prefix+"jitter", p.GetJitter(), 0, 0); err != nil {
			return storage.Schedule{}, err
		}
	}
	t := p.GetTask()
	if err := validateKind(prefix+"task.kind", t.GetKind()); err != nil {
		return storage.Schedule{}, err
	}
	sc.Template = storage.TaskTemplate{Kind: t.GetKind(), Payload: t.GetPayload(), IDPrefix: t.GetIdPrefix()}
	return sc, nil
}

// timestampField reads an optional timestamp (unset: zero), to the
// millisecond.
func timestampField(field string, ts *timestamppb.Timestamp) (time.Time, error) {
	if ts == nil {
		return time.Time{}, nil
	}
	if err := ts.CheckValid(); err != nil {
		return time.Time{}, rpcerr.Invalidf(field, "is not a valid timestamp")
	}
	t := ts.AsTime().Truncate(time.Millisecond)
	if t.Before(minDueTime) {
		return time.Time{}, rpcerr.Invalidf(field, "is %s; allowed: from 2000-01-01", t.Format(time.RFC3339))
	}
	return t, nil
}

func catchUpFromProto(field string, c delaydv1.CatchUpPolicy) (storage.CatchUp, error) {
	switch c {
	case delaydv1.CatchUpPolicy_CATCH_UP_POLICY_UNSPECIFIED, delaydv1.CatchUpPolicy_CATCH_UP_POLICY_NONE:
		return storage.CatchUpNone, nil
	case delaydv1.CatchUpPolicy_CATCH_UP_POLICY_LATEST:
		return storage.CatchUpLatest, nil
	case delaydv1.CatchUpPolicy_CATCH_UP_POLICY_ALL:
		return storage.CatchUpAll, nil
	}
	return 0, rpcerr.Invalidf(field, "is %d; allowed: CATCH_UP_POLICY_NONE, _LATEST, _ALL", c)
}

func catchUpToProto(c storage.CatchUp) delaydv1.CatchUpPolicy {
	switch c {
	case storage.CatchUpLatest:
		return delaydv1.CatchUpPolicy_CATCH_UP_POLICY_LATEST
	case storage.CatchUpAll:
		return delaydv1.CatchUpPolicy_CATCH_UP_POLICY_ALL
	default:
		return delaydv1.CatchUpPolicy_CATCH_UP_POLICY_NONE
	}
}

func overlapFromProto(field string, o delaydv1.OverlapPolicy) (storage.Overlap, error) {
	switch o {
	case delaydv1.OverlapPolicy_OVERLAP_POLICY_UNSPECIFIED, delaydv1.OverlapPolicy_OVERLAP_POLICY_ALLOW:
		return storage.OverlapAllow, nil
	case delaydv1.OverlapPolicy_OVERLAP_POLICY_SKIP:
		return storage.OverlapSkip, nil
	}
	return 0, rpcerr.Invalidf(field, "is %d; allowed: OVERLAP_POLICY_ALLOW, _SKIP", o)
}

func overlapToProto(o storage.Overlap) delaydv1.OverlapPolicy {
	if o == storage.OverlapSkip {
		return delaydv1.OverlapPolicy_OVERLAP_POLICY_SKIP
	}
	return delaydv1.OverlapPolicy_OVERLAP_POLICY_ALLOW
}

// durationOrUnset is d's wire form, unset when zero.
func durationOrUnset(d time.Duration) *durationpb.Duration {
	if d == 0 {
		return nil
	}
	return durationpb.New(d)
}

// scheduleToProto is a schedule's wire form, state included.
func scheduleToProto(sc storage.Schedule) *delaydv1.Schedule {
	p := &delaydv1.Schedule{
		Namespace: sc.Namespace, Id: sc.ID, Description: sc.Description, TimeZone: sc.TimeZone,
		StartTime: wire.Time(sc.Start), EndTime: wire.Time(sc.End), MaxFirings: sc.MaxFirings,
		CatchUp: catchUpToProto(sc.CatchUp), CatchUpWindow: durationOrUnset(sc.CatchUpWindow),
		Overlap: overlapToProto(sc.Overlap), Jitter: durationOrUnset(sc.Jitter),
		Task:  &delaydv1.ScheduleTaskTemplate{Kind: sc.Template.Kind, Payload: sc.Template.Payload, IdPrefix: sc.Template.IDPrefix},
		State: delaydv1.ScheduleState_SCHEDULE_STATE_ACTIVE, Fired: sc.Fired, Skipped: sc.Skipped,
		LastSlotTime: wire.Time(sc.LastSlot), LastTaskId: sc.LastTaskID, NextSlotTime: wire.Time(sc.NextSlot),
		Version: sc.Version, CreateTime: wire.Time(sc.CreateTime), UpdateTime: wire.Time(sc.UpdateTime),
	}
	if sc.Cron != "" {
		p.Rule = &delaydv1.Schedule_Cron{Cron: sc.Cron}
	} else if sc.Every != 0 {
		p.Rule = &delaydv1.Schedule_Every{Every: durationpb.New(sc.Every)}
	}
	switch {
	case sc.Done:
		p.State = delaydv1.ScheduleState_SCHEDULE_STATE_DONE
	case sc.Paused:
		p.State = delaydv1.ScheduleState_SCHEDULE_STATE_PAUSED
	}
	return p
}

// scheduleMaskPaths are the fields UpdateSchedule's mask may name.
var scheduleMaskPaths = map[string]func(dst *storage.Schedule, src storage.Schedule){
	"description":     func(d *storage.Schedule, s storage.Schedule) { d.Description = s.Description },
	"cron":            func(d *storage.Schedule, s storage.Schedule) { d.Cron, d.Every = s.Cron, 0 },
	"every":           func(d *storage.Schedule, s storage.Schedule) { d.Every, d.Cron = s.Every, "" },
	"time_zone":       func(d *storage.Schedule, s storage.Schedule) { d.TimeZone = s.TimeZone },
	"start_time":      func(d *storage.Schedule, s storage.Schedule) { d.Start = s.Start },
	"end_time":        func(d *storage.Schedule, s storage.Schedule) { d.End = s.End },
	"max_firings":     func(d *storage.Schedule, s storage.Schedule) { d.MaxFirings = s.MaxFirings },
	"catch_up":        func(d *storage.Schedule, s storage.Schedule) { d.CatchUp = s.CatchUp },
	"catch_up_window": func(d *storage.Schedule, s storage.Schedule) { d.CatchUpWindow = s.CatchUpWindow },
	"overlap":         func(d *storage.Schedule, s storage.Schedule) { d.Overlap = s.Overlap },
	"jitter":          func(d *storage.Schedule, s storage.Schedule) { d.Jitter = s.Jitter },
	"task":            func(d *storage.Schedule, s storage.Schedule) { d.Template = s.Template },
	"task.kind":       func(d *storage.Schedule, s storage.Schedule) { d.Template.Kind = s.Template.Kind },
	"task.payload":    func(d *storage.Schedule, s storage.Schedule) { d.Template.Payload = s.Template.Payload },
	"task.id_prefix":  func(d *storage.Schedule, s storage.Schedule) { d.Template.IDPrefix = s.Template.IDPrefix },
}

// scheduleChange turns UpdateSchedule's schedule and mask into the change
// the scheduler applies to the stored definition. Paths may be spelt in
// snake_case or lowerCamelCase (JSON), as UpdateNamespace's are.
func scheduleChange(in *delaydv1.Schedule, paths []string) (func(*storage.Schedule), error) {
	if len(paths) == 0 {
		return nil, rpcerr.Invalidf("update_mask", "is empty; name the fields to change, e.g. {\"paths\": [\"cron\", \"time_zone\"]}")
	}
	src, err := scheduleFromProto("schedule.", in)
	if err != nil {
		return nil, err
	}
	var sets []func(*storage.Schedule, storage.Schedule)
	for i, p := range paths {
		set, ok := scheduleMaskPaths[p]
		for name, f := range scheduleMaskPaths {
			if !ok && lowerCamel(name) == p {
				set, ok = f, true
			}
		}
		if !ok {
			return nil, rpcerr.Invalidf(fmt.Sprintf("update_mask.paths[%d]", i), "is %q; allowed: description, cron, every, time_zone, start_time, end_time, max_firings, catch_up, catch_up_window, overlap, jitter, task, task.kind, task.payload, task.id_prefix (each also in lowerCamelCase, as JSON writes it: catchUpWindow)", p)
		}
		sets = append(sets, set)
	}
	return func(dst *storage.Schedule) {
		for _, set := range sets {
			set(dst, src)
		}
	}, nil
}
