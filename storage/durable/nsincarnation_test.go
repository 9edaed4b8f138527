package durable_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/durable"
)

// heldClaim is the Redis index with one hold point: once armed, the next
// ClaimIncarnation answers as the index does, but only after the test
// releases it. It stands for an upsert that passed the index's namespace
// incarnation check just before a DeleteNamespace and reaches MySQL after
// it (one group-commit latency later, made as long as the test needs).
type heldClaim struct {
	durable.Index
	mu      sync.Mutex
	armed   bool
	claimed chan struct{} // closed when the armed claim has been answered by the index
	release chan struct{} // the test closes it to let the write go on
}

func (h *heldClaim) arm() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.armed, h.claimed, h.release = true, make(chan struct{}), make(chan struct{})
}

func (h *heldClaim) ClaimIncarnation(ctx context.Context, ns string, inc int64) error {
	h.mu.Lock()
	armed := h.armed
	h.armed = false
	claimed, release := h.claimed, h.release
	h.mu.Unlock()
	if !armed {
		return h.Index.ClaimIncarnation(ctx, ns, inc)
	}
	err := h.Index.ClaimIncarnation(context.Background(), ns, inc)
	close(claimed)
	<-release
	return err
}

// TestUpsertPastTheIndexCheckDoesNotOutliveDelete reproduces the last
// durable-mode window of issue 11 item 2: an upsert whose namespace
// incarnation the index accepted just before a DeleteNamespace, committed
// to MySQL after the delete dropped the namespace's rows, was kept by MySQL
// (which checked nothing), and the reconciler then indexed it into a
// namespace re-created under the same name. MySQL, the authority, now
// checks the incarnation in the commit's transaction: the write is refused
// with storage.ErrNamespaceEnded at every stage of the delete, and a write
// for the new incarnation in the same batch window still lands.
func TestUpsertPastTheIndexCheckDoesNotOutliveDelete(t *testing.T) {
	t.Parallel()
	for _, stage := range []string{"tasks dropped", "namespace deleted", "namespace re-created"} {
		t.Run(stage, func(t *testing.T) {
			t.Parallel()
			var h *heldClaim
			e := newEnv(t, func(c *durable.Config) {
				h = &heldClaim{Index: c.Index}
				c.Index = h
				c.ReconcileInterval = 100 * time.Millisecond
				// A write skips the index's check while an index call has
				// run for IndexWait (a loaded machine): keep the check on.
				c.IndexWait = 30 * time.Second
			})
			e.waitReady()
			ctx := context.Background()
			reg := e.store.Registry()
			ns := testkit.Namespace(t, "late")
			n, err := reg.CreateNamespace(ctx, storage.Namespace{Name: ns})
			if err != nil {
				t.Fatal(err)
			}
			inc := n.CreateTime.UnixMilli()
			if _, err := e.store.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "before", Delay: time.Hour, NamespaceIncarnation: inc}}); err != nil {
				t.Fatalf("upsert before the delete: %v", err)
			}

			h.arm()
			done := make(chan error, 1)
			go func() {
				_, err := e.store.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "late", Payload: []byte("old owner"), Delay: time.Hour, NamespaceIncarnation: inc}})
				done <- err
			}()
			select {
			case <-h.claimed:
			case <-time.After(30 * time.Second):
				t.Fatal("the upsert never reached the index's incarnation check")
			}
			// DeleteNamespace as the server runs it: the tasks (the index
			// ends the incarnation first), then the record.
			if _, err := e.store.DropNamespace(ctx, ns, inc); err != nil {
				t.Fatalf("drop: %v", err)
			}
			newInc := int64(0)
			if stage != "tasks dropped" {
				if err := reg.DeleteNamespace(ctx, ns); err != nil {
					t.Fatalf("delete: %v", err)
				}
			}
			if stage == "namespace re-created" {
				n2, err := reg.CreateNamespace(ctx, storage.Namespace{Name: ns})
				if err != nil {
					t.Fatal(err)
				}
				newInc = n2.CreateTime.UnixMilli()
			}
			close(h.release)
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("the held upsert never answered")
			}
			if !errors.Is(err, storage.ErrNamespaceEnded) {
				t.Errorf("held upsert answered %v; want %v", err, storage.ErrNamespaceEnded)
			}
			if r, ok := e.row(ns, "late"); ok {
				t.Errorf("MySQL kept the old incarnation's write: %+v", r)
			}
			if newInc == 0 {
				return
			}
			// The new owner writes; the reconciler runs; the old owner's
			// task is nowhere.
			if _, err := e.store.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "new", Delay: time.Hour, NamespaceIncarnation: newInc}}); err != nil {
				t.Fatalf("upsert for the new incarnation: %v", err)
			}
			time.Sleep(500 * time.Millisecond) // several incremental reconciler passes
			if got, err := e.store.Get(ctx, ns, "late"); !errors.Is(err, storage.ErrNotFound) {
				t.Errorf("the re-created namespace serves the old owner's task: %+v %v", got, err)
			}
			if c := e.count(ns); c != 1 {
				t.Errorf("MySQL holds %d tasks of the re-created namespace; want 1 (its own)", c)
			}
		})
	}
}

// TestRedisDownMySQLChecksIncarnation: while the index cannot be reached
// MySQL takes writes on its own, and it refuses those made for a
// namespace incarnation that was deleted (and re-created), as the index
// would; the new incarnation's writes go on.
func TestRedisDownMySQLChecksIncarnation(t *testing.T) {
	t.Parallel()
	url, rp := redisViaProxy(t)
	e := newEnvOn(t, testkit.Database(t, "delayd_test"), url, nil)
	e.waitReady()
	ctx := context.Background()
	reg := e.store.Registry()
	type deleted struct {
		ns          string
		old, newInc int64 // newInc 0: not re-created
	}
	var cases []deleted
	for _, recreate := range []bool{false, true} {
		ns := testkit.Namespace(t, "rdown")
		n, err := reg.CreateNamespace(ctx, storage.Namespace{Name: ns})
		if err != nil {
			t.Fatal(err)
		}
		c := deleted{ns: ns, old: n.CreateTime.UnixMilli()}
		if _, err := e.store.DropNamespace(ctx, ns, c.old); err != nil {
			t.Fatal(err)
		}
		if err := reg.DeleteNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
		if recreate {
			n2, err := reg.CreateNamespace(ctx, storage.Namespace{Name: ns})
			if err != nil {
				t.Fatal(err)
			}
			c.newInc = n2.CreateTime.UnixMilli()
		}
		cases = append(cases, c)
	}

	rp.SetDown(true)
	for _, c := range cases {
		recreated := c.newInc != 0
		_, err := e.store.Upsert(ctx, c.ns, []storage.UpsertSpec{{ID: "stale", Delay: time.Hour, NamespaceIncarnation: c.old}})
		if !errors.Is(err, storage.ErrNamespaceEnded) {
			t.Errorf("re-created %v: upsert for the deleted incarnation with redis down answered %v; want %v", recreated, err, storage.ErrNamespaceEnded)
		}
		if r, ok := e.row(c.ns, "stale"); ok {
			t.Errorf("re-created %v: MySQL took the deleted incarnation's write: %+v", recreated, r)
		}
		if recreated {
			if _, err := e.store.Upsert(ctx, c.ns, []storage.UpsertSpec{{ID: "fresh", Delay: time.Hour, NamespaceIncarnation: c.newInc}}); err != nil {
				t.Errorf("upsert for the new incarnation with redis down: %v", err)
			}
			if _, ok := e.row(c.ns, "fresh"); !ok {
				t.Error("MySQL lacks the new incarnation's write")
			}
		}
	}
	rp.SetDown(false)
}

// blindClaim is the Redis index answering every incarnation claim "not
// ended", as a write sees it when it passed the check just before the
// delete.
type blindClaim struct{ durable.Index }

func (blindClaim) ClaimIncarnation(context.Context, string, int64) error { return nil }

// TestEndedIncarnationFailsOnlyItsOwnWrites: the group commit carries
// writes of many namespaces in one transaction; a write for an ended
// namespace incarnation fails alone, the others in its batch commit.
func TestEndedIncarnationFailsOnlyItsOwnWrites(t *testing.T) {
	t.Parallel()
	// One committer lingering long enough that the writes below share a
	// batch; an index that never refuses, so MySQL decides.
	e := newEnv(t, func(c *durable.Config) {
		c.Committers, c.Linger = 1, 300*time.Millisecond
		c.Index = blindClaim{c.Index}
	})
	e.waitReady()
	ctx := context.Background()
	reg := e.store.Registry()
	gone, live := testkit.Namespace(t, "gone"), testkit.Namespace(t, "live")
	var incs []int64
	for _, ns := range []string{gone, live} {
		n, err := reg.CreateNamespace(ctx, storage.Namespace{Name: ns})
		if err != nil {
			t.Fatal(err)
		}
		incs = append(incs, n.CreateTime.UnixMilli())
	}
	if _, err := e.store.DropNamespace(ctx, gone, incs[0]); err != nil {
		t.Fatal(err)
	}
	if err := reg.DeleteNamespace(ctx, gone); err != nil {
		t.Fatal(err)
	}
	type result struct {
		ns  string
		err error
	}
	out := make(chan result, 4)
	var wg sync.WaitGroup
	for i, w := range []struct {
		ns  string
		inc int64
	}{{live, incs[1]}, {gone, incs[0]}, {live, incs[1]}, {live, 0}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := e.store.Upsert(ctx, w.ns, []storage.UpsertSpec{{ID: fmt.Sprintf("t%d", i), Delay: time.Hour, NamespaceIncarnation: w.inc}})
			out <- result{w.ns, err}
		}()
	}
	wg.Wait()
	close(out)
	for r := range out {
		switch {
		case r.ns == gone && !errors.Is(r.err, storage.ErrNamespaceEnded):
			t.Errorf("write for the deleted namespace answered %v; want %v", r.err, storage.ErrNamespaceEnded)
		case r.ns == live && r.err != nil:
			t.Errorf("write for the live namespace failed with the deleted one's: %v", r.err)
		}
	}
	if c := e.count(live); c != 3 {
		t.Errorf("MySQL holds %d tasks of the live namespace; want 3", c)
	}
	if c := e.count(gone); c != 0 {
		t.Errorf("MySQL holds %d tasks of the deleted namespace; want 0", c)
	}
}
