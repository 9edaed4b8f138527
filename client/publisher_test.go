package client_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/daemon"
	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
)

// outcome is what a caller of Upsert can tell about its answer, with the
// namespace's name taken out of messages (each side of the comparison has
// its own namespace).
type outcome struct {
	Code     codes.Code
	Message  string
	Created  bool
	Gen      int64
	Conflict *conflictView
}

type conflictView struct {
	Exists                        bool
	Generation, Expected          int64
	HasIncarnation, ExpectedInc   bool
	TaskID                        string
	TaskGeneration                int64
	TaskHasIncarnation, TaskFound bool
}

var (
	stamps     = regexp.MustCompile(`\d{4}-\d\d-\d\dT[0-9:.]+Z`)
	bigNumbers = regexp.MustCompile(`\d{6,}`)
)

func outcomeOf(ns string, r *client.UpsertResult, err error) outcome {
	if err == nil {
		return outcome{Created: r.Created, Gen: r.Task.Generation}
	}
	st, _ := status.FromError(err)
	// Times and incarnations differ between the two namespaces' tasks.
	msg := stamps.ReplaceAllString(strings.ReplaceAll(err.Error(), ns, "NS"), "TIME")
	o := outcome{Code: st.Code(), Message: bigNumbers.ReplaceAllString(msg, "N")}
	if cf, ok := client.ConflictOf(err); ok {
		v := &conflictView{Exists: cf.Exists, Generation: cf.Generation, Expected: cf.Expected,
			HasIncarnation: cf.Incarnation != 0, ExpectedInc: cf.ExpectedIncarnation != 0, TaskFound: cf.Task != nil}
		if cf.Task != nil {
			v.TaskID, v.TaskGeneration, v.TaskHasIncarnation = cf.Task.ID, cf.Task.Generation, cf.Task.Incarnation != 0
		}
		o.Conflict = v
	}
	return o
}

// batchCounter counts the items of every BatchUpsertTasks and the
// UpsertTask calls a Client sends.
type batchCounter struct {
	mu      sync.Mutex
	batches []int
	unary   int
	removes []int // ids per RemoveTasks
	remove  int   // RemoveTask calls
}

func (b *batchCounter) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	b.mu.Lock()
	switch r := req.(type) {
	case *delaydv1.BatchUpsertTasksRequest:
		b.batches = append(b.batches, len(r.GetTasks()))
	case *delaydv1.UpsertTaskRequest:
		b.unary++
	case *delaydv1.RemoveTasksRequest:
		b.removes = append(b.removes, len(r.GetIds()))
	case *delaydv1.RemoveTaskRequest:
		b.remove++
	}
	b.mu.Unlock()
	return invoker(ctx, method, req, reply, cc, opts...)
}

// Every answer an Upsert can get is the same whether the call went alone
// (batching off: UpsertTask) or inside a batch with others
// (BatchUpsertTasks): successes, per-item validation errors, AlreadyExists
// and FailedPrecondition with what ConflictOf reads.
func TestBatchedUpsertAnswersAsUnary(t *testing.T) {
	t.Parallel()
	srv := startDelayd(t, "127.0.0.1:0")
	far := time.Now().Add(400 * 24 * time.Hour)
	cases := []struct {
		name string
		spec client.TaskSpec
	}{
		{"create", client.TaskSpec{ID: "new-1", Kind: "k", Payload: []byte("p"), When: client.After(time.Hour)}},
		{"replace", client.TaskSpec{ID: "seed-replace", When: client.After(time.Hour)}},
		{"id with slash", client.TaskSpec{ID: "bad/id", When: client.After(time.Hour)}},
		{"empty id", client.TaskSpec{ID: "", When: client.After(time.Hour)}},
		{"id too long", client.TaskSpec{ID: strings.Repeat("a", 129), When: client.After(time.Hour)}},
		{"kind not printable", client.TaskSpec{ID: "kind-1", Kind: "a\x01b", When: client.After(time.Hour)}},
		{"payload over the limit", client.TaskSpec{ID: "big-1", Payload: make([]byte, 64<<10+1), When: client.After(time.Hour)}},
		{"beyond the horizon", client.TaskSpec{ID: "far-1", When: client.At(far)}},
		{"create-only, exists", client.TaskSpec{ID: "seed-dup", When: client.After(time.Hour), CreateOnly: true}},
		{"create-only, new", client.TaskSpec{ID: "fresh-1", When: client.After(time.Hour), CreateOnly: true}},
		{"if-generation, other generation", client.TaskSpec{ID: "seed-cas", When: client.After(time.Hour), IfGeneration: 5}},
		{"if-generation and incarnation, other", client.TaskSpec{ID: "seed-cas2", When: client.After(time.Hour), IfGeneration: 1, IfIncarnation: 1}},
		{"if-generation, no task", client.TaskSpec{ID: "missing-1", When: client.After(time.Hour), IfGeneration: 1}},
		{"if-generation, matches", client.TaskSpec{ID: "seed-ok", When: client.After(time.Hour), IfGeneration: 1}},
		{"create-only with if-generation", client.TaskSpec{ID: "both-1", When: client.After(time.Hour), CreateOnly: true, IfGeneration: 1}},
		{"if-incarnation alone", client.TaskSpec{ID: "inc-1", When: client.After(time.Hour), IfIncarnation: 3}},
		{"negative if-generation", client.TaskSpec{ID: "neg-1", When: client.After(time.Hour), IfGeneration: -1}},
	}
	seed := func(c *client.Client, ns string) {
		t.Helper()
		for _, id := range []string{"seed-replace", "seed-dup", "seed-cas", "seed-cas2", "seed-ok"} {
			if _, err := c.Upsert(t.Context(), ns, client.TaskSpec{ID: id, When: client.After(time.Hour)}); err != nil {
				t.Fatalf("seed %s: %v", id, err)
			}
		}
	}

	// Unary: batching off, one call at a time.
	unary := newClient(t, srv.addr(), client.WithBatching(client.BatchSettings{Disabled: true}))
	nsU := namespace(t, unary)
	seed(unary, nsU)
	want := make([]outcome, len(cases))
	for i, tc := range cases {
		r, err := unary.Upsert(t.Context(), nsU, tc.spec)
		want[i] = outcomeOf(nsU, r, err)
	}

	// Batched: a batch leaves only when it holds every case, so all of
	// them travel in one BatchUpsertTasks.
	var count batchCounter
	batched := newClient(t, srv.addr(),
		client.WithBatching(client.BatchSettings{Linger: time.Hour, MaxCount: len(cases), MaxBytes: 1 << 20}),
		client.WithDialOptions(grpc.WithChainUnaryInterceptor(count.intercept)))
	nsB := namespace(t, batched)
	seed(unary, nsB)
	got := make([]outcome, len(cases))
	var wg sync.WaitGroup
	for i, tc := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := batched.Upsert(t.Context(), nsB, tc.spec)
			got[i] = outcomeOf(nsB, r, err)
		}()
	}
	wg.Wait()
	if !cmp.Equal(count.batches, []int{len(cases)}) || count.unary != 0 {
		t.Fatalf("sent batches of %v items and %d UpsertTask calls; want one batch of %d", count.batches, count.unary, len(cases))
	}
	for i, tc := range cases {
		if diff := cmp.Diff(want[i], got[i]); diff != "" {
			t.Errorf("%s: batched answer differs from unary (-unary +batched):\n%s", tc.name, diff)
		}
	}
	// The table holds each kind of answer.
	seen := map[codes.Code]bool{}
	for _, o := range want {
		seen[o.Code] = true
	}
	for _, c := range []codes.Code{codes.OK, codes.InvalidArgument, codes.AlreadyExists, codes.FailedPrecondition} {
		if !seen[c] {
			t.Errorf("no case answered %v unary; the table no longer covers it", c)
		}
	}
}

// Every answer a Remove can get is the same whether it went alone
// (RemoveTask) or in a RemoveTasks with others: removed with the state the
// task was in, not removed, and (through the fallback to one call each)
// InvalidArgument naming the id; a RemoveIf goes alone.
func TestBatchedRemoveAnswersAsUnary(t *testing.T) {
	t.Parallel()
	srv := startDelayd(t, "127.0.0.1:0")
	type answer struct {
		Code          codes.Code
		Message       string
		Removed       bool
		PreviousState client.State
	}
	seed := func(c *client.Client, ns string) {
		t.Helper()
		for _, id := range []string{"seed-1", "seed-2", "seed-3", "seed-if"} {
			if _, err := c.Upsert(t.Context(), ns, client.TaskSpec{ID: id, When: client.After(time.Hour)}); err != nil {
				t.Fatalf("seed %s: %v", id, err)
			}
		}
	}
	type call struct {
		id   string
		cond bool // RemoveIf at generation 1
	}
	run := func(c *client.Client, ns string, calls []call, concurrent bool) []answer {
		out := make([]answer, len(calls))
		do := func(i int) {
			var r client.RemoveResult
			var err error
			if calls[i].cond {
				r, err = c.RemoveIf(t.Context(), ns, calls[i].id, client.Version{Generation: 1})
			} else {
				r, err = c.Remove(t.Context(), ns, calls[i].id)
			}
			st, _ := status.FromError(err)
			out[i] = answer{Code: st.Code(), Removed: r.Removed, PreviousState: r.PreviousState}
			if err != nil {
				out[i].Message = strings.ReplaceAll(err.Error(), ns, "NS")
			}
		}
		var wg sync.WaitGroup
		for i := range calls {
			if !concurrent {
				do(i)
				continue
			}
			wg.Add(1)
			go func() { defer wg.Done(); do(i) }()
		}
		wg.Wait()
		return out
	}
	valid := []call{{id: "seed-1"}, {id: "missing-1"}, {id: "seed-2"}, {id: "missing-2"}}
	invalid := []call{{id: "seed-3"}, {id: "bad/id"}, {id: ""}, {id: "missing-3"}}

	unary := newClient(t, srv.addr(), client.WithBatching(client.BatchSettings{Disabled: true}))
	nsU := namespace(t, unary)
	seed(unary, nsU)
	want := append(run(unary, nsU, valid, false), run(unary, nsU, invalid, false)...)
	want = append(want, run(unary, nsU, []call{{id: "seed-if", cond: true}}, false)...)

	var count batchCounter
	batched := newClient(t, srv.addr(),
		client.WithBatching(client.BatchSettings{Linger: time.Hour, MaxCount: len(valid)}),
		client.WithDialOptions(grpc.WithChainUnaryInterceptor(count.intercept)))
	nsB := namespace(t, batched)
	seed(unary, nsB)
	got := run(batched, nsB, valid, true)
	if !cmp.Equal(count.removes, []int{len(valid)}) || count.remove != 0 {
		t.Fatalf("sent RemoveTasks of %v ids and %d RemoveTask calls; want one RemoveTasks of %d", count.removes, count.remove, len(valid))
	}
	got = append(got, run(batched, nsB, invalid, true)...)
	if !cmp.Equal(count.removes, []int{len(valid), len(invalid)}) || count.remove != len(invalid) {
		t.Fatalf("sent RemoveTasks of %v ids and %d RemoveTask calls; want a refused RemoveTasks of %d, then one RemoveTask each", count.removes, count.remove, len(invalid))
	}
	got = append(got, run(batched, nsB, []call{{id: "seed-if", cond: true}}, true)...)
	if count.remove != len(invalid)+1 {
		t.Fatalf("RemoveIf was not sent as its own RemoveTask (%d RemoveTask calls)", count.remove)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("batched answers differ from unary (-unary +batched):\n%s", diff)
	}
	if !want[0].Removed || want[0].PreviousState != client.StateScheduled || want[1].Removed || want[5].Code != codes.InvalidArgument {
		t.Fatalf("unary answers %+v; the table no longer covers removed, missing and invalid", want)
	}
}

// A call that fails as a whole (an invalid namespace) fails every caller
// in the batch as the unary call fails.
func TestBatchedUpsertWholeCallError(t *testing.T) {
	t.Parallel()
	srv := startDelayd(t, "127.0.0.1:0")
	spec := func(i int) client.TaskSpec {
		return client.TaskSpec{ID: fmt.Sprintf("t-%d", i), When: client.After(time.Hour)}
	}
	unary := newClient(t, srv.addr(), client.WithBatching(client.BatchSettings{Disabled: true}))
	_, uerr := unary.Upsert(t.Context(), "Bad NS", spec(0))
	var count batchCounter
	batched := newClient(t, srv.addr(), client.WithBatching(client.BatchSettings{Linger: time.Hour, MaxCount: 3}),
		client.WithDialOptions(grpc.WithChainUnaryInterceptor(count.intercept)))
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = batched.Upsert(t.Context(), "Bad NS", spec(0+i))
		}()
	}
	wg.Wait()
	if !cmp.Equal(count.batches, []int{3}) {
		t.Fatalf("batches %v; want one of 3", count.batches)
	}
	for i, err := range errs {
		w := strings.Replace(uerr.Error(), "t-0", fmt.Sprintf("t-%d", i), 1)
		if status.Code(err) != status.Code(uerr) || err.Error() != w {
			t.Errorf("caller %d: %v; want as unary: %v", i, err, w)
		}
	}
}

// Calls for one id keep their order through the batcher, whichever way they
// are sent: the last one made is what is stored, and a Remove made after
// an Upsert of the same id removes it.
func TestBatchedCallsKeepOrderPerID(t *testing.T) {
	t.Parallel()
	srv := startDelayd(t, "127.0.0.1:0")
	c := newClient(t, srv.addr())
	ns := namespace(t, c)
	const writers, rounds = 8, 30
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("w-%d", w)
			for r := range rounds {
				if _, err := c.Upsert(t.Context(), ns, client.TaskSpec{ID: id, Payload: []byte(fmt.Sprint(r)), When: client.After(time.Hour)}); err != nil {
					t.Errorf("upsert %s round %d: %v", id, r, err)
					return
				}
			}
			if r, err := c.Remove(t.Context(), ns, id); err != nil || !r.Removed {
				t.Errorf("remove %s after its upserts = %+v, %v; want removed", id, r, err)
			}
			if _, err := c.Upsert(t.Context(), ns, client.TaskSpec{ID: id, Payload: []byte("last"), When: client.After(time.Hour)}); err != nil {
				t.Errorf("last upsert %s: %v", id, err)
			}
		}()
	}
	wg.Wait()
	for w := range writers {
		got, err := c.Get(t.Context(), ns, fmt.Sprintf("w-%d", w))
		if err != nil || string(got.Payload) != "last" || got.Generation != 1 {
			t.Errorf("w-%d = %+v, %v; want the last upsert, at generation 1 of a new life", w, got, err)
		}
	}
}

// A server run with a lower --max-batch than the publisher's MaxCount
// refuses a coalesced batch as a whole (InvalidArgument naming tasks).
// None of its calls was wrong: each is sent again alone and gets the
// answer a lone UpsertTask gives it, so every valid Upsert succeeds (the
// BatchSettings promise). Before, all 40 callers got the batch's error.
func TestBatchRefusedWholeIsSentOneByOne(t *testing.T) {
	t.Parallel()
	var cfg daemon.Config
	cfg.Limits.MaxBatch = 5 // --max-batch 5
	srv := startDelaydWith(t, cfg)
	var count batchCounter
	c := newClient(t, srv.addr(),
		client.WithBatching(client.BatchSettings{Linger: time.Hour, MaxCount: 40}),
		client.WithDialOptions(grpc.WithChainUnaryInterceptor(count.intercept)))
	ns := namespace(t, c)
	const n = 40
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = c.Upsert(t.Context(), ns, client.TaskSpec{ID: fmt.Sprintf("t%d", i), When: client.After(time.Hour)})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("upsert t%d: %v; want it accepted (only the batch was too large)", i, err)
		}
	}
	count.mu.Lock()
	defer count.mu.Unlock()
	if !cmp.Equal(count.batches, []int{n}) || count.unary != n {
		t.Errorf("sent batches of %v items and %d UpsertTask calls; want the batch of %d refused, then %d calls alone", count.batches, count.unary, n, n)
	}
}
