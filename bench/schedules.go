package bench

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"google.golang.org/protobuf/types/known/durationpb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/schedule"
)

// Schedules is a run of recurring tasks (delaybench --schedules N): N
// schedules of one cron rule ("* * * * *": every minute, at :00), spread
// over Namespaces namespaces, whose firings subscribers receive and ack
// for Minutes minutes. It measures what issue 39 asks of them: the
// lateness of the firings' deliveries (every one of them due at the same
// instant each minute), each slot delivered once and none missing, and
// the Redis calls per firing.
type Schedules struct {
	// Count is how many schedules. Zero: no schedules run.
	Count int `json:"count"`
	// Minutes is how many minute slots are measured. If zero, 2.
	Minutes int `json:"minutes"`
	// Namespaces spreads the schedules. If zero, 10.
	Namespaces int `json:"namespaces"`
	// Durable runs delayd in durable mode (--mysql-dsn).
	Durable bool `json:"durable,omitempty"`
	// Jitter spreads each schedule's firings over [slot, slot+Jitter)
	// (Schedule.jitter); zero: every firing is due at :00.
	Jitter time.Duration `json:"jitter_ns,omitempty"`
}

func (s Schedules) withDefaults() Schedules {
	if s.Minutes <= 0 {
		s.Minutes = 2
	}
	if s.Namespaces <= 0 {
		s.Namespaces = 10
	}
	return s
}

// SchedulesReport is what a schedules run measured.
type SchedulesReport struct {
	Machine Machine   `json:"machine"`
	Started string    `json:"started"`
	Delayd  string    `json:"delayd,omitempty"`
	Params  Schedules `json:"params"`
	Clock   Clock     `json:"clock"`
	// CreateSeconds is how long creating the schedules took.
	CreateSeconds float64 `json:"create_s"`
	// Slots are the measured minute slots (UTC).
	Slots []time.Time `json:"slots"`
	// Expected is Count × Minutes; Delivered the distinct firings of the
	// measured slots received; Duplicates the deliveries beyond the first
	// of a firing; Missing the expected firings never received.
	Expected   int `json:"expected"`
	Delivered  int `json:"delivered"`
	Duplicates int `json:"duplicates"`
	Missing    int `json:"missing"`
	// Straggling are the delivered firings first received after the
	// measured window (30 s past the last slot's due times): the run waits
	// up to two more minutes for them, so Missing counts firings never
	// received, not late ones. Their lateness is in Lateness.
	Straggling int `json:"straggling"`
	// Counters are delayd's schedule counters over the run's minutes
	// (child delayd): firings created on time and as catch-ups (slots
	// decided later than the grace), slots skipped (catch-up none) and
	// steps lost to another replica.
	Counters map[string]float64 `json:"counters,omitempty"`
	// Lateness of each firing's first delivery (receive time by the
	// store's clock minus its due time: the slot, plus its jitter), in ms.
	Lateness Summary `json:"lateness"`
	// Control is the lateness of as many plain tasks (UpsertTask, no
	// schedule) due as the firings of one slot were, measured the same
	// way after the schedules are gone: what the firings' lateness is to
	// be compared with.
	Control Summary `json:"control"`
	// RedisCalls are Redis's commands over the measured minutes (from
	// INFO commandstats: other clients' commands on a shared Redis count
	// too), and CallsPerFiring their sum divided by Delivered.
	RedisCalls     map[string]CallStat `json:"redis_calls"`
	CallsPerFiring float64             `json:"calls_per_firing"`
	// ServerLateness is delayd's own count of its deliveries' lateness over
	// the measured minutes (delayd_delivery_lateness_seconds, from the ops
	// listener of a child delayd): the share delivered within each bucket
	// bound (seconds), so the server's part of the lateness shows apart
	// from the receiving client's.
	ServerLateness map[string]float64 `json:"server_lateness,omitempty"`
	// DelaydCPUSeconds is the delayd process's CPU over the measured
	// minutes; DelaydCPU says what it covers.
	DelaydCPUSeconds float64 `json:"delayd_cpu_s"`
	DelaydCPU        string  `json:"delayd_cpu"`
	Error            string  `json:"error,omitempty"`
}

// schedSink counts the deliveries of firings (and of the control's
// tasks), by task id, and keeps the lateness of each first delivery: due
// tells a task's due time from its id.
type schedSink struct {
	clock Clock
	due   func(id string) (time.Time, bool)
	mu    sync.Mutex
	seen  map[string]int
	late  map[string]time.Duration
	acks  atomic.Int64
}

func (s *schedSink) delivered(_ string, id string, at time.Time) {
	due, ok := s.due(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seen[id]++
	if s.seen[id] == 1 && ok {
		s.late[id] = s.clock.At(at).Sub(due)
	}
}

// firingsSeen counts the distinct firings of slots received.
func (s *schedSink) firingsSeen(slots []time.Time, count int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for i := range count {
		for _, slot := range slots {
			if s.seen[fmt.Sprintf("s%06d.%s", i, slot.Format("20060102T150405Z"))] > 0 {
				n++
			}
		}
	}
	return n
}

// waitStragglers waits until every firing of slots was received, or until
// the local time deadline.
func waitStragglers(ctx context.Context, sk *schedSink, slots []time.Time, count int, deadline time.Time) {
	for sk.firingsSeen(slots, count) < count*len(slots) && time.Now().Before(deadline) {
		if sleepUntil(ctx, time.Now().Add(time.Second)) != nil {
			return
		}
	}
}

func (s *schedSink) acked(n, _ int, _ time.Time) { s.acks.Add(int64(n)) }

// runSchedules runs cfg.Schedules and writes its report.
func runSchedules(ctx context.Context, cfg Config, e env, redisURL string, stdout, stderr io.Writer) error {
	sc := cfg.Schedules.withDefaults()
	dep := deployRedis
	if sc.Durable {
		dep = deployDurable
	}
	if cfg.DelaydLog == nil {
		cfg.DelaydLog = io.Discard
	}
	deps := &deployments{cfg: cfg, redisURL: redisURL, log: cfg.DelaydLog, buildOut: stderr}
	defer deps.close()
	d, err := deps.get(ctx, dep)
	if err != nil {
		return err
	}
	key := d.apiKey
	if cfg.APIKey != "" {
		key = cfg.APIKey
	}
	ds, err := newDelaydSystem(delaydConfig{Addr: d.addr, APIKey: key, Conns: cfg.Conns, AckBatch: cfg.AckBatch,
		CPU: d.cpu, Redis: e.redis.rdb, Logger: cfg.Logger})
	if err != nil {
		return err
	}
	defer ds.close()
	rep := &SchedulesReport{Machine: machineInfo(), Started: time.Now().UTC().Format(time.RFC3339), Params: sc, Clock: e.clock,
		Delayd: gitDescribe(ctx)}

	nss := make([]string, sc.Namespaces)
	per := (sc.Count + sc.Namespaces - 1) / sc.Namespaces
	run := randomSuffix(5)
	for i := range nss {
		nss[i] = fmt.Sprintf("dbench-%s-sched-%d", run, i)
		_, err := ds.admin.CreateNamespace(ctx, &delaydv1.CreateNamespaceRequest{Namespace: &delaydv1.Namespace{Name: nss[i],
			Policy: &delaydv1.NamespacePolicy{MaxSchedules: int32(max(per, 1))}}})
		if err != nil && status.Code(err) != codes.AlreadyExists {
			return fmt.Errorf("create namespace %s: %w", nss[i], err)
		}
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		for _, ns := range nss {
			_, _ = ds.admin.DeleteNamespace(cctx, &delaydv1.DeleteNamespaceRequest{Namespace: ns, Force: true})
		}
	}()
	// A firing is due at its slot (in its id) plus its jitter; a control
	// task ("c<n>-<due ms>") at the time in its id.
	dueOf := func(id string) (time.Time, bool) {
		if rest, ok := strings.CutPrefix(id, "c"); ok {
			_, ms, _ := strings.Cut(rest, "-")
			n, err := strconv.ParseInt(ms, 10, 64)
			return time.UnixMilli(n), err == nil
		}
		sched, stamp, _ := strings.Cut(id, ".")
		stamp, _, _ = strings.Cut(stamp, "_")
		slot, err := time.Parse("20060102T150405Z", stamp)
		i, _ := strconv.Atoi(strings.TrimPrefix(sched, "s"))
		return slot.Add(schedule.JitterOf(nss[i%len(nss)], sched, slot, sc.Jitter)), err == nil
	}
	sk := &schedSink{clock: e.clock, due: dueOf, seen: map[string]int{}, late: map[string]time.Duration{}}
	stop, err := ds.consume(ctx, nss, max(len(nss), 4), 1000, sk)
	if err != nil {
		return err
	}
	defer stop()

	start := time.Now()
	if err := eachSchedule(ctx, sc.Count, func(ctx context.Context, i int) error {
		_, err := delaydv1.NewScheduleServiceClient(ds.conns[i%len(ds.conns)]).CreateSchedule(ctx, &delaydv1.CreateScheduleRequest{Schedule: &delaydv1.Schedule{
			Namespace: nss[i%len(nss)], Id: fmt.Sprintf("s%06d", i), Rule: &delaydv1.Schedule_Cron{Cron: "* * * * *"},
			Jitter: durationOrNil(sc.Jitter), Task: &delaydv1.ScheduleTaskTemplate{Kind: "bench.tick"}}})
		return err
	}); err != nil {
		return fmt.Errorf("create schedules: %w", err)
	}
	rep.CreateSeconds = time.Since(start).Seconds()
	fmt.Fprintf(stderr, "schedules: %d created in %.1fs\n", sc.Count, rep.CreateSeconds)

	// The measured slots: whole minutes from the first that comes at least
	// 20 s after the creates ended (its firings were then created by the
	// schedule loop, a lookahead ahead, not by the creates).
	first := e.clock.Now().Add(20 * time.Second).Truncate(time.Minute).Add(time.Minute)
	for i := range sc.Minutes {
		rep.Slots = append(rep.Slots, first.Add(time.Duration(i)*time.Minute).UTC())
	}
	last := rep.Slots[len(rep.Slots)-1]
	// Counts from 30 s before the first measured slot (its firings'
	// creation) to 30 s after the last firing's due time (its deliveries
	// and acks).
	if err := sleepUntil(ctx, first.Add(-30*time.Second).Add(-e.clock.Offset)); err != nil {
		return err
	}
	before, err := e.redis.CommandStats(ctx)
	if err != nil {
		return err
	}
	cpu0, what, cpuOK := ds.cpu()
	hist0 := scrapeHistogram(ctx, d.opsAddr, "delayd_delivery_lateness_seconds")
	counters0 := scrapeCounters(ctx, d.opsAddr)
	windowEnd := last.Add(sc.Jitter + 30*time.Second)
	if err := sleepUntil(ctx, windowEnd.Add(-e.clock.Offset)); err != nil {
		return err
	}
	after, err := e.redis.CommandStats(ctx)
	if err != nil {
		return err
	}
	if cpu1, _, ok := ds.cpu(); ok && cpuOK {
		rep.DelaydCPUSeconds, rep.DelaydCPU = (cpu1 - cpu0).Seconds(), what
	}
	rep.RedisCalls = subStats(after, before)
	if hist1 := scrapeHistogram(ctx, d.opsAddr, "delayd_delivery_lateness_seconds"); hist1 != nil && hist0 != nil {
		rep.ServerLateness = map[string]float64{}
		total := hist1["+Inf"] - hist0["+Inf"]
		for le, n := range hist1 {
			if total > 0 && le != "+Inf" {
				rep.ServerLateness[le] = (n - hist0[le]) / total
			}
		}
	}
	inWindow := sk.firingsSeen(rep.Slots, sc.Count)
	waitStragglers(ctx, sk, rep.Slots, sc.Count, windowEnd.Add(2*time.Minute).Add(-e.clock.Offset))
	if counters1 := scrapeCounters(ctx, d.opsAddr); counters1 != nil && counters0 != nil {
		rep.Counters = map[string]float64{}
		for k, v := range counters1 {
			rep.Counters[k] = v - counters0[k]
		}
	}
	tallySchedules(rep, sk, sc)
	rep.Straggling = rep.Delivered - inWindow
	if err := runControl(ctx, e, ds, sc, nss, sk, rep); err != nil && rep.Error == "" {
		rep.Error = "control: " + err.Error()
	}
	rep.Machine.LoadAvgEnd = loadAvg()
	return writeSchedulesReport(cfg, rep, stdout)
}

// tallySchedules counts the measured slots' firings the sink saw.
func tallySchedules(rep *SchedulesReport, sk *schedSink, sc Schedules) {
	sk.mu.Lock()
	defer sk.mu.Unlock()
	rep.Expected = sc.Count * len(rep.Slots)
	var lat []time.Duration
	for i := range sc.Count {
		for _, slot := range rep.Slots {
			id := fmt.Sprintf("s%06d.%s", i, slot.Format("20060102T150405Z"))
			n := sk.seen[id]
			switch {
			case n == 0:
				rep.Missing++
			default:
				rep.Delivered++
				rep.Duplicates += n - 1
				lat = append(lat, sk.late[id])
			}
		}
	}
	rep.Lateness = Summarize(lat)
	var calls int64
	for _, c := range rep.RedisCalls {
		calls += c.Calls
	}
	if rep.Delivered > 0 {
		rep.CallsPerFiring = float64(calls) / float64(rep.Delivered)
	}
	if rep.Missing+rep.Duplicates > 0 && rep.Error == "" {
		rep.Error = fmt.Sprintf("%d firings missing, %d duplicate deliveries", rep.Missing, rep.Duplicates)
	}
}

// scrapeHistogram reads the cumulative bucket counts of histogram name
// from a delayd's /metrics, summed over its label sets, by bucket bound;
// nil when addr is "" or the read fails.
func scrapeHistogram(ctx context.Context, addr, name string) map[string]float64 {
	if addr == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"_bucket{") {
			continue
		}
		i := strings.Index(line, `le="`)
		j := strings.LastIndexByte(line, ' ')
		if i < 0 || j < 0 {
			continue
		}
		le := line[i+4 : i+4+strings.IndexByte(line[i+4:], '"')]
		v, err := strconv.ParseFloat(line[j+1:], 64)
		if err == nil {
			out[le] += v
		}
	}
	return out
}

// scrapeCounters reads delayd's schedule counters from its /metrics,
// summed over namespaces: "firings_<when>", "skipped", "steps_lost"; nil
// when addr is "" or the read fails.
func scrapeCounters(ctx context.Context, addr string) map[string]float64 {
	if addr == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		name, rest, ok := strings.Cut(line, "{")
		j := strings.LastIndexByte(line, ' ')
		if !ok || j < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[j+1:], 64)
		if err != nil {
			continue
		}
		switch name {
		case "delayd_schedule_firings_total":
			if i := strings.Index(rest, `when="`); i >= 0 {
				when := rest[i+6:]
				out["firings_"+when[:strings.IndexByte(when, '"')]] += v
			}
		case "delayd_schedule_skipped_total":
			out["skipped"] += v
		case "delayd_schedule_steps_lost_total":
			out["steps_lost"] += v
		}
	}
	return out
}

// runControl deletes the schedules, then upserts as many plain tasks as
// one slot fired, due as the slot's firings were (at one instant, or
// spread over the jitter), and measures their lateness the same way.
func runControl(ctx context.Context, e env, ds *delaydSystem, sc Schedules, nss []string, sk *schedSink, rep *SchedulesReport) error {
	if err := eachSchedule(ctx, sc.Count, func(ctx context.Context, i int) error {
		_, err := delaydv1.NewScheduleServiceClient(ds.conns[i%len(ds.conns)]).DeleteSchedule(ctx,
			&delaydv1.DeleteScheduleRequest{Namespace: nss[i%len(nss)], Id: fmt.Sprintf("s%06d", i)})
		return err
	}); err != nil {
		return fmt.Errorf("delete schedules: %w", err)
	}
	base := e.clock.Now().Add(20 * time.Second).Truncate(time.Second)
	byNS := make([][]item, len(nss))
	var ids []string
	for i := range sc.Count {
		due := base.Add(time.Duration(i) * sc.Jitter / time.Duration(sc.Count)).Truncate(time.Millisecond)
		id := fmt.Sprintf("c%d-%d", i, due.UnixMilli())
		byNS[i%len(nss)] = append(byNS[i%len(nss)], item{id: id, due: due})
		ids = append(ids, id)
	}
	for n, items := range byNS {
		for lo := 0; lo < len(items); lo += 1000 {
			if err := ds.upsert(ctx, nss[n], items[lo:min(lo+1000, len(items))], nil, false); err != nil {
				return err
			}
		}
	}
	if err := sleepUntil(ctx, base.Add(sc.Jitter).Add(30*time.Second).Add(-e.clock.Offset)); err != nil {
		return err
	}
	sk.mu.Lock()
	defer sk.mu.Unlock()
	var lat []time.Duration
	for _, id := range ids {
		if sk.seen[id] > 0 {
			lat = append(lat, sk.late[id])
		}
	}
	rep.Control = Summarize(lat)
	if len(lat) != len(ids) {
		return fmt.Errorf("%d of %d control tasks delivered", len(lat), len(ids))
	}
	return nil
}

// eachSchedule calls fn for 0..n-1, 16 calls at a time, and returns the
// first error.
func eachSchedule(ctx context.Context, n int, fn func(ctx context.Context, i int) error) error {
	var next atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(ctx, i); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		})
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}

// durationOrNil is d on the wire, unset when zero.
func durationOrNil(d time.Duration) *durationpb.Duration {
	if d == 0 {
		return nil
	}
	return durationpb.New(d)
}

// sleepUntil waits until the local time t, or ctx.
func sleepUntil(ctx context.Context, t time.Time) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Until(t)):
		return nil
	}
}

func writeSchedulesReport(cfg Config, rep *SchedulesReport, stdout io.Writer) error {
	if cfg.JSONOut != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(cfg.JSONOut, b, 0o644); err != nil {
			return fmt.Errorf("--json-out: %w", err)
		}
	}
	if cfg.JSON {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if _, err := stdout.Write(append(b, '\n')); err != nil {
			return err
		}
	} else if err := rep.WriteText(stdout); err != nil {
		return err
	}
	if rep.Error != "" {
		return ErrRowsFailed
	}
	return nil
}

// WriteText prints the report for people.
func (r *SchedulesReport) WriteText(w io.Writer) error {
	bw := bufio.NewWriter(w)
	mode := "Redis-only"
	if r.Params.Durable {
		mode = "durable"
	}
	fmt.Fprintf(bw, "schedules: %d (cron \"* * * * *\", jitter %s) over %d namespaces, %s, %d minute slots measured (%s to %s UTC)\n",
		r.Params.Count, r.Params.Jitter, r.Params.Namespaces, mode, len(r.Slots), r.Slots[0].Format("15:04"), r.Slots[len(r.Slots)-1].Format("15:04"))
	fmt.Fprintf(bw, "created in %.1f s; firings expected %d, delivered %d (%d after the window), duplicates %d, missing %d\n",
		r.CreateSeconds, r.Expected, r.Delivered, r.Straggling, r.Duplicates, r.Missing)
	if len(r.Counters) > 0 {
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(r.Counters)) {
			parts = append(parts, fmt.Sprintf("%s %.0f", k, r.Counters[k]))
		}
		fmt.Fprintf(bw, "delayd's schedule counters over the run: %s\n", strings.Join(parts, ", "))
	}
	l, c := r.Lateness, r.Control
	fmt.Fprintf(bw, "firings' lateness (receive by the store's clock − due): p50 %.2f ms, p90 %.2f ms, p99 %.2f ms, max %.2f ms\n", l.P50, l.P90, l.P99, l.Max)
	fmt.Fprintf(bw, "control, %d plain tasks due as one slot's firings: p50 %.2f ms, p90 %.2f ms, p99 %.2f ms, max %.2f ms\n", c.N, c.P50, c.P90, c.P99, c.Max)
	fmt.Fprintf(bw, "Redis calls per firing: %.2f (over the measured minutes, ±30 s)", r.CallsPerFiring)
	var parts []string
	for name, c := range r.RedisCalls {
		if c.Calls >= int64(r.Delivered)/20 {
			parts = append(parts, fmt.Sprintf("%s %d", name, c.Calls))
		}
	}
	if len(parts) > 0 {
		fmt.Fprintf(bw, " [%s]", strings.Join(parts, ", "))
	}
	fmt.Fprintln(bw)
	if len(r.ServerLateness) > 0 {
		var les []string
		for le := range r.ServerLateness {
			les = append(les, le)
		}
		slices.SortFunc(les, func(a, b string) int {
			x, _ := strconv.ParseFloat(a, 64)
			y, _ := strconv.ParseFloat(b, 64)
			return cmp.Compare(x, y)
		})
		var parts []string
		for _, le := range les {
			if f, _ := strconv.ParseFloat(le, 64); f <= 1 {
				parts = append(parts, fmt.Sprintf("≤%ss %.1f%%", le, 100*r.ServerLateness[le]))
			}
		}
		fmt.Fprintf(bw, "delayd's own lateness histogram (pop − due): %s\n", strings.Join(parts, ", "))
	}
	if r.DelaydCPU != "" {
		fmt.Fprintf(bw, "delayd CPU over those minutes: %.2f s (%s)\n", r.DelaydCPUSeconds, r.DelaydCPU)
	}
	fmt.Fprintf(bw, "machine: %d CPUs %s, load %s → %s; clock offset to Redis %s ± %s\n", r.Machine.CPUs, r.Machine.Model,
		r.Machine.LoadAvgStart, r.Machine.LoadAvgEnd, r.Clock.Offset, r.Clock.Uncertainty)
	if r.Error != "" {
		fmt.Fprintf(bw, "ERROR: %s\n", r.Error)
	}
	return bw.Flush()
}
