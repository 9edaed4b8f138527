package ctl

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/internal/duration"
)

// deadFilter selects dead letters on the client side: every set field must
// match.
type deadFilter struct {
	kind          string
	idPrefix      string
	errorContains string
}

func (f deadFilter) set() bool { return f.kind != "" || f.idPrefix != "" || f.errorContains != "" }

func (f deadFilter) match(t client.Task) bool {
	return (f.kind == "" || t.Kind == f.kind) &&
		strings.HasPrefix(t.ID, f.idPrefix) &&
		strings.Contains(t.LastError, f.errorContains)
}

func (f *deadFilter) flags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.kind, "kind", "", "only dead letters of this kind")
	cmd.Flags().StringVar(&f.idPrefix, "id-prefix", "", "only dead letters whose id starts with this")
	cmd.Flags().StringVar(&f.errorContains, "error-contains", "", "only dead letters whose last error contains this")
}

// matching lists the dead letters of ns that f selects.
func matching(ctx context.Context, a *client.Admin, ns string, f deadFilter) ([]client.Task, error) {
	out := []client.Task{}
	for t, err := range a.DeadLetters(ctx, ns) {
		if err != nil {
			return nil, err
		}
		if f.match(t) {
			out = append(out, t)
		}
	}
	return out, nil
}

func deadCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "dead", Short: "Dead letters: list, requeue, purge (by id, --all, or a filter)"}

	var lf deadFilter
	list := &cobra.Command{
		Use: "list NS [--kind K] [--id-prefix P] [--error-contains S]", Short: "List dead letters, oldest death first", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			a, err := g.admin()
			if err != nil {
				return err
			}
			tasks, err := matching(cmd.Context(), a, args[0], lf)
			if err != nil {
				return err
			}
			return g.emitTasks(tasks)
		},
	}
	lf.flags(list)
	cmd.AddCommand(list, deadActionCommand(g, "requeue"), deadActionCommand(g, "purge"))
	return cmd
}

// maxIDsPerCall is the most ids one Requeue/Purge call takes.
const maxIDsPerCall = 1000

// deadActionCommand is "dead requeue" or "dead purge": by ids, --all, or a
// filter (the matching dead letters are listed, then acted on by id in
// calls of at most 1,000).
func deadActionCommand(g *globals, verb string) *cobra.Command {
	var (
		all   bool
		f     deadFilter
		delay time.Duration
	)
	cmd := &cobra.Command{
		Use:  verb + " NS (ID... | --all | --kind K | --id-prefix P | --error-contains S)",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ns, ids := args[0], args[1:]
			ways := 0
			for _, b := range []bool{len(ids) > 0, all, f.set()} {
				if b {
					ways++
				}
			}
			if ways != 1 {
				return usagef("dead %s: select dead letters one way: ids, --all, or filter flags (--kind, --id-prefix, --error-contains)", verb)
			}
			a, err := g.admin()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			act := func(sel client.DeadLetterSelection) (int64, error) {
				if verb == "requeue" {
					return a.RequeueDeadLetters(ctx, ns, sel, delay)
				}
				return a.PurgeDeadLetters(ctx, ns, sel)
			}
			var n int64
			if all {
				if n, err = act(client.DeadLetterSelection{All: true}); err != nil {
					return err
				}
			} else {
				if f.set() {
					tasks, err := matching(ctx, a, ns, f)
					if err != nil {
						return err
					}
					for _, t := range tasks {
						ids = append(ids, t.ID)
					}
				}
				for start := 0; start < len(ids); start += maxIDsPerCall {
					got, err := act(client.DeadLetterSelection{IDs: ids[start:min(start+maxIDsPerCall, len(ids))]})
					n += got
					if err != nil {
						return fmt.Errorf("after %d %sd: %w", n, verb, err)
					}
				}
			}
			past := map[string]string{"requeue": "requeued", "purge": "purged"}[verb]
			if err := g.emit(map[string]any{"namespace": ns, past: n}, func() error {
				return write(g.stdout, "%s %d dead letters of %s\n", past, n, ns)
			}); err != nil {
				return err
			}
			// Ids named one by one that were not dead letters (missing,
			// or scheduled/delivered, which dead letters calls leave as
			// they are) are an error: the caller expected them dead.
			if named := len(args) - 1; named > 0 && !f.set() && n < int64(named) {
				what := "are not dead letters of %s, and were left as they are"
				if int64(named)-n == 1 {
					what = "is not a dead letter of %s, and was left as it is"
				}
				return fmt.Errorf("%d of the %d ids given "+what+" (`delayctl task get %s ID` shows a task's state)", int64(named)-n, named, ns, ns)
			}
			return nil
		},
	}
	if verb == "requeue" {
		cmd.Short = "Move dead letters back to scheduled, attempts reset"
		cmd.Flags().Var(duration.Value{P: &delay}, "delay", "due after this delay, e.g. 30s, 15m, 2h or 1d (default: at once)")
	} else {
		cmd.Short = "Delete dead letters for good"
	}
	cmd.Flags().BoolVar(&all, "all", false, "every dead letter of the namespace")
	f.flags(cmd)
	return cmd
}
