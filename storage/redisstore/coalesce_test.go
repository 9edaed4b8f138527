package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
)

// scriptGate is a go-redis hook that counts script calls (FCALL, FCALL_RO;
// EVALSHA, EVAL)
// and can hold the first one until released, so a test can queue Upsert
// calls behind a script call in flight.
type scriptGate struct {
	calls   atomic.Int64
	hold    chan struct{} // nil: never hold
	held    chan struct{} // closed when the first call is held
	once    sync.Once
	release sync.Once
}

func newScriptGate(hold bool) *scriptGate {
	g := &scriptGate{held: make(chan struct{})}
	if hold {
		g.hold = make(chan struct{})
	}
	return g
}

func (g *scriptGate) open() { g.release.Do(func() { close(g.hold) }) }

func (g *scriptGate) DialHook(next redis.DialHook) redis.DialHook { return next }
func (g *scriptGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isScriptCall(cmd.Name()) {
			if g.calls.Add(1) == 1 && g.hold != nil {
				g.once.Do(func() { close(g.held) })
				<-g.hold
			}
		}
		return next(ctx, cmd)
	}
}

// isScriptCall reports whether a command runs an entry of the library.
func isScriptCall(name string) bool {
	switch name {
	case "fcall", "fcall_ro", "evalsha", "eval":
		return true
	}
	return false
}

func (g *scriptGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// queued returns how many Upsert calls of ns wait behind a script call.
func queued(s *Store, ns string) int {
	return s.co.queued(coKey{ns: ns})
}

// waitQueued waits until n calls of ns are queued.
func waitQueued(t *testing.T, s *Store, ns string, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for queued(s, ns) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls queued, want %d", queued(s, ns), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// loadScripts loads the library so a later call is one FCALL.
func loadScripts(t *testing.T, s *Store) {
	t.Helper()
	if err := s.LoadLibrary(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// upsertOut is one caller's answer.
type upsertOut struct {
	res []storage.UpsertResult
	err error
}

// queueCalls holds the script call of calls[0], then queues calls[1:] in
// order behind it, releases it and returns every caller's answer.
func queueCalls(t *testing.T, s *Store, g *scriptGate, ns string, calls [][]storage.UpsertSpec) []upsertOut {
	t.Helper()
	out := make([]upsertOut, len(calls))
	var wg sync.WaitGroup
	for i, specs := range calls {
		wg.Go(func() {
			out[i].res, out[i].err = s.Upsert(context.Background(), ns, specs)
		})
		if i == 0 {
			<-g.held
		} else {
			waitQueued(t, s, ns, i)
		}
	}
	g.open()
	wg.Wait()
	return out
}

// TestUpsertCoalesces: unary upserts queued behind one in flight go out
// together in one script call, each caller getting its own results (with
// Earliest as if the calls had run one by one in arrival order).
func TestUpsertCoalesces(t *testing.T) {
	t.Parallel()
	loadScripts(t, New(testRedisClient(t), Options{}))
	c := testRedisClient(t)
	g := newScriptGate(true)
	c.AddHook(g)
	s := New(c, Options{})
	ns := testkit.Namespace(t, "co")
	dropNS(t, s, ns)

	const n = 100
	base := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	calls := make([][]storage.UpsertSpec, n)
	wantEarliest := make([]bool, n)
	for i := range calls {
		due := base.Add(time.Duration(2000+i) * time.Second) // later than all: not earliest
		switch {
		case i == 0:
			due = base.Add(1000 * time.Second)
			wantEarliest[i] = true
		case i%2 == 1:
			due = base.Add(time.Duration(1000-i) * time.Second) // each earlier than all before
			wantEarliest[i] = true
		}
		calls[i] = []storage.UpsertSpec{{ID: fmt.Sprintf("t%03d", i), Kind: "k", Payload: []byte(fmt.Sprint(i)), DueTime: due}}
	}
	calls[n-1] = append(calls[n-1], storage.UpsertSpec{ID: "extra", DueTime: base}) // a two-spec call
	out := queueCalls(t, s, g, ns, calls)

	if got := g.calls.Load(); got != 2 {
		t.Errorf("%d upserts made %d script calls, want 2 (one alone, then the queue)", n, got)
	}
	for i, o := range out {
		if o.err != nil {
			t.Fatalf("call %d: %v", i, o.err)
		}
		if len(o.res) != len(calls[i]) {
			t.Fatalf("call %d: %d results for %d specs", i, len(o.res), len(calls[i]))
		}
		r := o.res[0]
		sp := calls[i][0]
		if r.Task.ID != sp.ID || string(r.Task.Payload) != string(sp.Payload) || !r.Task.DueTime.Equal(sp.DueTime) ||
			!r.Created || r.Stale || r.Task.Generation != 1 || r.Task.Namespace != ns {
			t.Errorf("call %d: result %+v for spec %+v", i, r, sp)
		}
		if r.Earliest != wantEarliest[i] {
			t.Errorf("call %d: Earliest = %v, want %v", i, r.Earliest, wantEarliest[i])
		}
	}
	if last := out[n-1].res[1]; last.Task.ID != "extra" || !last.Earliest || !last.Created {
		t.Errorf("second spec of the last call: %+v", last)
	}
	for i, sp := range calls {
		got, err := s.Get(context.Background(), ns, sp[0].ID)
		if err != nil || string(got.Payload) != string(sp[0].Payload) {
			t.Errorf("stored %d: %+v, %v", i, got, err)
		}
	}
	if q := queued(s, ns); q != 0 || !s.co.idle() {
		t.Errorf("coalescer not idle after: %d queued", q)
	}
}

// TestUpsertCoalesceGenerations: given generations, stale specs and bumps
// from different queued calls of one id apply in arrival order.
func TestUpsertCoalesceGenerations(t *testing.T) {
	t.Parallel()
	loadScripts(t, New(testRedisClient(t), Options{}))
	c := testRedisClient(t)
	g := newScriptGate(true)
	c.AddHook(g)
	s := New(c, Options{})
	ns := testkit.Namespace(t, "cog")
	dropNS(t, s, ns)

	calls := [][]storage.UpsertSpec{
		{{ID: "g", Payload: []byte("a")}},                                           // created, gen 1 (alone)
		{{ID: "g", Payload: []byte("b"), Generation: 10}},                           // gen 10
		{{ID: "g", Payload: []byte("c"), Generation: 5}},                            // stale: stored gen 10
		{{ID: "g", Payload: []byte("d")}},                                           // bump: gen 11
		{{ID: "h", Generation: 3}, {ID: "g", Generation: 11, Payload: []byte("e")}}, // created gen 3; equal gen: replaced
		{{ID: "h", Generation: 2}},                                                  // stale
	}
	out := queueCalls(t, s, g, ns, calls)
	type want struct {
		gen            int64
		created, stale bool
		payload        string
	}
	wants := [][]want{
		{{1, true, false, "a"}},
		{{10, false, false, "b"}},
		{{10, false, true, "b"}},
		{{11, false, false, "d"}},
		{{3, true, false, ""}, {11, false, false, "e"}},
		{{3, false, true, ""}},
	}
	for i, o := range out {
		if o.err != nil {
			t.Fatalf("call %d: %v", i, o.err)
		}
		for j, w := range wants[i] {
			r := o.res[j]
			if r.Task.Generation != w.gen || r.Created != w.created || r.Stale != w.stale || string(r.Task.Payload) != w.payload {
				t.Errorf("call %d spec %d: gen %d created %v stale %v payload %q, want %+v",
					i, j, r.Task.Generation, r.Created, r.Stale, r.Task.Payload, w)
			}
		}
	}
	if got, err := s.Get(context.Background(), ns, "g"); err != nil || got.Generation != 11 || string(got.Payload) != "e" {
		t.Errorf("stored g: %+v, %v", got, err)
	}
}

// TestUpsertCoalesceSameID: many goroutines upserting one id end with one
// generation per upsert, each caller seeing a distinct one, and the stored
// task being the one that got the last.
func TestUpsertCoalesceSameID(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]*redis.Client{"redis": testRedisClient(t), "miniredis": testMiniClient(t)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := New(c, Options{})
			ns := testkit.Namespace(t, "cos")
			dropNS(t, s, ns)
			const n = 64
			gens := make([]int64, n)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range n {
				wg.Go(func() {
					<-start
					res, err := s.Upsert(context.Background(), ns, []storage.UpsertSpec{{ID: "same", Payload: []byte(fmt.Sprint(i))}})
					if err != nil {
						t.Error(err)
						return
					}
					if string(res[0].Task.Payload) != fmt.Sprint(i) {
						t.Errorf("caller %d got payload %q", i, res[0].Task.Payload)
					}
					gens[i] = res[0].Task.Generation
				})
			}
			close(start)
			wg.Wait()
			seen := make(map[int64]int)
			for i, gen := range gens {
				seen[gen] = i
			}
			for gen := int64(1); gen <= n; gen++ {
				if _, ok := seen[gen]; !ok {
					t.Errorf("no caller got generation %d: %v", gen, gens)
				}
			}
			got, err := s.Get(context.Background(), ns, "same")
			if err != nil {
				t.Fatal(err)
			}
			if got.Generation != n || string(got.Payload) != fmt.Sprint(seen[n]) {
				t.Errorf("stored generation %d payload %q, want %d and %q", got.Generation, got.Payload, n, fmt.Sprint(seen[n]))
			}
		})
	}
}

// TestUpsertCoalesceContextEnds: a queued call whose context ends returns
// its error (ErrUnavailable for a deadline) and is not written; the calls
// around it are.
func TestUpsertCoalesceContextEnds(t *testing.T) {
	t.Parallel()
	loadScripts(t, New(testRedisClient(t), Options{}))
	c := testRedisClient(t)
	g := newScriptGate(true)
	c.AddHook(g)
	s := New(c, Options{})
	ns := testkit.Namespace(t, "coc")
	dropNS(t, s, ns)

	var wg sync.WaitGroup
	var first, last error
	wg.Go(func() { _, first = s.Upsert(context.Background(), ns, []storage.UpsertSpec{{ID: "first"}}) })
	<-g.held
	cctx, cancel := context.WithCancel(context.Background())
	var canceled, timedOut error
	wg.Go(func() { _, canceled = s.Upsert(cctx, ns, []storage.UpsertSpec{{ID: "canceled"}}) })
	waitQueued(t, s, ns, 1)
	dctx, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	wg.Go(func() { _, timedOut = s.Upsert(dctx, ns, []storage.UpsertSpec{{ID: "timedout"}}) })
	waitQueued(t, s, ns, 2)
	wg.Go(func() { _, last = s.Upsert(context.Background(), ns, []storage.UpsertSpec{{ID: "last"}}) })
	waitQueued(t, s, ns, 3)
	cancel()
	<-dctx.Done()
	waitQueued(t, s, ns, 1) // both gave up and left
	g.open()
	wg.Wait()

	if first != nil || last != nil {
		t.Fatalf("calls around: %v, %v", first, last)
	}
	if !errors.Is(canceled, context.Canceled) || errors.Is(canceled, storage.ErrUnavailable) {
		t.Errorf("canceled call: %v, want context.Canceled", canceled)
	}
	if !errors.Is(timedOut, storage.ErrUnavailable) {
		t.Errorf("timed-out call: %v, want ErrUnavailable", timedOut)
	}
	for id, want := range map[string]bool{"first": true, "canceled": false, "timedout": false, "last": true} {
		_, err := s.Get(context.Background(), ns, id)
		if got := err == nil; got != want || (err != nil && !errors.Is(err, storage.ErrNotFound)) {
			t.Errorf("%s stored = %v (%v), want %v", id, got, err, want)
		}
	}
	if !s.co.idle() {
		t.Errorf("coalescer not idle")
	}
}

// TestUpsertCoalesceRedisDown: when Redis goes away under a shared script
// call, every caller of it gets ErrUnavailable, and no goroutine is left
// (TestMain checks leaks).
func TestUpsertCoalesceRedisDown(t *testing.T) {
	t.Parallel()
	srv := testkit.StartRedis(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	s := New(c, Options{Timeout: 2 * time.Second})
	loadScripts(t, s)
	g := newScriptGate(true)
	c.AddHook(g)
	ns := testkit.Namespace(t, "cod")

	const n = 20
	calls := make([][]storage.UpsertSpec, n)
	for i := range calls {
		calls[i] = []storage.UpsertSpec{{ID: fmt.Sprint(i)}}
	}
	out := make([]upsertOut, n)
	var wg sync.WaitGroup
	for i, specs := range calls {
		wg.Go(func() { out[i].res, out[i].err = s.Upsert(context.Background(), ns, specs) })
		if i == 0 {
			<-g.held
		}
	}
	waitQueued(t, s, ns, n-1)
	srv.Kill()
	g.open()
	wg.Wait()
	for i, o := range out {
		if !errors.Is(o.err, storage.ErrUnavailable) || o.res != nil {
			t.Errorf("call %d: %v, %v, want ErrUnavailable", i, o.res, o.err)
		} else if strings.Contains(o.err.Error(), "coalesc") {
			t.Errorf("call %d: %v", i, o.err)
		}
	}
	if got := g.calls.Load(); got > 3 {
		t.Errorf("%d script calls for one held call and one queue", got)
	}
}

// TestUpsertNoCoalesce: with NoCoalesce every call is its own script call.
func TestUpsertNoCoalesce(t *testing.T) {
	t.Parallel()
	loadScripts(t, New(testRedisClient(t), Options{}))
	c := testRedisClient(t)
	g := newScriptGate(false)
	c.AddHook(g)
	s := New(c, Options{NoCoalesce: true})
	ns := testkit.Namespace(t, "con")
	dropNS(t, s, ns)
	const n = 20
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if _, err := s.Upsert(context.Background(), ns, []storage.UpsertSpec{{ID: fmt.Sprint(i)}}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if got := g.calls.Load(); got != n {
		t.Errorf("%d calls made %d script calls, want %d", n, got, n)
	}
}

// TestAckCoalesces (issue 25 item 3): acks queued behind one in flight —
// from different streams and AckTasks calls of a replica — go out together
// in one script call, each caller getting the statuses of its own tokens:
// OK for a delivery in flight, NOT_FOUND for one acked by an earlier call
// of the same batch.
func TestAckCoalesces(t *testing.T) {
	t.Parallel()
	setup := New(testRedisClient(t), Options{})
	loadScripts(t, setup)
	ns := testkit.Namespace(t, "coack")
	dropNS(t, setup, ns)
	const n = 40
	specs := make([]storage.UpsertSpec, n)
	for i := range specs {
		specs[i] = storage.UpsertSpec{ID: fmt.Sprintf("t%03d", i), Delay: -time.Minute}
	}
	ctx := context.Background()
	if _, err := setup.Upsert(ctx, ns, specs); err != nil {
		t.Fatal(err)
	}
	dels, err := setup.Pop(ctx, ns, storage.PopParams{Limit: n, LeaseFor: time.Hour})
	if err != nil || len(dels) != n {
		t.Fatalf("pop: %d, %v", len(dels), err)
	}

	c := testRedisClient(t)
	g := newScriptGate(true)
	c.AddHook(g)
	s := New(c, Options{})
	key := settleKey{ns: ns}
	// calls[i] acks delivery i; the last call acks delivery 1 again.
	calls := make([][]storage.Token, n)
	for i := range calls {
		calls[i] = []storage.Token{dels[i].Token}
	}
	calls[n-1] = append(calls[n-1], dels[1].Token)
	type ackOut struct {
		st  []storage.TokenStatus
		err error
	}
	out := make([]ackOut, n)
	var wg sync.WaitGroup
	for i, toks := range calls {
		wg.Go(func() { out[i].st, out[i].err = s.Ack(ctx, ns, toks) })
		if i == 0 {
			<-g.held
			continue
		}
		deadline := time.Now().Add(20 * time.Second)
		for s.settles.queued(key) != i {
			if time.Now().After(deadline) {
				t.Fatalf("%d acks queued, want %d", s.settles.queued(key), i)
			}
			time.Sleep(time.Millisecond)
		}
	}
	g.open()
	wg.Wait()

	if got := g.calls.Load(); got != 2 {
		t.Errorf("%d acks made %d script calls, want 2 (one alone, then the queue)", n, got)
	}
	for i, o := range out {
		if o.err != nil {
			t.Fatalf("call %d: %v", i, o.err)
		}
		if len(o.st) != len(calls[i]) || o.st[0] != storage.TokenOK {
			t.Errorf("call %d: statuses %v, want OK", i, o.st)
		}
	}
	if st := out[n-1].st; len(st) == 2 && st[1] != storage.TokenNotFound {
		t.Errorf("delivery 1 acked again in the same batch: %v, want NOT_FOUND", st[1])
	}
	if !s.settles.idle() {
		t.Error("settle queues not idle after")
	}
	stats, err := setup.Stats(ctx, ns)
	if err != nil || stats.Delivered != 0 || stats.Scheduled != 0 {
		t.Errorf("after the acks: %+v, %v; want nothing left", stats, err)
	}
}

// With Options.AckLinger, an ack that finds nothing in flight waits for
// the acks that arrive meanwhile and they share its script call (at a
// trickle acks would otherwise make one script call each); a lingering
// call whose context ends leaves unapplied and the others still go out.
func TestAckLingerJoins(t *testing.T) {
	t.Parallel()
	setup := New(testRedisClient(t), Options{})
	loadScripts(t, setup)
	ns := testkit.Namespace(t, "coackl")
	dropNS(t, setup, ns)
	const n = 4
	specs := make([]storage.UpsertSpec, n)
	for i := range specs {
		specs[i] = storage.UpsertSpec{ID: fmt.Sprintf("t%d", i), Delay: -time.Minute}
	}
	ctx := context.Background()
	if _, err := setup.Upsert(ctx, ns, specs); err != nil {
		t.Fatal(err)
	}
	dels, err := setup.Pop(ctx, ns, storage.PopParams{Limit: n, LeaseFor: time.Hour})
	if err != nil || len(dels) != n {
		t.Fatalf("pop: %d, %v", len(dels), err)
	}

	c := testRedisClient(t)
	g := newScriptGate(false)
	c.AddHook(g)
	// Long enough that the test queues every call before it ends (the
	// wait is a bound on a loaded machine, not a measured time).
	s := New(c, Options{AckLinger: 2 * time.Second})
	key := settleKey{ns: ns}
	cctx, cancel := context.WithCancel(ctx)
	out := make([][]storage.TokenStatus, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		callCtx := ctx
		if i == 0 {
			callCtx = cctx // the leader gives up while it lingers
		}
		wg.Go(func() { out[i], errs[i] = s.Ack(callCtx, ns, []storage.Token{dels[i].Token}) })
		deadline := time.Now().Add(20 * time.Second)
		for s.settles.queued(key) != i+1 {
			if time.Now().After(deadline) {
				t.Fatalf("%d acks queued, want %d", s.settles.queued(key), i+1)
			}
			time.Sleep(time.Millisecond)
		}
	}
	if g.calls.Load() != 0 {
		t.Fatalf("a lingering ack made a script call before the linger ended")
	}
	cancel()
	wg.Wait()
	if !errors.Is(errs[0], context.Canceled) {
		t.Errorf("the cancelled leader: %v, want context.Canceled", errs[0])
	}
	for i := 1; i < n; i++ {
		if errs[i] != nil || len(out[i]) != 1 || out[i][0] != storage.TokenOK {
			t.Errorf("ack %d = %v, %v; want OK", i, out[i], errs[i])
		}
	}
	if got := g.calls.Load(); got != 1 {
		t.Errorf("%d lingering acks made %d script calls, want 1", n-1, got)
	}
	// The cancelled call was not applied: its delivery is still leased.
	// A lone ack goes out when its linger ends.
	st, err := s.Ack(ctx, ns, []storage.Token{dels[0].Token})
	if err != nil || st[0] != storage.TokenOK {
		t.Errorf("ack of the cancelled call's delivery afterwards = %v, %v; want OK (not applied before)", st, err)
	}
	if got := g.calls.Load(); got != 2 {
		t.Errorf("%d script calls after a lone ack, want 2", got)
	}
}
