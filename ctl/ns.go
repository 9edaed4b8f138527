package ctl

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/internal/duration"
)

func nsCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "ns", Short: "Namespaces: list, get, create, update, delete, stats"}
	cmd.AddCommand(
		&cobra.Command{
			Use: "list", Short: "List every namespace with its task counts (needs a global admin key)", Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error { return g.nsList(cmd) },
		},
		&cobra.Command{
			Use: "get NS", Short: "Show a namespace and its policy", Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				a, err := g.admin()
				if err != nil {
					return err
				}
				n, err := a.GetNamespace(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				return g.emit(viewNamespace(n), func() error { return g.fields(namespaceFields(n)) })
			},
		},
		nsWriteCommand(g, "create"),
		nsWriteCommand(g, "update"),
		nsDeleteCommand(g),
		nsStatsCommand(g),
	)
	return cmd
}

func nsStatsCommand(g *globals) *cobra.Command {
	var forecast bool
	cmd := &cobra.Command{
		Use: "stats NS [--forecast]", Short: "Count a namespace's tasks per state and show how late the oldest due task is", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			a, err := g.admin()
			if err != nil {
				return err
			}
			s, err := a.Stats(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return g.emit(viewStats(s), func() error {
				if err := g.table(statsHeader, [][]string{statsRow(args[0], s)}); err != nil {
					return err
				}
				if err := g.dueByKind(s); err != nil {
					return err
				}
				if forecast {
					return g.forecast(s)
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&forecast, "forecast", false, "also show how many tasks fall due per 5 minutes over the next hour and per hour over the next day (-o json always has it)")
	return cmd
}

var statsHeader = []string{"NAMESPACE", "SCHEDULED", "DUE NOW", "DELIVERED", "DEAD", "OLDEST DUE LATENESS", "PAUSED", "MAX RATE", "DELIVERY"}

func statsRow(ns string, s client.Stats) []string {
	i := func(v int64) string { return strconv.FormatInt(v, 10) }
	rate := "unlimited"
	if s.MaxDispatchRate > 0 {
		rate = strconv.FormatFloat(s.MaxDispatchRate, 'g', -1, 64) + "/s"
	}
	delivery := "subscribe"
	if s.Push {
		delivery = "push"
	}
	return []string{ns, i(s.Scheduled), i(s.DueNow), i(s.Delivered), i(s.Dead), s.OldestDueLateness.String(),
		strconv.FormatBool(s.Paused), rate, delivery}
}

// dueByKind prints, below the stats of one namespace, its due tasks per
// kind (nothing when none is due).
func (g *globals) dueByKind(s client.Stats) error {
	if len(s.DueByKind) == 0 {
		return nil
	}
	kinds := slices.Sorted(maps.Keys(s.DueByKind))
	rows := make([][]string, 0, len(kinds))
	for _, k := range kinds {
		name := k
		if name == "" {
			name = "(none)"
		}
		rows = append(rows, []string{name, strconv.FormatInt(s.DueByKind[k], 10)})
	}
	if s.DueByKindPartial {
		rows = append(rows, []string{"(first 1000 due tasks only)", ""})
	}
	if _, err := fmt.Fprintln(g.stdout); err != nil {
		return err
	}
	return g.table([]string{"KIND", "DUE NOW"}, rows)
}

// forecast prints, below the stats of one namespace, how many scheduled
// tasks fall due in the next hour (per 5 minutes, summing the per-minute
// counts) and the next day (per hour), with a bar per row.
func (g *globals) forecast(s client.Stats) error {
	if len(s.DuePerMinute) == 0 && len(s.DuePerHour) == 0 {
		return nil
	}
	var rows [][]string
	var peak int64
	type bucket struct {
		label string
		n     int64
	}
	var bs []bucket
	for i := 0; i < len(s.DuePerMinute); i += 5 {
		var n int64
		for _, v := range s.DuePerMinute[i:min(i+5, len(s.DuePerMinute))] {
			n += v
		}
		bs = append(bs, bucket{fmt.Sprintf("+%dm..+%dm", i, min(i+5, len(s.DuePerMinute))), n})
	}
	for i := 1; i < len(s.DuePerHour); i++ { // hour 0 is the minutes above
		bs = append(bs, bucket{fmt.Sprintf("+%dh..+%dh", i, i+1), s.DuePerHour[i]})
	}
	for _, b := range bs {
		peak = max(peak, b.n)
	}
	for _, b := range bs {
		bar := ""
		if peak > 0 {
			bar = strings.Repeat("#", int((b.n*30+peak-1)/peak))
		}
		rows = append(rows, []string{b.label, strconv.FormatInt(b.n, 10), bar})
	}
	if _, err := fmt.Fprintln(g.stdout); err != nil {
		return err
	}
	return g.table([]string{"FALLS DUE", "TASKS", ""}, rows)
}

// nsList prints every namespace with its stats.
func (g *globals) nsList(cmd *cobra.Command) error {
	a, err := g.admin()
	if err != nil {
		return err
	}
	out := []namespaceView{}
	var rows [][]string
	for n, err := range a.Namespaces(cmd.Context()) {
		if err != nil {
			return err
		}
		s, err := a.Stats(cmd.Context(), n.Name)
		if err != nil {
			return err
		}
		v := viewNamespace(n)
		v.Stats = viewStats(s)
		out = append(out, v)
		rows = append(rows, statsRow(n.Name, s))
	}
	return g.emit(out, func() error { return g.table(statsHeader, rows) })
}

func namespaceFields(n client.Namespace) [][2]string {
	p := n.Policy
	dflt := func(s string, zero bool) string {
		if zero {
			return "default"
		}
		return s
	}
	d := func(v time.Duration) string { return dflt(duration.Format(v), v == 0) }
	i := func(v int64) string { return dflt(strconv.FormatInt(v, 10), v == 0) }
	f := func(v float64) string { return dflt(strconv.FormatFloat(v, 'g', -1, 64), v == 0) }
	fields := [][2]string{
		{"name", n.Name},
		{"created", ts(n.CreateTime)},
		{"updated", ts(n.UpdateTime)},
		{"ack_timeout", d(p.AckTimeout)},
		{"max_attempts", i(int64(p.MaxAttempts))},
		{"backoff_initial", d(p.BackoffInitial)},
		{"backoff_max", d(p.BackoffMax)},
		{"backoff_multiplier", f(p.BackoffMultiplier)},
		{"max_payload_bytes", i(int64(p.MaxPayloadBytes))},
		{"max_pending_tasks", i(p.MaxPendingTasks)},
		{"rate_limit", f(p.RateLimit)},
		{"rate_burst", i(int64(p.RateBurst))},
		{"max_subscribers", i(int64(p.MaxSubscribers))},
		{"max_delay", d(p.MaxDelay)},
		{"paused", strconv.FormatBool(p.Paused)},
		{"max_dispatch_rate", f(p.MaxDispatchRate)},
		{"push_url", orDash(p.PushURL)},
		{"push_secret", map[bool]string{true: "set (write-only)", false: "-"}[p.PushSecretSet]},
		{"shards", i(int64(p.Shards))},
		{"max_schedules", i(int64(p.MaxSchedules))},
	}
	if p.HistoryRetentionBytes > 0 { // shown only when on, as most namespaces keep none
		fields = append(fields, [2]string{"history_retention_bytes", strconv.FormatInt(p.HistoryRetentionBytes, 10)})
	}
	return fields
}

// policyFlags binds one flag per policy field (named like the field, with
// dashes) to p.
func policyFlags(fs *pflag.FlagSet, p *client.Policy) {
	fs.Var(duration.Value{P: &p.AckTimeout}, "ack-timeout", "lease per delivery (1s-12h; 0 = server default 30s)")
	fs.Int32Var(&p.MaxAttempts, "max-attempts", 0, "deliveries before a task becomes a dead letter (1-1000; 0 = default 10)")
	fs.Var(duration.Value{P: &p.BackoffInitial}, "backoff-initial", "first retry delay (0 = default 1s)")
	fs.Var(duration.Value{P: &p.BackoffMax}, "backoff-max", "largest retry delay (0 = default 10m)")
	fs.Float64Var(&p.BackoffMultiplier, "backoff-multiplier", 0, "factor between retry delays (1-10; 0 = default 2)")
	fs.Int32Var(&p.MaxPayloadBytes, "max-payload-bytes", 0, "largest payload in bytes (0 = default 65536; global admin only)")
	fs.Int64Var(&p.MaxPendingTasks, "max-pending-tasks", 0, "most tasks held (0 = unlimited; global admin only)")
	fs.Float64Var(&p.RateLimit, "rate-limit", 0, "requests per second (0 = unlimited; global admin only)")
	fs.Int32Var(&p.RateBurst, "rate-burst", 0, "burst above --rate-limit (0 = default; global admin only)")
	fs.Int32Var(&p.MaxSubscribers, "max-subscribers", 0, "concurrent Subscribe streams (0 = unlimited; global admin only)")
	fs.Var(duration.Value{P: &p.MaxDelay}, "max-delay", "furthest ahead a task may be due (0 = default 366d)")
	fs.BoolVar(&p.Paused, "paused", false, "stop deliveries on every replica (--paused=false resumes them)")
	fs.Float64Var(&p.MaxDispatchRate, "max-dispatch-rate", 0, "deliveries per second across all replicas (0 = unlimited)")
	fs.StringVar(&p.PushURL, "push-url", "", "POST due tasks to this http(s) URL instead of serving Subscribe streams; a host the server's --push-allow admits; '' turns push off")
	fs.StringVar(&p.PushSecret, "push-secret", "", "HMAC-SHA256 key signing push requests (16-1024 bytes; required with the first --push-url; kept when not given)")
	fs.Int64Var(&p.HistoryRetentionBytes, "history-retention-bytes", 0, "keep task histories (delayctl task history), about this many bytes of events (65536-1073741824; 0 = off; global admin only)")
	fs.Int32Var(&p.MaxSchedules, "max-schedules", 0, "most schedules (recurring tasks) the namespace may have (1-100000; 0 = default 1000; global admin only)")
	fs.Int32Var(&p.Shards, "shards", 0, "Redis Cluster slots the tasks spread over (1-256; 0 = default 1; set at create only; global admin only)")
}

// nsWriteCommand is "ns create" or "ns update": update changes only the
// policy fields whose flags were given.
func nsWriteCommand(g *globals, verb string) *cobra.Command {
	var p client.Policy
	cmd := &cobra.Command{
		Use:  verb + " NS [policy flags]",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			a, err := g.admin()
			if err != nil {
				return err
			}
			var n client.Namespace
			if verb == "create" {
				n, err = a.CreateNamespace(cmd.Context(), args[0], p)
			} else {
				var fields []string
				for _, f := range client.PolicyFields {
					if cmd.Flags().Changed(dashed(f)) {
						fields = append(fields, f)
					}
				}
				if cmd.Flags().Changed("push-url") || cmd.Flags().Changed("push-secret") {
					fields = append(fields, "push")
				}
				if len(fields) == 0 {
					return usagef("ns update: give at least one policy flag (see --help)")
				}
				if cmd.Flags().Changed("push-secret") && !cmd.Flags().Changed("push-url") {
					// A new secret alone: keep the URL the namespace has.
					cur, err := a.GetNamespace(cmd.Context(), args[0])
					if err != nil {
						return err
					}
					if cur.Policy.PushURL == "" {
						return usagef("ns update: --push-secret needs --push-url: %s has no push target", args[0])
					}
					p.PushURL = cur.Policy.PushURL
				}
				n, err = a.UpdateNamespace(cmd.Context(), args[0], p, fields)
			}
			if err != nil {
				return err
			}
			return g.emit(viewNamespace(n), func() error { return g.fields(namespaceFields(n)) })
		},
	}
	if verb == "create" {
		cmd.Short = "Create a namespace (needs a global admin key); unset policy flags take the server defaults"
	} else {
		cmd.Short = "Change the policy fields whose flags are given"
	}
	policyFlags(cmd.Flags(), &p)
	return cmd
}

func dashed(field string) string {
	b := []byte(field)
	for i, c := range b {
		if c == '_' {
			b[i] = '-'
		}
	}
	return string(b)
}

func nsDeleteCommand(g *globals) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use: "delete NS", Short: "Delete a namespace (refused while it has tasks, unless --force)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			a, err := g.admin()
			if err != nil {
				return err
			}
			n, err := a.DeleteNamespace(cmd.Context(), args[0], force)
			if err != nil {
				return err
			}
			return g.emit(map[string]any{"namespace": args[0], "deleted_tasks": n}, func() error {
				return write(g.stdout, "deleted namespace %s (%d tasks)\n", args[0], n)
			})
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "delete the namespace's tasks too")
	return cmd
}

func whoamiCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use: "whoami", Short: "Show the API key's namespace and scopes", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			a, err := g.admin()
			if err != nil {
				return err
			}
			c, err := a.WhoAmI(cmd.Context())
			if err != nil {
				return err
			}
			return g.emit(c, func() error {
				return g.fields([][2]string{
					{"key", orDash(c.Key.ID)},
					{"namespace", c.Key.Namespace},
					{"scopes", scopeList(c.Key.Scopes)},
					{"auth", fmt.Sprint(map[bool]string{true: "on", false: "off: every caller may do everything"}[c.AuthEnabled])},
				})
			})
		},
	}
}
