package ctl

import (
	"strconv"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/internal/duration"
)

// `delayctl schedule ...`: recurring tasks (ScheduleService).

func (g *globals) schedules() (*client.Schedules, error) {
	c, err := g.connect()
	if err != nil {
		return nil, err
	}
	return c.Schedules(), nil
}

func scheduleCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "schedule", Short: "Schedules (recurring tasks): create, get, list, update, pause, resume, delete, preview"}
	cmd.AddCommand(scheduleCreateCommand(g), scheduleGetCommand(g), scheduleListCommand(g), scheduleUpdateCommand(g),
		schedulePauseCommand(g, true), schedulePauseCommand(g, false), scheduleDeleteCommand(g), schedulePreviewCommand(g))
	return cmd
}

// scheduleFlags are the definition flags create, update and preview share.
type scheduleFlags struct {
	cron, tz, start, end, catchUp, overlap, kind, payload, idPrefix, description string
	every, catchUpWindow, jitter                                                 time.Duration
	maxFirings                                                                   int64
}

func (f *scheduleFlags) bind(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&f.cron, "cron", "", `5-field cron expression or shorthand ("0 9 * * 1-5", @daily), in --tz`)
	fs.Var(duration.Value{P: &f.every}, "every", "fixed rate in absolute time, whole seconds (15m, 1h, 1d)")
	fs.StringVar(&f.tz, "tz", "", `IANA time zone of the cron expression ("Europe/Berlin"); default UTC`)
	fs.StringVar(&f.start, "start", "", "earliest slot (RFC 3339); a rate's slots count from it")
	fs.StringVar(&f.end, "end", "", "latest slot (RFC 3339)")
	fs.Int64Var(&f.maxFirings, "max-firings", 0, "end after this many firings (0 = no limit)")
	fs.StringVar(&f.catchUp, "catch-up", "", "missed slots (delayd down, schedule paused): none (default), latest, all")
	fs.Var(duration.Value{P: &f.catchUpWindow}, "catch-up-window", "how far back a missed slot still fires (needed by --catch-up all)")
	fs.StringVar(&f.overlap, "overlap", "", "a slot while the previous firing is pending: allow (default), skip")
	fs.Var(duration.Value{P: &f.jitter}, "jitter", "spread each firing's due time over [slot, slot+jitter)")
	fs.StringVar(&f.kind, "kind", "", "kind of each firing's task")
	fs.StringVar(&f.payload, "payload", "", "payload of each firing's task: TEXT, @file or @- (stdin)")
	fs.StringVar(&f.idPrefix, "id-prefix", "", "prefix of each firing's task id")
	fs.StringVar(&f.description, "description", "", "free text")
}

// flagNames maps the definition flags to ScheduleFields, for update.
var flagNames = map[string][]string{
	"cron": {"cron"}, "every": {"every"}, "tz": {"time_zone"}, "start": {"start_time"}, "end": {"end_time"},
	"max-firings": {"max_firings"}, "catch-up": {"catch_up"}, "catch-up-window": {"catch_up_window"}, "overlap": {"overlap"},
	"jitter": {"jitter"}, "kind": {"task.kind"}, "payload": {"task.payload"}, "id-prefix": {"task.id_prefix"},
	"description": {"description"},
}

// schedule builds the definition the flags give.
func (f *scheduleFlags) schedule(g *globals, ns, id string) (client.Schedule, error) {
	s := client.Schedule{Namespace: ns, ID: id, Cron: f.cron, Every: f.every, TimeZone: f.tz, MaxFirings: f.maxFirings,
		CatchUp: f.catchUp, CatchUpWindow: f.catchUpWindow, Overlap: f.overlap, Jitter: f.jitter, Kind: f.kind,
		IDPrefix: f.idPrefix, Description: f.description}
	for _, t := range []struct {
		flag, v string
		dst     *time.Time
	}{{"--start", f.start, &s.Start}, {"--end", f.end, &s.End}} {
		if t.v == "" {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, t.v)
		if err != nil {
			return client.Schedule{}, usagef("%s %q: want an RFC 3339 time such as 2030-01-02T15:04:05Z", t.flag, t.v)
		}
		*t.dst = at
	}
	switch f.catchUp {
	case "", client.CatchUpNone, client.CatchUpLatest, client.CatchUpAll:
	default:
		return client.Schedule{}, usagef("--catch-up %q: allowed: none, latest, all", f.catchUp)
	}
	switch f.overlap {
	case "", client.OverlapAllow, client.OverlapSkip:
	default:
		return client.Schedule{}, usagef("--overlap %q: allowed: allow, skip", f.overlap)
	}
	body, err := g.readPayload(f.payload)
	if err != nil {
		return client.Schedule{}, err
	}
	s.Payload = body
	return s, nil
}

func scheduleCreateCommand(g *globals) *cobra.Command {
	var (
		f      scheduleFlags
		paused bool
	)
	cmd := &cobra.Command{
		Use:   "create NS ID (--cron EXPR [--tz ZONE] | --every DURATION) [--kind K] [--payload TEXT|@file|@-] [...]",
		Short: "Create a schedule: each slot becomes a task of NS (id ID.<slot>)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if (f.cron == "") == (f.every == 0) {
				return usagef("give the rule: --cron EXPR (with --tz ZONE) or --every DURATION, one of them")
			}
			s, err := f.schedule(g, args[0], args[1])
			if err != nil {
				return err
			}
			c, err := g.schedules()
			if err != nil {
				return err
			}
			out, err := c.Create(cmd.Context(), s, paused)
			if err != nil {
				return err
			}
			return g.emitSchedule(out)
		},
	}
	f.bind(cmd)
	cmd.Flags().BoolVar(&paused, "paused", false, "create it paused (it fires nothing until resumed)")
	return cmd
}

func scheduleGetCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use: "get NS ID", Short: "Show a schedule: its rule, state, next slot, firings so far", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.schedules()
			if err != nil {
				return err
			}
			s, err := c.Get(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			return g.emitSchedule(s)
		},
	}
}

func scheduleListCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use: "list NS", Short: "List a namespace's schedules in id order", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.schedules()
			if err != nil {
				return err
			}
			out := []client.Schedule{}
			for s, err := range c.List(cmd.Context(), args[0]) {
				if err != nil {
					return err
				}
				out = append(out, s)
			}
			views := make([]scheduleView, len(out))
			for i, s := range out {
				views[i] = viewSchedule(s)
			}
			return g.emit(views, func() error {
				rows := make([][]string, len(out))
				for i, s := range out {
					rows[i] = []string{s.ID, rule(s), orDash(s.TimeZone), s.State, ts(s.NextSlot),
						strconv.FormatInt(s.Fired, 10), strconv.FormatInt(s.Skipped, 10), orDash(s.LastTaskID)}
				}
				return g.table([]string{"ID", "RULE", "ZONE", "STATE", "NEXT SLOT", "FIRED", "SKIPPED", "LAST TASK"}, rows)
			})
		},
	}
}

func scheduleUpdateCommand(g *globals) *cobra.Command {
	var (
		f         scheduleFlags
		ifVersion int64
	)
	cmd := &cobra.Command{
		Use:   "update NS ID [--cron EXPR | --every D] [--tz Z] [--payload ...] [--if-version N] [...]",
		Short: "Change the fields given; firings not due yet are removed and decided again",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var fields []string
			cmd.Flags().Visit(func(fl *pflag.Flag) { fields = append(fields, flagNames[fl.Name]...) })
			if len(fields) == 0 {
				return usagef("give the fields to change, e.g. --cron '0 10 * * *' or --payload @body.json")
			}
			s, err := f.schedule(g, args[0], args[1])
			if err != nil {
				return err
			}
			c, err := g.schedules()
			if err != nil {
				return err
			}
			out, removed, err := c.Update(cmd.Context(), s, fields, ifVersion)
			if err != nil {
				return err
			}
			if g.output != "json" {
				if err := write(g.stdout, "removed %d firings not due yet\n", removed); err != nil {
					return err
				}
			}
			return g.emitSchedule(out)
		},
	}
	f.bind(cmd)
	cmd.Flags().Int64Var(&ifVersion, "if-version", 0, "only at this version (as get shows it)")
	return cmd
}

func schedulePauseCommand(g *globals, pause bool) *cobra.Command {
	verb, short := "resume", "Resume a paused schedule (its catch-up policy decides the slots missed)"
	if pause {
		verb, short = "pause", "Pause a schedule (its firings not due yet are removed)"
	}
	return &cobra.Command{
		Use: verb + " NS ID", Short: short, Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.schedules()
			if err != nil {
				return err
			}
			var s client.Schedule
			if pause {
				s, _, err = c.Pause(cmd.Context(), args[0], args[1])
			} else {
				s, err = c.Resume(cmd.Context(), args[0], args[1])
			}
			if err != nil {
				return err
			}
			return g.emitSchedule(s)
		},
	}
}

func scheduleDeleteCommand(g *globals) *cobra.Command {
	var ifVersion int64
	cmd := &cobra.Command{
		Use: "delete NS ID [--if-version N]", Short: "Delete a schedule and its firings not due yet", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.schedules()
			if err != nil {
				return err
			}
			removed, err := c.Delete(cmd.Context(), args[0], args[1], ifVersion)
			if err != nil {
				return err
			}
			return g.emit(map[string]int64{"removed_firings": removed}, func() error {
				return write(g.stdout, "deleted %s/%s and %d firings not due yet\n", args[0], args[1], removed)
			})
		},
	}
	cmd.Flags().Int64Var(&ifVersion, "if-version", 0, "only at this version (as get shows it)")
	return cmd
}

func schedulePreviewCommand(g *globals) *cobra.Command {
	var (
		f     scheduleFlags
		count int
		after string
	)
	cmd := &cobra.Command{
		Use:   "preview NS (ID | --cron EXPR [--tz Z] | --every D) [-n COUNT] [--after RFC3339]",
		Short: "List the next firings in UTC and in the schedule's zone (of a stored schedule, or a rule to try)",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ns, id := args[0], ""
			if len(args) == 2 {
				id = args[1]
			}
			var def *client.Schedule
			if f.cron != "" || f.every != 0 {
				if id != "" {
					return usagef("give a stored schedule's ID or a rule to try (--cron/--every), not both")
				}
				s, err := f.schedule(g, ns, "preview")
				if err != nil {
					return err
				}
				def = &s
			} else if id == "" {
				return usagef("give a stored schedule's ID, or a rule to try: --cron EXPR (--tz ZONE) or --every DURATION")
			}
			var at time.Time
			if after != "" {
				var err error
				if at, err = time.Parse(time.RFC3339Nano, after); err != nil {
					return usagef("--after %q: want an RFC 3339 time such as 2030-01-02T15:04:05Z", after)
				}
			}
			c, err := g.schedules()
			if err != nil {
				return err
			}
			p, err := c.Preview(cmd.Context(), ns, id, def, at, count)
			if err != nil {
				return err
			}
			return g.emit(p, func() error {
				rows := make([][]string, len(p.Firings))
				for i, f := range p.Firings {
					rows[i] = []string{ts(f.Slot), f.Local, f.TaskID, ts(f.Due)}
				}
				if err := g.table([]string{"SLOT (UTC)", "LOCAL (" + p.TimeZone + ")", "TASK ID", "DUE"}, rows); err != nil {
					return err
				}
				return write(g.stdout, "tz database %s\n", p.TZDataVersion)
			})
		},
	}
	f.bind(cmd)
	cmd.Flags().IntVarP(&count, "count", "n", 10, "how many firings (1-1000)")
	cmd.Flags().StringVar(&after, "after", "", "the firings after this time (default now)")
	return cmd
}

// rule is a schedule's rule as a table shows it.
func rule(s client.Schedule) string {
	if s.Cron != "" {
		return s.Cron
	}
	return "every " + duration.Format(s.Every)
}

// scheduleView is a schedule as delayctl prints it in JSON: durations as
// its flags take them, the payload as text (or base64: for binary).
type scheduleView struct {
	Namespace     string     `json:"namespace"`
	ID            string     `json:"id"`
	Description   string     `json:"description,omitempty"`
	Cron          string     `json:"cron,omitempty"`
	Every         string     `json:"every,omitempty"`
	TimeZone      string     `json:"time_zone,omitempty"`
	Start         *time.Time `json:"start_time,omitempty"`
	End           *time.Time `json:"end_time,omitempty"`
	MaxFirings    int64      `json:"max_firings,omitempty"`
	CatchUp       string     `json:"catch_up"`
	CatchUpWindow string     `json:"catch_up_window,omitempty"`
	Overlap       string     `json:"overlap"`
	Jitter        string     `json:"jitter,omitempty"`
	Kind          string     `json:"kind,omitempty"`
	Payload       string     `json:"payload,omitempty"`
	IDPrefix      string     `json:"id_prefix,omitempty"`
	State         string     `json:"state"`
	Fired         int64      `json:"fired"`
	Skipped       int64      `json:"skipped"`
	LastSlot      *time.Time `json:"last_slot_time,omitempty"`
	LastTaskID    string     `json:"last_task_id,omitempty"`
	NextSlot      *time.Time `json:"next_slot_time,omitempty"`
	Version       int64      `json:"version"`
	CreateTime    *time.Time `json:"create_time,omitempty"`
	UpdateTime    *time.Time `json:"update_time,omitempty"`
}

func viewSchedule(s client.Schedule) scheduleView {
	d := func(v time.Duration) string {
		if v == 0 {
			return ""
		}
		return duration.Format(v)
	}
	v := scheduleView{Namespace: s.Namespace, ID: s.ID, Description: s.Description, Cron: s.Cron, Every: d(s.Every),
		TimeZone: s.TimeZone, Start: tsPtr(s.Start), End: tsPtr(s.End), MaxFirings: s.MaxFirings, CatchUp: s.CatchUp,
		CatchUpWindow: d(s.CatchUpWindow), Overlap: s.Overlap, Jitter: d(s.Jitter), Kind: s.Kind, IDPrefix: s.IDPrefix,
		State: s.State, Fired: s.Fired, Skipped: s.Skipped, LastSlot: tsPtr(s.LastSlot), LastTaskID: s.LastTaskID,
		NextSlot: tsPtr(s.NextSlot), Version: s.Version, CreateTime: tsPtr(s.CreateTime), UpdateTime: tsPtr(s.UpdateTime)}
	if len(s.Payload) > 0 {
		v.Payload = payloadText(s.Payload)
	}
	return v
}

// emitSchedule prints one schedule.
func (g *globals) emitSchedule(s client.Schedule) error {
	return g.emit(viewSchedule(s), func() error {
		kv := [][2]string{{"id", s.Namespace + "/" + s.ID}, {"rule", rule(s)}, {"time zone", orDash(s.TimeZone)}, {"state", s.State},
			{"next slot", ts(s.NextSlot)}, {"fired", strconv.FormatInt(s.Fired, 10)}, {"skipped", strconv.FormatInt(s.Skipped, 10)},
			{"last firing", orDash(s.LastTaskID)}, {"catch-up", s.CatchUp}, {"overlap", s.Overlap}, {"version", strconv.FormatInt(s.Version, 10)}}
		if s.CatchUpWindow != 0 {
			kv = append(kv, [2]string{"catch-up window", duration.Format(s.CatchUpWindow)})
		}
		if s.Jitter != 0 {
			kv = append(kv, [2]string{"jitter", duration.Format(s.Jitter)})
		}
		if !s.Start.IsZero() || !s.End.IsZero() {
			kv = append(kv, [2]string{"start", ts(s.Start)}, [2]string{"end", ts(s.End)})
		}
		if s.MaxFirings != 0 {
			kv = append(kv, [2]string{"max firings", strconv.FormatInt(s.MaxFirings, 10)})
		}
		kv = append(kv, [2]string{"kind", orDash(s.Kind)}, [2]string{"payload", payloadText(s.Payload)})
		if s.Description != "" {
			kv = append(kv, [2]string{"description", s.Description})
		}
		return g.fields(kv)
	})
}
