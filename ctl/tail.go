package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/delayd/delayd/client"
)

// errEnough ends a tail after --count copies.
var errEnough = errors.New("enough")

func tailCommand(g *globals) *cobra.Command {
	var count int
	cmd := &cobra.Command{
		Use:   "tail NS [--count N]",
		Short: "Watch a namespace's deliveries as they happen, without taking them",
		Long: `tail prints a copy of each delivery delayd makes in the namespace, as it is
sent to a subscriber. It takes nothing: subscribers still receive every task,
on the same attempt. It needs the consume or admin scope. With several delayd
replicas on one Redis it sees every replica's deliveries (those of the replica
it is connected to from the start, the others' at the latest a second later).
It runs until interrupted, or until --count copies were printed.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if count < 0 {
				return usagef("--count %d: allowed: 0 (until interrupted) or more", count)
			}
			a, err := g.admin()
			if err != nil {
				return err
			}
			seen := 0
			ready := func() {
				if g.output == "table" {
					fmt.Fprintf(g.stderr, "watching deliveries of %s (interrupt to stop)\n", args[0])
				}
			}
			err = a.Watch(cmd.Context(), args[0], client.WatchOptions{Ready: ready}, func(w client.Watched) error {
				if err := g.printWatched(w); err != nil {
					return err
				}
				seen++
				if count > 0 && seen >= count {
					return errEnough
				}
				return nil
			})
			if errors.Is(err, errEnough) || errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		},
	}
	cmd.Flags().IntVar(&count, "count", 0, "stop after this many deliveries; 0 = until interrupted")
	return cmd
}

// printWatched prints one copy: a line of columns, or one JSON object per
// line.
func (g *globals) printWatched(w client.Watched) error {
	if g.output == "json" {
		v := struct {
			DeliveryTime  string   `json:"delivery_time"`
			LeaseDeadline string   `json:"lease_deadline"`
			Missed        int64    `json:"missed,omitempty"`
			Task          taskView `json:"task"`
		}{ts(w.DeliveryTime), ts(w.LeaseDeadline), w.Missed, viewTask(w.Task)}
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(g.stdout, "%s\n", b)
		return err
	}
	if w.Missed > 0 {
		fmt.Fprintf(g.stdout, "... %d deliveries not shown (tail read too slowly)\n", w.Missed)
	}
	_, err := fmt.Fprintf(g.stdout, "%s  %s  kind=%s  attempt=%s  lease-until=%s  payload=%q\n",
		ts(w.DeliveryTime), w.Task.ID, orDash(w.Task.Kind), strconv.Itoa(int(w.Task.Attempt)), ts(w.LeaseDeadline), short(payloadText(w.Task.Payload), 80))
	return err
}
