package storage

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// Schedules (recurring tasks). A schedule is a namespace resource: a rule
// (a cron expression in a time zone, or a fixed rate) whose slots each
// become an ordinary task of the namespace (a firing), with an id made of
// the schedule's id and the slot's time (FiringID). The rules live in
// package schedule; the stores keep the schedules and apply a step of one
// (UpdateSchedule with Fire) atomically: the firings are created
// create-only in the same script or transaction that moves the schedule's
// cursor, so a slot becomes a task once however many replicas decide it.

// MaxScheduleIDLen is the longest schedule id, and MaxFiringPrefixLen the
// longest firing id prefix: a firing id (prefix + schedule id + "." + a
// 16-character slot stamp + a shard suffix of at most 4) stays within
// MaxTaskIDLen.
const (
	MaxScheduleIDLen   = 64
	MaxFiringPrefixLen = 40
)

// MaxFiringsPerStep bounds the firings one UpdateSchedule creates (and so
// the missed slots one catch-up releases at once).
const MaxFiringsPerStep = 1000

// CatchUp is what a schedule does with the slots it missed: slots whose
// time passed without a decision (delayd was down, or the schedule
// paused).
type CatchUp uint8

// Catch-up policies.
const (
	// CatchUpNone skips missed slots: the schedule goes on with its next
	// slot. The default.
	CatchUpNone CatchUp = iota
	// CatchUpLatest fires the latest missed slot (within the catch-up
	// window, when one is set) and skips the others.
	CatchUpLatest
	// CatchUpAll fires every missed slot within the catch-up window, the
	// latest MaxFiringsPerStep of them at most, oldest first.
	CatchUpAll
)

// String names the policy as the API does ("none", "latest", "all").
func (c CatchUp) String() string {
	switch c {
	case CatchUpLatest:
		return "latest"
	case CatchUpAll:
		return "all"
	default:
		return "none"
	}
}

// Overlap is what a schedule does when a slot comes while the previous
// firing's task is still scheduled or delivered (not acked, not dead).
type Overlap uint8

// Overlap policies.
const (
	// OverlapAllow fires every slot regardless. The default.
	OverlapAllow Overlap = iota
	// OverlapSkip skips the slot while the previous firing's task is still
	// scheduled or in flight.
	OverlapSkip
)

// String names the policy as the API does ("allow", "skip").
func (o Overlap) String() string {
	if o == OverlapSkip {
		return "skip"
	}
	return "allow"
}

// TaskTemplate is what each firing of a schedule carries.
type TaskTemplate struct {
	// Kind of every firing's task; may be empty.
	Kind string
	// Payload of every firing's task; may be empty.
	Payload []byte
	// IDPrefix, if set, starts every firing's id (see FiringID); at most
	// MaxFiringPrefixLen characters of [A-Za-z0-9._-].
	IDPrefix string
}

// Schedule is one schedule: its definition (set by its owners) and its
// state (moved by the schedule loop).
type Schedule struct {
	Namespace string
	// ID names the schedule in its namespace: 1-64 characters of
	// [A-Za-z0-9._-].
	ID string
	// Description is free text for people, at most 256 characters.
	Description string

	// Cron is a 5-field cron expression or a shorthand (@hourly, @daily,
	// @weekly, @monthly, @yearly), evaluated in TimeZone. Exactly one of
	// Cron and Every is set.
	Cron string
	// Every is a fixed rate, whole seconds: slots are Start (or the Unix
	// epoch) plus whole multiples of it, in absolute time.
	Every time.Duration
	// TimeZone is an IANA zone name; "" means UTC.
	TimeZone string
	// Start, if set, is the earliest slot; End, if set, the latest.
	Start, End time.Time
	// MaxFirings, if > 0, ends the schedule after that many firings.
	MaxFirings int64
	// CatchUp and CatchUpWindow decide the missed slots (see CatchUp);
	// the window, if > 0, is how far back a missed slot may be.
	CatchUp       CatchUp
	CatchUpWindow time.Duration
	// Overlap decides a slot while the previous firing is still pending.
	Overlap Overlap
	// Jitter, if > 0, delays each firing's due time by an offset in
	// [0, Jitter) derived from the schedule and the slot, so every replica
	// and every retry agrees on it.
	Jitter time.Duration
	// Template is what each firing carries.
	Template TaskTemplate
	// Paused stops the firings until it is cleared.
	Paused bool

	// Cursor: every slot at or before it has been decided (fired or
	// skipped). Zero: none yet (the schedule starts at its creation).
	Cursor time.Time
	// Fired counts the firings created; Skipped the slots skipped (missed,
	// overlapping, or removed by a pause or an update before they fell due).
	Fired, Skipped int64
	// LastSlot is the slot of the latest firing and LastTaskID its task's
	// id; zero and "" before the first.
	LastSlot   time.Time
	LastTaskID string
	// NextSlot is the next slot to decide; zero when the schedule has
	// ended (Done).
	NextSlot time.Time
	// Done is set once no slot is left (End passed, MaxFirings reached).
	Done bool
	// Advance is when the schedule loop next looks at the schedule; zero
	// while it is paused or done (the stores index it by this time).
	Advance time.Time

	// Version is bumped by every write; UpdateSchedule and DeleteSchedule
	// compare it. CreateTime and UpdateTime are set by the store.
	Version    int64
	CreateTime time.Time
	UpdateTime time.Time
}

// Key names the schedule as ns/id (logs, maps).
func (s Schedule) Key() string { return s.Namespace + "/" + s.ID }

// Schedules keeps the schedules of every namespace. redisstore (Redis-only
// mode), the durable store (MySQL, the authority) and storagefake
// implement it; storetest.RunSchedules is its conformance suite.
type Schedules interface {
	// CreateSchedule stores a new schedule with Version 1 and the store's
	// create and update times, and returns it as stored.
	// ErrAlreadyExists if the namespace has a schedule with that id.
	CreateSchedule(ctx context.Context, s Schedule) (Schedule, error)
	// GetSchedule returns one schedule. ErrNotFound if there is none.
	GetSchedule(ctx context.Context, ns, id string) (Schedule, error)
	// ListSchedules returns up to limit (1..1,000) schedules of ns in id
	// order, after the id `after` ("" = from the first), and whether more
	// follow.
	ListSchedules(ctx context.Context, ns, after string, limit int) ([]Schedule, bool, error)
	// UpdateSchedule replaces the stored schedule s names with s if its
	// version is still p.IfVersion, and in the same atomic step creates
	// the tasks p.Fire create-only (a task whose id exists already is left
	// as it is: UpsertResult.Refused). The stored schedule gets version
	// p.IfVersion+1 and the store's update time. ErrNotFound if there is
	// none; a stored version other than p.IfVersion changes nothing and is
	// an error wrapping ErrGenerationMismatch. ErrNamespaceEnded if the
	// namespace was deleted (nothing written).
	UpdateSchedule(ctx context.Context, s Schedule, p UpdateScheduleParams) (UpdateScheduleResult, error)
	// DeleteSchedule deletes a schedule (never its firings' tasks), if its
	// version is ifVersion (0: any). ErrNotFound if there is none; another
	// version: an error wrapping ErrGenerationMismatch.
	DeleteSchedule(ctx context.Context, ns, id string, ifVersion int64) error
	// CountSchedules counts the schedules of ns (the max_schedules quota).
	CountSchedules(ctx context.Context, ns string) (int64, error)
	// DueSchedules returns schedules of every namespace whose Advance is at
	// or before the store's clock (at most limit per namespace, earliest
	// first), the store's clock, and the earliest Advance after it (zero
	// when none), for the schedule loop.
	DueSchedules(ctx context.Context, limit int) (DueSchedules, error)
	// DropSchedules deletes every schedule of ns (a deleted namespace) and
	// says how many it deleted.
	DropSchedules(ctx context.Context, ns string) (int64, error)
}

// UpdateScheduleParams says when UpdateSchedule applies and what it
// creates with it.
type UpdateScheduleParams struct {
	// IfVersion is the version the stored schedule must have (required).
	IfVersion int64
	// Fire are the firings to create, create-only, at most
	// MaxFiringsPerStep; their ids must fall in the schedule's shard
	// (FiringID does that).
	Fire []UpsertSpec
}

// UpdateScheduleResult is what UpdateSchedule stored.
type UpdateScheduleResult struct {
	// Schedule as stored (its new Version, UpdateTime).
	Schedule Schedule
	// Fired answers Fire one by one, in order.
	Fired []UpsertResult
}

// DueSchedules is what DueSchedules found.
type DueSchedules struct {
	// Schedules are due for the loop (Advance at or before Now).
	Schedules []Schedule
	// Now is the store's clock when it looked.
	Now time.Time
	// Next is the earliest Advance after Now among the schedules it looked
	// at; zero when none.
	Next time.Time
}

// FiringStampLayout formats a slot in a firing's id: UTC, whole seconds.
const FiringStampLayout = "20060102T150405Z"

// FiringID is the id of the task a schedule fires for a slot:
// prefix + schedule id + "." + the slot in FiringStampLayout. In a
// namespace of several shards it takes a suffix "_n" (the smallest n >= 1
// that does it) when needed to land in the schedule's own shard
// (ShardOf(scheduleID, shards)), so the Redis index creates the task in
// the same script that moves the schedule. Deterministic: every replica
// computes the same id for the same slot.
func FiringID(prefix, scheduleID string, slot time.Time, shards int) string {
	id := prefix + scheduleID + "." + slot.UTC().Format(FiringStampLayout)
	if shards <= 1 {
		return id
	}
	home := ShardOf(scheduleID, shards)
	if ShardOf(id, shards) == home {
		return id
	}
	for n := 1; ; n++ {
		if c := fmt.Sprintf("%s_%d", id, n); ShardOf(c, shards) == home {
			return c
		}
	}
}

// ShardOf is the shard of an id (a task's or a schedule's) in a namespace
// of n shards: FNV-1a (32 bit) of its bytes, modulo n. It is part of the
// stored layout of the Redis index (redisstore.ShardOf is this function).
func ShardOf(id string, n int) int {
	if n <= 1 {
		return 0
	}
	h := uint32(2166136261)
	for i := 0; i < len(id); i++ {
		h ^= uint32(id[i])
		h *= 16777619
	}
	return int(h % uint32(n))
}

// ValidateScheduleID reports whether id is a valid schedule id: 1-64
// characters of [A-Za-z0-9._-]. The error says what is allowed.
func ValidateScheduleID(id string) error {
	if id == "" {
		return fmt.Errorf("is required: 1-%d characters of [A-Za-z0-9._-]", MaxScheduleIDLen)
	}
	if len(id) > MaxScheduleIDLen {
		return fmt.Errorf("is %d characters long; at most %d are allowed", len(id), MaxScheduleIDLen)
	}
	if err := ValidateTaskID(id); err != nil {
		return fmt.Errorf("has a character outside [A-Za-z0-9._-]; allowed: 1-%d of them", MaxScheduleIDLen)
	}
	return nil
}

// scheduleRecord is Schedule's stored form: times in Unix milliseconds,
// durations in milliseconds, zero fields omitted. Fields are only ever
// added, so an older binary reads a newer record. Namespace, id, version
// and the store's times are kept beside it by each store.
type scheduleRecord struct {
	Description   string `json:"description,omitempty"`
	Cron          string `json:"cron,omitempty"`
	EveryMS       int64  `json:"every_ms,omitempty"`
	TimeZone      string `json:"time_zone,omitempty"`
	StartMS       int64  `json:"start_ms,omitempty"`
	EndMS         int64  `json:"end_ms,omitempty"`
	MaxFirings    int64  `json:"max_firings,omitempty"`
	CatchUp       uint8  `json:"catch_up,omitempty"`
	CatchUpWindow int64  `json:"catch_up_window_ms,omitempty"`
	Overlap       uint8  `json:"overlap,omitempty"`
	JitterMS      int64  `json:"jitter_ms,omitempty"`
	Kind          string `json:"kind,omitempty"`
	Payload       []byte `json:"payload,omitempty"`
	IDPrefix      string `json:"id_prefix,omitempty"`
	Paused        bool   `json:"paused,omitempty"`
	CursorMS      int64  `json:"cursor_ms,omitempty"`
	Fired         int64  `json:"fired,omitempty"`
	Skipped       int64  `json:"skipped,omitempty"`
	LastSlotMS    int64  `json:"last_slot_ms,omitempty"`
	LastTaskID    string `json:"last_task_id,omitempty"`
	NextSlotMS    int64  `json:"next_slot_ms,omitempty"`
	Done          bool   `json:"done,omitempty"`
	AdvanceMS     int64  `json:"advance_ms,omitempty"`
}

// MarshalSchedule encodes s's definition and state (not its namespace,
// id, version or store times) as the JSON document the stores keep.
func MarshalSchedule(s Schedule) ([]byte, error) {
	return json.Marshal(scheduleRecord{
		Description: s.Description, Cron: s.Cron, EveryMS: s.Every.Milliseconds(), TimeZone: s.TimeZone,
		StartMS: UnixMS(s.Start), EndMS: UnixMS(s.End), MaxFirings: s.MaxFirings,
		CatchUp: uint8(s.CatchUp), CatchUpWindow: s.CatchUpWindow.Milliseconds(), Overlap: uint8(s.Overlap),
		JitterMS: s.Jitter.Milliseconds(), Kind: s.Template.Kind, Payload: s.Template.Payload, IDPrefix: s.Template.IDPrefix,
		Paused: s.Paused, CursorMS: UnixMS(s.Cursor), Fired: s.Fired, Skipped: s.Skipped,
		LastSlotMS: UnixMS(s.LastSlot), LastTaskID: s.LastTaskID, NextSlotMS: UnixMS(s.NextSlot), Done: s.Done,
		AdvanceMS: UnixMS(s.Advance),
	})
}

// UnmarshalSchedule decodes what MarshalSchedule produced into s's
// definition and state, keeping s's other fields.
func UnmarshalSchedule(b []byte, s *Schedule) error {
	var r scheduleRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return fmt.Errorf("decode schedule: %w", err)
	}
	s.Description, s.Cron, s.Every, s.TimeZone = r.Description, r.Cron, time.Duration(r.EveryMS)*time.Millisecond, r.TimeZone
	s.Start, s.End, s.MaxFirings = TimeOfMS(r.StartMS), TimeOfMS(r.EndMS), r.MaxFirings
	s.CatchUp, s.CatchUpWindow, s.Overlap = CatchUp(r.CatchUp), time.Duration(r.CatchUpWindow)*time.Millisecond, Overlap(r.Overlap)
	s.Jitter = time.Duration(r.JitterMS) * time.Millisecond
	s.Template = TaskTemplate{Kind: r.Kind, Payload: r.Payload, IDPrefix: r.IDPrefix}
	s.Paused, s.Cursor, s.Fired, s.Skipped = r.Paused, TimeOfMS(r.CursorMS), r.Fired, r.Skipped
	s.LastSlot, s.LastTaskID, s.NextSlot, s.Done = TimeOfMS(r.LastSlotMS), r.LastTaskID, TimeOfMS(r.NextSlotMS), r.Done
	s.Advance = TimeOfMS(r.AdvanceMS)
	return nil
}

// UnixMS is t in Unix milliseconds, 0 for the zero time (the stores' form
// of a schedule's times).
func UnixMS(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// TimeOfMS is the UTC time of Unix milliseconds ms; the zero time for 0.
func TimeOfMS(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}
