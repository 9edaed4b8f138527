package durable

import (
	"context"
	"errors"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/authority"
	"github.com/delayd/delayd/storage/redisstore"
)

// fakeAuthority stands in for MySQL at the seam: tasks in memory, and a
// Commit that fails every call carrying a write of badNS. Every method a
// test does not expect panics (the embedded interface is nil), so a test
// also pins which calls a component makes.
type fakeAuthority struct {
	authority.Authority

	mu      sync.Mutex
	tasks   map[string]map[string]storage.Task // ns -> id -> task
	badNS   string
	commits int // Commit calls
}

func newFakeAuthority() *fakeAuthority {
	return &fakeAuthority{tasks: map[string]map[string]storage.Task{}}
}

func (f *fakeAuthority) put(ns string, t storage.Task) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.tasks[ns] == nil {
		f.tasks[ns] = map[string]storage.Task{}
	}
	f.tasks[ns][t.ID] = t
}

func (f *fakeAuthority) Database() string                                 { return "fake" }
func (f *fakeAuthority) UseClock(func(context.Context, string) time.Time) {}
func (f *fakeAuthority) Close() error                                     { return nil }

// Commit applies upserts (generation 1 for a new task, +1 otherwise) and
// fails the whole call if any write is of badNS.
func (f *fakeAuthority) Commit(segs []authority.Segment) error {
	f.mu.Lock()
	f.commits++
	f.mu.Unlock()
	for _, sg := range segs {
		for _, w := range sg.Upserts {
			if w.NS == f.badNS {
				return errors.New("fake: a bad row")
			}
		}
	}
	for _, sg := range segs {
		for _, w := range sg.Upserts {
			w.Upserts = make([]storage.UpsertResult, len(w.Rows))
			for i, r := range w.Rows {
				f.mu.Lock()
				old, ok := f.tasks[w.NS][r.ID]
				f.mu.Unlock()
				t := storage.Task{ID: r.ID, Kind: r.Kind, Payload: r.Payload, DueTime: time.UnixMilli(r.DueMS),
					State: storage.StateScheduled, Incarnation: r.Inc, Generation: 1}
				if ok {
					t.Incarnation, t.Generation = old.Incarnation, old.Generation+1
				}
				f.put(w.NS, t)
				w.Upserts[i] = storage.UpsertResult{Task: t}
			}
		}
	}
	return nil
}

func (f *fakeAuthority) TaskNamespaces(context.Context) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for ns, ts := range f.tasks {
		if len(ts) > 0 {
			out = append(out, ns)
		}
	}
	sort.Strings(out)
	return out, nil
}

func (f *fakeAuthority) sorted(ns string) []storage.Task {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ts []storage.Task
	for _, t := range f.tasks[ns] {
		ts = append(ts, t)
	}
	slices.SortFunc(ts, func(a, b storage.Task) int { return compareStrings(a.ID, b.ID) })
	return ts
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func versionOf(t storage.Task) storage.Version {
	return storage.Version{ID: t.ID, Incarnation: t.Incarnation, Generation: t.Generation}
}

func (f *fakeAuthority) ReadVersions(_ context.Context, ns, after string, limit int) ([]storage.Version, error) {
	var out []storage.Version
	for _, t := range f.sorted(ns) {
		if t.ID > after && len(out) < limit {
			out = append(out, versionOf(t))
		}
	}
	return out, nil
}

func (f *fakeAuthority) ReadTasks(_ context.Context, ns string, ids []string) ([]storage.Task, error) {
	var out []storage.Task
	for _, t := range f.sorted(ns) {
		if slices.Contains(ids, t.ID) {
			out = append(out, t)
		}
	}
	return out, nil
}

func (f *fakeAuthority) VersionsOf(ctx context.Context, ns string, ids []string) ([]storage.Version, error) {
	ts, _ := f.ReadTasks(ctx, ns, ids)
	out := make([]storage.Version, len(ts))
	for i, t := range ts {
		out[i] = versionOf(t)
	}
	return out, nil
}

// TestCommitterRunOnceIsolatesABadWrite: a group commit the authority
// refuses for a reason that is not its health is committed again write by
// write, so the one bad write fails alone and the good one is committed and
// handed to the index writers.
func TestCommitterRunOnceIsolatesABadWrite(t *testing.T) {
	db := newFakeAuthority()
	db.badNS = "bad"
	cfg := Config{Logger: testkit.Logger(t)}
	cfg.defaults()
	c := newCommitter(db, newIndexWriters(nil, newRepairSet(), newThrottle(cfg.Logger), cfg), cfg)
	upsert := func(ns, id string) *op {
		return &op{Write: authority.Write{Kind: kindUpsert, NS: ns, NowMS: 1,
			Rows: []authority.UpsertRow{{ID: id, Payload: []byte("p"), DueMS: 1, Inc: 7}}}, done: make(chan struct{})}
	}
	good, bad := upsert("good", "a"), upsert("bad", "b")
	c.runOnce([]*op{good, bad})

	if db.commits != 3 {
		t.Errorf("Commit calls = %d, want 3 (the group, then each write alone)", db.commits)
	}
	if good.err != nil || good.ix == nil || len(good.Upserts) != 1 || good.Upserts[0].Task.Generation != 1 {
		t.Errorf("good write: err %v, index job %v, results %+v; want committed at generation 1 with an index job", good.err, good.ix, good.Upserts)
	}
	if bad.err == nil || bad.ix != nil {
		t.Errorf("bad write: err %v, index job %v; want its own error and no index job", bad.err, bad.ix)
	}
	for _, o := range []*op{good, bad} {
		select {
		case <-o.done:
		default:
			t.Errorf("write %s not answered", o.NS)
		}
	}
}

// TestReconcilerRunOnceRebuildsFromTheAuthority: one turn of the leader's
// loop over an index that lost a namespace rebuilds it from the authority
// (each task at the authority's version), marks it indexed, closes Ready,
// and its full pass forgets an index entry the authority does not have.
func TestReconcilerRunOnceRebuildsFromTheAuthority(t *testing.T) {
	ctx := context.Background()
	idx := redisstore.New(testkit.RedisAt(t, testkit.StartRedis(t).URL), redisstore.Options{Logger: testkit.Logger(t)})
	db := newFakeAuthority()
	const ns = "rebuilt"
	due := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	for _, id := range []string{"a", "b", "c"} {
		db.put(ns, storage.Task{ID: id, Kind: "k", Payload: []byte(id), DueTime: due, State: storage.StateScheduled, Incarnation: 5, Generation: 3})
	}
	// An entry the authority never had (a restored snapshot of Redis).
	if _, err := idx.Restore(ctx, ns, []storage.Task{{ID: "orphan", Payload: []byte("x"), DueTime: due, State: storage.StateScheduled,
		Incarnation: 5, Generation: 1}}, storage.RestoreParams{}); err != nil {
		t.Fatal(err)
	}

	s, err := New(db, Config{Index: idx, Logger: testkit.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	s.recon.runOnce(ctx)

	select {
	case <-s.Ready():
	default:
		t.Fatal("Ready not closed after the rebuild")
	}
	if ok, err := idx.Indexed(ctx, ns); err != nil || !ok {
		t.Fatalf("index marker after the rebuild: %v %v, want set", ok, err)
	}
	for _, id := range []string{"a", "b", "c"} {
		got, err := idx.Get(ctx, ns, id)
		if err != nil || got.Generation != 3 || got.Incarnation != 5 || string(got.Payload) != id {
			t.Errorf("index task %s: %+v %v; want the authority's version (incarnation 5, generation 3)", id, got, err)
		}
	}
	if _, err := idx.Get(ctx, ns, "orphan"); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("the orphan entry after the full pass: %v, want ErrNotFound", err)
	}
}
