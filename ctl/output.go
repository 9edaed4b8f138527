package ctl

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/internal/duration"
)

// printJSON writes v as indented JSON.
func (g *globals) printJSON(v any) error {
	enc := json.NewEncoder(g.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// table writes rows under a header, columns aligned.
func (g *globals) table(header []string, rows [][]string) error {
	tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

// fields writes name/value lines, aligned.
func (g *globals) fields(kv [][2]string) error {
	tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
	for _, f := range kv {
		fmt.Fprintf(tw, "%s:\t%s\n", f[0], f[1])
	}
	return tw.Flush()
}

// emit prints v as JSON, or calls tbl for the table form.
func (g *globals) emit(v any, tbl func() error) error {
	if g.output == "json" {
		return g.printJSON(v)
	}
	return tbl()
}

// ts formats a time for tables: RFC 3339 in UTC with milliseconds (fixed
// width, so columns line up); "-" when unset.
func ts(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z07:00")
}

// policyView is a policy for JSON: durations as delayctl's flags take
// them (duration.Format: 30s, 10m0s, 366d).
type policyView struct {
	AckTimeout        string  `json:"ack_timeout"`
	MaxAttempts       int32   `json:"max_attempts"`
	BackoffInitial    string  `json:"backoff_initial"`
	BackoffMax        string  `json:"backoff_max"`
	BackoffMultiplier float64 `json:"backoff_multiplier"`
	MaxPayloadBytes   int32   `json:"max_payload_bytes"`
	MaxPendingTasks   int64   `json:"max_pending_tasks"`
	RateLimit         float64 `json:"rate_limit"`
	RateBurst         int32   `json:"rate_burst"`
	MaxSubscribers    int32   `json:"max_subscribers"`
	MaxDelay          string  `json:"max_delay"`
	Paused            bool    `json:"paused"`
	MaxDispatchRate   float64 `json:"max_dispatch_rate"`
	PushURL           string  `json:"push_url,omitempty"`
	PushSecretSet     bool    `json:"push_secret_set,omitempty"`
	Shards            int32   `json:"shards"`
	HistoryRetention  int64   `json:"history_retention_bytes,omitempty"`
	MaxSchedules      int32   `json:"max_schedules"`
}

// namespaceView is a namespace for JSON.
type namespaceView struct {
	Name       string     `json:"name"`
	Policy     policyView `json:"policy"`
	CreateTime *time.Time `json:"create_time,omitempty"`
	UpdateTime *time.Time `json:"update_time,omitempty"`
	Stats      *statsView `json:"stats,omitempty"`
}

func viewNamespace(n client.Namespace) namespaceView {
	p := n.Policy
	return namespaceView{
		Name: n.Name,
		Policy: policyView{
			AckTimeout: duration.Format(p.AckTimeout), MaxAttempts: p.MaxAttempts,
			BackoffInitial: duration.Format(p.BackoffInitial), BackoffMax: duration.Format(p.BackoffMax), BackoffMultiplier: p.BackoffMultiplier,
			MaxPayloadBytes: p.MaxPayloadBytes, MaxPendingTasks: p.MaxPendingTasks, RateLimit: p.RateLimit,
			RateBurst: p.RateBurst, MaxSubscribers: p.MaxSubscribers, MaxDelay: duration.Format(p.MaxDelay),
			Paused: p.Paused, MaxDispatchRate: p.MaxDispatchRate,
			PushURL: p.PushURL, PushSecretSet: p.PushSecretSet,
			Shards: p.Shards, HistoryRetention: p.HistoryRetentionBytes, MaxSchedules: p.MaxSchedules,
		},
		CreateTime: tsPtr(n.CreateTime),
		UpdateTime: tsPtr(n.UpdateTime),
	}
}

// statsView is a namespace's counts for JSON.
type statsView struct {
	Scheduled         int64            `json:"scheduled"`
	DueNow            int64            `json:"due_now"`
	Delivered         int64            `json:"delivered"`
	Dead              int64            `json:"dead"`
	OldestDueLateness string           `json:"oldest_due_lateness"`
	Paused            bool             `json:"paused"`
	MaxDispatchRate   float64          `json:"max_dispatch_rate"`
	Push              bool             `json:"push"`
	DueByKind         map[string]int64 `json:"due_by_kind,omitempty"`
	DueByKindPartial  bool             `json:"due_by_kind_partial,omitempty"`
	DuePerMinute      []int64          `json:"due_per_minute,omitempty"`
	DuePerHour        []int64          `json:"due_per_hour,omitempty"`
	ForecastTime      *time.Time       `json:"forecast_time,omitempty"`
}

func viewStats(s client.Stats) *statsView {
	return &statsView{Scheduled: s.Scheduled, DueNow: s.DueNow, Delivered: s.Delivered, Dead: s.Dead,
		OldestDueLateness: s.OldestDueLateness.String(), Paused: s.Paused, MaxDispatchRate: s.MaxDispatchRate,
		Push: s.Push, DueByKind: s.DueByKind, DueByKindPartial: s.DueByKindPartial,
		DuePerMinute: s.DuePerMinute, DuePerHour: s.DuePerHour, ForecastTime: tsPtr(s.ForecastTime)}
}

// tsPtr is a time for JSON: nil (omitted) when unset.
func tsPtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// short cuts s to n runes for a table cell, marking the cut.
func short(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// payloadText shows a payload: as text when it is printable UTF-8, else
// as base64 prefixed "base64:".
func payloadText(p []byte) string {
	if utf8.Valid(p) && !strings.ContainsFunc(string(p), func(r rune) bool { return r < ' ' && r != '\n' && r != '\t' }) {
		return string(p)
	}
	return "base64:" + base64.StdEncoding.EncodeToString(p)
}

// taskView is a task as delayctl prints it in JSON.
type taskView struct {
	Namespace     string     `json:"namespace"`
	ID            string     `json:"id"`
	Kind          string     `json:"kind,omitempty"`
	State         string     `json:"state"`
	Attempt       int32      `json:"attempt"`
	Generation    int64      `json:"generation"`
	DueTime       *time.Time `json:"due_time,omitempty"`
	Payload       string     `json:"payload,omitempty"`
	LastError     string     `json:"last_error,omitempty"`
	LeaseDeadline *time.Time `json:"lease_deadline,omitempty"`
	DeadTime      *time.Time `json:"dead_time,omitempty"`
	CreateTime    *time.Time `json:"create_time,omitempty"`
	UpdateTime    *time.Time `json:"update_time,omitempty"`
}

func viewTask(t client.Task) taskView {
	v := taskView{
		Namespace: t.Namespace, ID: t.ID, Kind: t.Kind, State: t.State.String(),
		Attempt: t.Attempt, Generation: t.Generation, DueTime: tsPtr(t.DueTime),
		LastError: t.LastError, LeaseDeadline: tsPtr(t.LeaseDeadline), DeadTime: tsPtr(t.DeadTime),
		CreateTime: tsPtr(t.CreateTime), UpdateTime: tsPtr(t.UpdateTime),
	}
	if len(t.Payload) > 0 {
		v.Payload = payloadText(t.Payload)
	}
	return v
}

// taskFields is one task in table form (name: value lines).
func taskFields(t client.Task) [][2]string {
	return [][2]string{
		{"namespace", t.Namespace},
		{"id", t.ID},
		{"kind", orDash(t.Kind)},
		{"state", t.State.String()},
		{"attempt", strconv.Itoa(int(t.Attempt))},
		{"generation", strconv.FormatInt(t.Generation, 10)},
		{"due", ts(t.DueTime)},
		{"lease deadline", ts(t.LeaseDeadline)},
		{"dead since", ts(t.DeadTime)},
		{"last error", orDash(t.LastError)},
		{"created", ts(t.CreateTime)},
		{"updated", ts(t.UpdateTime)},
		{"payload", orDash(short(payloadText(t.Payload), 200))},
	}
}

// taskHeader: WHEN is the due time, the lease deadline when delivered, the
// time of death when dead.
var taskHeader = []string{"ID", "KIND", "STATE", "ATTEMPT", "WHEN", "LAST ERROR"}

func taskRow(t client.Task) []string {
	due := ts(t.DueTime)
	switch t.State {
	case client.StateDelivered:
		due = ts(t.LeaseDeadline) // when the lease ends
	case client.StateDead:
		due = ts(t.DeadTime)
	}
	return []string{t.ID, orDash(t.Kind), t.State.String(), strconv.Itoa(int(t.Attempt)), due, orDash(short(t.LastError, 40))}
}

func (g *globals) emitTasks(tasks []client.Task) error {
	views := make([]taskView, len(tasks))
	rows := make([][]string, len(tasks))
	for i, t := range tasks {
		views[i] = viewTask(t)
		rows[i] = taskRow(t)
	}
	return g.emit(views, func() error { return g.table(taskHeader, rows) })
}

// write is fmt.Fprintf for commands that report one line.
func write(w io.Writer, format string, args ...any) error {
	_, err := fmt.Fprintf(w, format, args...)
	return err
}
