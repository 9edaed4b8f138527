package bench

import (
	"github.com/delayd/delayd/internal/testkit"

	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"
)

func TestPercentileNearestRank(t *testing.T) {
	t.Parallel()
	// 1..100 ms: the p-th percentile is p ms exactly.
	var s []time.Duration
	for i := 100; i >= 1; i-- {
		s = append(s, time.Duration(i)*time.Millisecond)
	}
	got := Summarize(s)
	want := Summary{N: 100, Min: 1, P50: 50, P90: 90, P99: 99, Max: 100}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("Summarize 1..100 (-want +got):\n%s", d)
	}
	cases := []struct {
		n    int
		p    float64
		want time.Duration
	}{
		{1, 50, 1}, {1, 99, 1},
		{2, 50, 1}, {2, 51, 2},
		{10, 90, 9}, {10, 91, 10},
		{1000, 99, 990}, {1000, 99.9, 999}, {1000, 100, 1000},
	}
	for _, c := range cases {
		sorted := make([]time.Duration, c.n)
		for i := range sorted {
			sorted[i] = time.Duration(i + 1)
		}
		if got := Percentile(sorted, c.p); got != c.want {
			t.Errorf("Percentile(1..%d, %v) = %d, want %d", c.n, c.p, got, c.want)
		}
	}
	if got := Summarize(nil); got != (Summary{}) {
		t.Errorf("Summarize(nil) = %+v, want zero", got)
	}
	// Early deliveries are negative lateness and must stay negative.
	got = Summarize([]time.Duration{-2 * time.Millisecond, time.Millisecond})
	if got.Min != -2 || got.Max != 1 {
		t.Errorf("Summarize with an early sample = %+v, want min -2 max 1", got)
	}
}

func TestTaskIDRoundTrip(t *testing.T) {
	t.Parallel()
	for _, i := range []int{0, 1, 42, 9_999_999} {
		got, ok := ParseTaskID(TaskID(i))
		if !ok || got != i {
			t.Errorf("ParseTaskID(TaskID(%d)) = %d, %v", i, got, ok)
		}
	}
	for _, id := range []string{"", "t", "f1", "t-1", "t01", "tx", "t1 ", "T1"} {
		if _, ok := ParseTaskID(id); ok {
			t.Errorf("ParseTaskID(%q) accepted a foreign id", id)
		}
	}
}

func TestTrackerCountsDuplicatesLossesAndUnknownIDs(t *testing.T) {
	t.Parallel()
	tr := NewTracker(6)
	// Task 0 once, task 1 three times, task 2 twice, tasks 3-5 never;
	// two ids that are no task of the run. Concurrently, as subscribers do.
	ids := []string{"t0", "t1", "t1", "t1", "t2", "t2", "t6", "f0"}
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		go func() { defer wg.Done(); tr.Deliver(id) }()
	}
	wg.Wait()
	want := Tally{Expected: 6, Delivered: 3, Duplicates: 3, Lost: 3, Unknown: 2}
	if d := cmp.Diff(want, tr.Tally()); d != "" {
		t.Fatalf("Tally (-want +got):\n%s", d)
	}
	if tr.Delivered() != 3 {
		t.Errorf("Delivered() = %d, want 3", tr.Delivered())
	}
	if i, n := tr.Deliver("t4"); i != 4 || n != 1 {
		t.Errorf("first delivery of t4 = %d, %d; want 4, 1", i, n)
	}
	if _, n := tr.Deliver("t4"); n != 2 {
		t.Errorf("second delivery of t4 counted %d, want 2", n)
	}
	if _, n := tr.Deliver("nope"); n != 0 {
		t.Errorf("unknown id counted %d, want 0", n)
	}
}

// The sink judges early deliveries by the due time the run assigned, on
// the Redis clock, and keeps the first delivery's lateness.
func TestSinkFlagsEarlyDeliveries(t *testing.T) {
	t.Parallel()
	due := time.UnixMilli(time.Now().UnixMilli())
	sk := &runSink{
		tracker:     NewTracker(3),
		dues:        []int64{due.UnixMilli(), due.UnixMilli(), due.UnixMilli()},
		lateness:    make([]time.Duration, 3),
		clock:       Clock{Offset: 0, Uncertainty: 100 * time.Microsecond},
		earlyWindow: 100 * time.Microsecond,
	}
	sk.delivered("ns", "t0", due.Add(-5*time.Millisecond))  // early
	sk.delivered("ns", "t1", due.Add(-50*time.Microsecond)) // within the clock's uncertainty
	sk.delivered("ns", "t2", due.Add(3*time.Millisecond))
	sk.delivered("ns", "t2", due.Add(9*time.Millisecond)) // a duplicate, later
	if got := sk.early.Load(); got != 1 {
		t.Errorf("early = %d, want 1", got)
	}
	if got := sk.lateness[2]; got != 3*time.Millisecond {
		t.Errorf("lateness of t2 = %v, want the first delivery's 3ms", got)
	}
	if got := sk.tracker.Tally().Duplicates; got != 1 {
		t.Errorf("duplicates = %d, want 1", got)
	}
}

func TestParseProcStat(t *testing.T) {
	t.Parallel()
	// A command name with spaces and parentheses; utime 250, stime 50 ticks.
	line := "1234 (my (weird) cmd) S 1 1234 1234 0 -1 4194560 1000 0 0 0 250 50 0 0 20 0 4 0 100 1000000 500 18446744073709551615"
	got, err := parseProcStat(line)
	if err != nil || got != 3*time.Second {
		t.Fatalf("parseProcStat = %v, %v; want 3s", got, err)
	}
	if _, err := parseProcStat("garbage"); err == nil {
		t.Error("parseProcStat accepted garbage")
	}
	self, err := ProcCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// Burn a little CPU: both readings must move forward.
	s0 := SelfCPU()
	deadline := time.Now().Add(30 * time.Millisecond)
	for x := 0; time.Now().Before(deadline); x++ {
		_ = fmt.Sprint(x)
	}
	if SelfCPU() <= s0 {
		t.Error("SelfCPU did not grow while burning CPU")
	}
	if self < 0 {
		t.Errorf("ProcCPU(self) = %v", self)
	}
}

func TestParseInfo(t *testing.T) {
	t.Parallel()
	got := parseInfo("# Memory\r\nused_memory:1024\r\nused_memory_human:1.00K\r\n\r\n# CPU\r\nused_cpu_sys:1.5\r\n")
	want := map[string]string{"used_memory": "1024", "used_memory_human": "1.00K", "used_cpu_sys": "1.5"}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("parseInfo (-want +got):\n%s", d)
	}
}

// testRedis connects to TEST_REDIS_URL (default the local Redis).
func testRedis(t *testing.T) *redis.Client {
	t.Helper()
	return testkit.Redis(t)
}

func TestRedisProbeAndClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testRedis(t)
	p, err := NewRedisProbe(ctx, rdb)
	if err != nil {
		t.Fatal(err)
	}
	if p.Version == "" {
		t.Error("no redis_version")
	}
	if m, err := p.UsedMemory(ctx); err != nil || m <= 0 {
		t.Errorf("UsedMemory = %d, %v", m, err)
	}
	if c, err := p.CPU(ctx); err != nil || c <= 0 {
		t.Errorf("CPU = %v, %v", c, err)
	}
	c, err := MeasureClock(ctx, rdb, 5)
	if err != nil {
		t.Fatal(err)
	}
	// Redis runs on this host in tests: the same clock, give or take the
	// round trip.
	if c.Uncertainty <= 0 || c.Uncertainty >= time.Second {
		t.Errorf("clock uncertainty %v", c.Uncertainty)
	}
}

func TestWaitLazyFreeReturnsOnceFreed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testRedis(t)
	p, err := NewRedisProbe(ctx, rdb)
	if err != nil {
		t.Fatal(err)
	}
	// A big key unlinked right before: Redis frees it in the background.
	key := "delaybench:{test-" + randomSuffix(6) + "}:big"
	t.Cleanup(func() { rdb.Unlink(context.Background(), key) })
	args := make([]any, 0, 2*20000)
	for i := range 20000 {
		args = append(args, i, fmt.Sprint(i))
	}
	if err := rdb.ZAdd(ctx, key, redisZ(args)...).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Unlink(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitLazyFree(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	info, err := redisInfo(ctx, rdb, "memory")
	if err != nil {
		t.Fatal(err)
	}
	// Other tests may be unlinking too; ours at least is gone.
	if n, _ := rdb.Exists(ctx, key).Result(); n != 0 {
		t.Errorf("key still exists; lazyfree_pending_objects=%s", info["lazyfree_pending_objects"])
	}
}

// redisZ turns score, member pairs into ZAdd members.
func redisZ(pairs []any) []redis.Z {
	z := make([]redis.Z, 0, len(pairs)/2)
	for i := 0; i < len(pairs); i += 2 {
		z = append(z, redis.Z{Score: float64(pairs[i].(int)), Member: pairs[i+1]})
	}
	return z
}

// fakeSystem delivers what was upserted, once each, except that it
// delivers task 0 twice and never delivers task 1: the harness must count
// exactly that. It tests delaybench's own accounting, not a store.
type fakeSystem struct {
	mu    sync.Mutex
	items []item
}

func (f *fakeSystem) name() string                          { return "fake" }
func (f *fakeSystem) setup(context.Context, []string) error { return nil }
func (f *fakeSystem) upsert(_ context.Context, _ string, items []item, _ []byte, _ bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.items = append(f.items, items...)
	return nil
}
func (f *fakeSystem) consume(ctx context.Context, _ []string, _, _ int, s sink) (func(), error) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.mu.Lock()
		items := append([]item(nil), f.items...)
		f.mu.Unlock()
		for _, it := range items {
			switch it.id {
			case "t1":
				continue
			case "t0":
				s.delivered("ns", it.id, time.Now())
			}
			s.delivered("ns", it.id, time.Now())
			s.acked(1, 0, time.Now())
		}
	}()
	return func() { <-done }, nil
}
func (f *fakeSystem) cpu() (time.Duration, string, bool)      { return 0, "", false }
func (f *fakeSystem) pid() int                                { return 0 }
func (f *fakeSystem) cleanup(context.Context, []string) error { return nil }

func TestRunCountsDuplicatesAndLossesAsViolations(t *testing.T) {
	t.Parallel()
	w := Workload{Name: "fake", Tasks: 10, Backlog: true, Stall: 200 * time.Millisecond, Grace: 10 * time.Millisecond}
	res := runWorkload(context.Background(), env{}, &fakeSystem{}, w)
	if res.Delivered != 9 || res.Duplicates != 1 || res.Lost != 1 {
		t.Fatalf("tally %+v, want 9 delivered, 1 duplicate, 1 lost", res.Tally)
	}
	if res.Violations != "0 early, 1 duplicate, 1 lost, 0 unknown deliveries" {
		t.Errorf("violations %q", res.Violations)
	}
	if res.Error == "" {
		t.Error("a lost task must end the run as stalled")
	}
	if res.Lateness.N != 9 {
		t.Errorf("lateness over %d tasks, want the 9 delivered", res.Lateness.N)
	}
}
