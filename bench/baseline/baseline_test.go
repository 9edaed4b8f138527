package baseline

import (
	"github.com/delayd/delayd/internal/testkit"

	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// newQueue returns a Queue on the test Redis under a fresh prefix, deleted
// when the test ends.
func newQueue(t *testing.T) (*Queue, *redis.Client) {
	t.Helper()
	rdb := testkit.Redis(t)
	q := New(rdb, "test-"+testkit.Suffix())
	t.Cleanup(func() {
		if _, err := q.Cleanup(context.Background()); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		rdb.Close()
	})
	return q, rdb
}

func TestPopTakesOnlyDueTasksInDueOrderWithRecords(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q, _ := newQueue(t)
	now := time.UnixMilli(time.Now().UnixMilli())
	items := []Item{
		{ID: "late", Due: now.Add(time.Hour), Record: []byte("L")},
		{ID: "b", Due: now.Add(-2 * time.Second), Record: []byte("B")},
		{ID: "a", Due: now.Add(-3 * time.Second), Record: []byte("A")},
		{ID: "c", Due: now, Record: []byte("C")},
	}
	for _, it := range items {
		if err := q.Upsert(ctx, "q", it); err != nil {
			t.Fatal(err)
		}
	}
	got, err := q.Pop(ctx, "q", now, 2)
	if err != nil {
		t.Fatal(err)
	}
	want := []Task{
		{Queue: "q", ID: "a", Due: now.Add(-3 * time.Second), Record: []byte("A")},
		{Queue: "q", ID: "b", Due: now.Add(-2 * time.Second), Record: []byte("B")},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("first pop (-want +got):\n%s", d)
	}
	got, err = q.Pop(ctx, "q", now, 10)
	if err != nil {
		t.Fatal(err)
	}
	want = []Task{{Queue: "q", ID: "c", Due: now, Record: []byte("C")}}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("second pop (-want +got):\n%s", d)
	}
	if n, err := q.Len(ctx, "q"); err != nil || n != 1 {
		t.Fatalf("Len = %d, %v; want 1 (the task due in an hour)", n, err)
	}
}

func TestUpsertRenewsDueTime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q, _ := newQueue(t)
	now := time.UnixMilli(time.Now().UnixMilli())
	if err := q.UpsertPipelined(ctx, "q", []Item{{ID: "x", Due: now.Add(-time.Second), Record: []byte("1")}}); err != nil {
		t.Fatal(err)
	}
	// The renewal moves the task into the future: it must not pop now.
	if err := q.Upsert(ctx, "q", Item{ID: "x", Due: now.Add(time.Minute), Record: []byte("2")}); err != nil {
		t.Fatal(err)
	}
	got, err := q.Pop(ctx, "q", now, 10)
	if err != nil || len(got) != 0 {
		t.Fatalf("Pop = %v, %v; want nothing due", got, err)
	}
	got, err = q.Pop(ctx, "q", now.Add(time.Minute), 10)
	if err != nil {
		t.Fatal(err)
	}
	want := []Task{{Queue: "q", ID: "x", Due: now.Add(time.Minute), Record: []byte("2")}}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("pop after renewal (-want +got):\n%s", d)
	}
}

func TestPopRejectsBadLimit(t *testing.T) {
	t.Parallel()
	q, _ := newQueue(t)
	for _, n := range []int{0, -1, MaxPopBatch + 1} {
		if _, err := q.Pop(context.Background(), "q", time.Now(), n); !errors.Is(err, ErrBadBatch) {
			t.Errorf("Pop(limit %d) = %v, want ErrBadBatch", n, err)
		}
	}
}

// The poller delivers every task exactly once and never before its due time
// by the poller's clock, across several queues and with pops that must loop
// (more due tasks than one batch).
func TestPollerDeliversEveryTaskOnceNeverEarly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q, rdb := newQueue(t)
	const n = 3000
	queues := []string{"q0", "q1"}
	start := time.Now()
	var items [2][]Item
	for i := range n {
		due := start.Add(time.Duration(i%300) * time.Millisecond)
		items[i%2] = append(items[i%2], Item{ID: fmt.Sprintf("t%d", i), Due: due, Record: []byte("p")})
	}
	for k, qn := range queues {
		if err := q.UpsertPipelined(ctx, qn, items[k]); err != nil {
			t.Fatal(err)
		}
	}
	var (
		mu    sync.Mutex
		seen  = map[string]int{}
		early []string
		done  = make(chan struct{})
	)
	p, err := NewPoller(PollerConfig{
		Queue: q, Queues: queues, Interval: 10 * time.Millisecond, Batch: 50,
		Handle: func(tk Task) {
			mu.Lock()
			defer mu.Unlock()
			if time.Now().Before(tk.Due) {
				early = append(early, tk.ID)
			}
			seen[tk.ID]++
			if len(seen) == n && seen[tk.ID] == 1 {
				close(done)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	p.Start(ctx)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
	}
	if err := p.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != n {
		t.Fatalf("delivered %d distinct tasks, want %d", len(seen), n)
	}
	for id, c := range seen {
		if c != 1 {
			t.Errorf("task %s delivered %d times", id, c)
		}
	}
	if len(early) > 0 {
		t.Errorf("%d tasks delivered before due, e.g. %s", len(early), early[0])
	}
	if p.Errors() != 0 {
		t.Errorf("poller errors: %d", p.Errors())
	}
	for _, qn := range queues {
		k := queueKeys(q.prefix, qn)
		if c, _ := rdb.Exists(ctx, k.zset, k.hash).Result(); c != 0 {
			t.Errorf("queue %s still has %d keys after draining", qn, c)
		}
	}
}

func TestCleanupDeletesOnlyItsPrefix(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q, rdb := newQueue(t)
	other, _ := newQueue(t)
	for _, qq := range []*Queue{q, other} {
		if err := qq.Upsert(ctx, "q", Item{ID: "x", Due: time.Now().Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	n, err := q.Cleanup(ctx)
	if err != nil || n != 2 {
		t.Fatalf("Cleanup = %d, %v; want 2 keys", n, err)
	}
	k := queueKeys(other.prefix, "q")
	if c, _ := rdb.Exists(ctx, k.zset, k.hash).Result(); c != 2 {
		t.Fatalf("the other prefix has %d of its 2 keys left", c)
	}
}
