package ctl

import (
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/internal/duration"
)

func taskCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "task", Short: "Tasks: upsert, get, list, remove, remove-many, history"}
	cmd.AddCommand(taskUpsertCommand(g), taskGetCommand(g), taskListCommand(g), taskRemoveCommand(g), taskRemoveManyCommand(g),
		taskHistoryCommand(g))
	return cmd
}

func taskUpsertCommand(g *globals) *cobra.Command {
	var (
		delay   time.Duration
		at      string
		kind    string
		payload string
		once    bool
		ifGen   int64
	)
	cmd := &cobra.Command{
		Use:   "upsert NS ID (--delay 30s | --at RFC3339) [--kind K] [--payload TEXT|@file|@-] [--create-only | --if-generation N]",
		Short: "Create a task, or replace it (new due time, kind and payload)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var when client.When
			switch {
			case cmd.Flags().Changed("delay") && at != "":
				return usagef("--delay and --at exclude each other: give one")
			case at != "":
				t, err := time.Parse(time.RFC3339Nano, at)
				if err != nil {
					return usagef("--at %q: want an RFC 3339 time such as 2030-01-02T15:04:05Z", at)
				}
				when = client.At(t)
			case cmd.Flags().Changed("delay"):
				when = client.After(delay)
			default:
				return usagef("give the due time: --delay 30s or --at 2030-01-02T15:04:05Z")
			}
			if once && ifGen != 0 {
				return usagef("--create-only and --if-generation exclude each other: give one")
			}
			if ifGen < 0 {
				return usagef("--if-generation %d: allowed: the generation last read (1 or more)", ifGen)
			}
			body, err := g.readPayload(payload)
			if err != nil {
				return err
			}
			c, err := g.connect()
			if err != nil {
				return err
			}
			res, err := c.Upsert(cmd.Context(), args[0], client.TaskSpec{ID: args[1], Kind: kind, Payload: body, When: when,
				CreateOnly: once, IfGeneration: ifGen})
			if err != nil {
				return err
			}
			v := struct {
				taskView
				Created bool `json:"created"`
			}{viewTask(res.Task), res.Created}
			return g.emit(v, func() error {
				verb := "replaced"
				if res.Created {
					verb = "created"
				}
				due := ts(res.Task.DueTime)
				// delayd accepts a due time already past as "due now".
				if res.Task.DueTime.Before(res.Task.UpdateTime) {
					due += ", which had passed: due now"
				}
				return write(g.stdout, "%s %s/%s, due %s (generation %d)\n", verb, res.Task.Namespace, res.Task.ID, due, res.Task.Generation)
			})
		},
	}
	cmd.Flags().Var(duration.Value{P: &delay}, "delay", "due after this delay from now, by delayd's clock (e.g. 30s, 15m, 2h, 400d; 0 = now)")
	cmd.Flags().StringVar(&at, "at", "", "due at this RFC 3339 time (e.g. 2030-01-02T15:04:05Z); a time already past means due now")
	cmd.Flags().StringVar(&kind, "kind", "", "optional label, e.g. order.close")
	cmd.Flags().StringVar(&payload, "payload", "", "payload: literal text, @file to read a file, @- to read stdin")
	cmd.Flags().BoolVar(&once, "create-only", false, "only create: fail (AlreadyExists) and change nothing if the task exists")
	cmd.Flags().Int64Var(&ifGen, "if-generation", 0, "only replace the task at this generation, else fail (FailedPrecondition)")
	return cmd
}

// readPayload reads --payload: literal text, @file, or @- for stdin.
func (g *globals) readPayload(p string) ([]byte, error) {
	name, ok := strings.CutPrefix(p, "@")
	switch {
	case !ok:
		return []byte(p), nil
	case name == "-":
		return io.ReadAll(g.stdin)
	}
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, usagef("--payload: %v", err)
	}
	return b, nil
}

func taskGetCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use: "get NS ID", Short: "Show one task", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.connect()
			if err != nil {
				return err
			}
			t, err := c.Get(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			return g.emit(viewTask(*t), func() error { return g.fields(taskFields(*t)) })
		},
	}
}

// parseState reads --state.
func parseState(s string) (client.State, error) {
	switch strings.ToLower(s) {
	case "", "scheduled":
		return client.StateScheduled, nil
	case "delivered":
		return client.StateDelivered, nil
	case "dead":
		return client.StateDead, nil
	}
	return 0, usagef("--state %q: allowed: scheduled, delivered, dead", s)
}

func taskListCommand(g *globals) *cobra.Command {
	var (
		state     string
		limit     int
		noPayload bool
	)
	cmd := &cobra.Command{
		Use:   "list NS [--state scheduled|delivered|dead] [--limit N] [--no-payload]",
		Short: "List a namespace's tasks of one state, in that state's order",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := parseState(state)
			if err != nil {
				return err
			}
			if limit < 0 {
				return usagef("--limit %d: allowed: 0 (no limit) or more", limit)
			}
			c, err := g.connect()
			if err != nil {
				return err
			}
			tasks := []client.Task{}
			for t, err := range c.List(cmd.Context(), args[0], client.ListOptions{State: st, NoPayload: noPayload}) {
				if err != nil {
					return err
				}
				tasks = append(tasks, t)
				if limit > 0 && len(tasks) >= limit {
					break
				}
			}
			return g.emitTasks(tasks)
		},
	}
	cmd.Flags().StringVar(&state, "state", "scheduled", "scheduled, delivered or dead")
	cmd.Flags().IntVar(&limit, "limit", 100, "most tasks to print; 0 = all")
	cmd.Flags().BoolVar(&noPayload, "no-payload", false, "leave payloads out (cheaper for large tasks)")
	return cmd
}

func taskRemoveCommand(g *globals) *cobra.Command {
	var ifGen int64
	cmd := &cobra.Command{
		Use:   "remove NS ID [--if-generation N]",
		Short: "Cancel a task in any state (removing a missing task is not an error)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if ifGen < 0 {
				return usagef("--if-generation %d: allowed: the generation last read (1 or more)", ifGen)
			}
			c, err := g.connect()
			if err != nil {
				return err
			}
			var res client.RemoveResult
			if ifGen > 0 {
				res, err = c.RemoveIf(cmd.Context(), args[0], args[1], client.Version{Generation: ifGen})
			} else {
				res, err = c.Remove(cmd.Context(), args[0], args[1])
			}
			if err != nil {
				return err
			}
			out := map[string]any{"namespace": args[0], "id": args[1], "removed": res.Removed, "previous_state": res.PreviousState.String()}
			return g.emit(out, func() error {
				if !res.Removed {
					return write(g.stdout, "no task %s/%s: nothing removed\n", args[0], args[1])
				}
				return write(g.stdout, "removed %s/%s (was %s)\n", args[0], args[1], res.PreviousState)
			})
		},
	}
	cmd.Flags().Int64Var(&ifGen, "if-generation", 0, "only remove the task at this generation, else fail (FailedPrecondition)")
	return cmd
}

func taskRemoveManyCommand(g *globals) *cobra.Command {
	var kind, prefix, state string
	cmd := &cobra.Command{
		Use:   "remove-many NS (ID... | [--kind K] [--id-prefix P] [--state S])",
		Short: "Cancel the named tasks, or every task a filter selects (in bounded pages)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ns, ids := args[0], args[1:]
			filtered := kind != "" || prefix != "" || state != ""
			switch {
			case len(ids) > 0 && filtered:
				return usagef("give task ids or a filter (--kind, --id-prefix, --state), not both")
			case len(ids) == 0 && !filtered:
				return usagef("give task ids or a filter: --kind, --id-prefix, --state (any state when not given)")
			}
			var f client.TaskFilter
			if state != "" {
				st, err := parseState(state)
				if err != nil {
					return err
				}
				f.State = st
			}
			f.Kind, f.IDPrefix = kind, prefix
			c, err := g.connect()
			if err != nil {
				return err
			}
			var n int64
			if len(ids) > 0 {
				n, err = c.RemoveIDs(cmd.Context(), ns, ids)
			} else {
				n, err = c.RemoveMatching(cmd.Context(), ns, f)
			}
			if err != nil {
				if n > 0 {
					_ = write(g.stderr, "removed %d task(s) of %s before the error\n", n, ns)
				}
				return err
			}
			return g.emit(map[string]any{"namespace": ns, "removed": n}, func() error {
				return write(g.stdout, "removed %d task(s) of %s\n", n, ns)
			})
		},
	}
	cmd.Flags().StringVar(&kind, "kind", "", "only tasks of this kind")
	cmd.Flags().StringVar(&prefix, "id-prefix", "", "only tasks whose id starts with this")
	cmd.Flags().StringVar(&state, "state", "", "only tasks in this state: scheduled, delivered or dead (default: any)")
	return cmd
}

func taskHistoryCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "history NS ID",
		Short: "Show what happened to a task, oldest first (also after it is gone; needs the namespace's history_retention_bytes)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.connect()
			if err != nil {
				return err
			}
			events := []client.TaskEvent{}
			for e, err := range c.History(cmd.Context(), args[0], args[1]) {
				if err != nil {
					return err
				}
				events = append(events, e)
			}
			return g.emit(events, func() error {
				rows := make([][]string, len(events))
				for i, e := range events {
					rows[i] = eventRow(e)
				}
				return g.table([]string{"TIME", "EVENT", "GEN", "ATTEMPT", "DUE", "KEY", "DETAIL"}, rows)
			})
		},
	}
}

// eventRow is one event as a table row: the details its kind carries in
// DETAIL.
// historyTime is RFC 3339 with milliseconds always written, so a history
// table's columns line up (RFC3339Nano drops trailing zeros).
const historyTime = "2006-01-02T15:04:05.000Z07:00"

func eventRow(e client.TaskEvent) []string {
	var detail []string
	if e.Replica != "" {
		detail = append(detail, "replica "+e.Replica, "late "+e.Lateness.String())
	}
	if e.Reason != "" {
		detail = append(detail, "reason "+strconv.Quote(e.Reason))
	}
	if e.RetryAfter > 0 {
		detail = append(detail, "retry after "+e.RetryAfter.String())
	}
	num := func(n int64) string {
		if n == 0 {
			return "-"
		}
		return strconv.FormatInt(n, 10)
	}
	due := "-"
	if !e.Due.IsZero() {
		due = e.Due.UTC().Format(historyTime)
	}
	return []string{e.Time.UTC().Format(historyTime), e.Kind, num(e.Generation), num(int64(e.Attempt)), due, orDash(e.KeyID),
		orDash(strings.Join(detail, ", "))}
}
