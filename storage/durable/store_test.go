package durable_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
)

// TestWriteThrough walks one task through its lifecycle and checks the
// MySQL row after every step.
func TestWriteThrough(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := context.Background()
	ns := testkit.Namespace(t, "du")

	res, err := e.store.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "a", Payload: []byte("x"), Delay: -time.Second}, {ID: "b", Delay: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	if !res[0].Created || res[0].Task.Generation != 1 || !res[1].Created {
		t.Fatalf("first upsert: %+v", res)
	}
	if r, ok := e.row(ns, "a"); !ok || r.Generation != 1 || r.State != 1 {
		t.Fatalf("mysql row of a after create: %+v %v", r, ok)
	}
	res, err = e.store.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "a", Payload: []byte("y"), Delay: -time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Created || res[0].Task.Generation != 2 {
		t.Fatalf("second upsert: %+v", res[0])
	}
	got, err := e.store.Get(ctx, ns, "a")
	if err != nil || got.Generation != 2 || string(got.Payload) != "y" {
		t.Fatalf("get a: %+v %v", got, err)
	}

	ds, err := e.store.Pop(ctx, ns, storage.PopParams{Limit: 10, LeaseFor: time.Minute})
	if err != nil || len(ds) != 1 || ds[0].Task.ID != "a" {
		t.Fatalf("pop: %+v %v", ds, err)
	}
	st, moved, err := e.store.Nack(ctx, ns, []storage.Token{ds[0].Token}, storage.NackOptions{RetryAfter: new(time.Duration), Reason: "boom", MaxAttempts: 5})
	if err != nil || st[0] != storage.TokenOK || len(moved) != 1 {
		t.Fatalf("nack: %v %+v %v", st, moved, err)
	}
	if r, _ := e.row(ns, "a"); r.Attempt != 1 || r.LastError != "boom" || r.State != 1 {
		t.Fatalf("mysql row of a after nack: %+v", r)
	}
	ds, err = e.store.Pop(ctx, ns, storage.PopParams{Limit: 10, LeaseFor: time.Minute})
	if err != nil || len(ds) != 1 {
		t.Fatalf("pop again: %+v %v", ds, err)
	}
	st, err = e.store.Ack(ctx, ns, []storage.Token{ds[0].Token})
	if err != nil || st[0] != storage.TokenOK {
		t.Fatalf("ack: %v %v", st, err)
	}
	if _, ok := e.row(ns, "a"); ok {
		t.Fatal("mysql still has a after its ack")
	}
	prev, err := e.store.Remove(ctx, ns, "b", storage.Version{})
	if err != nil || prev != storage.StateScheduled {
		t.Fatalf("remove b: %v %v", prev, err)
	}
	if _, ok := e.row(ns, "b"); ok {
		t.Fatal("mysql still has b after remove")
	}
	if _, err := e.store.Remove(ctx, ns, "b", storage.Version{}); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("second remove: %v, want ErrNotFound", err)
	}
}

// TestDeadLetterWriteThrough: dead-lettering keeps the attempt count and
// the last error in MySQL; requeue and purge are written through.
func TestDeadLetterWriteThrough(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := context.Background()
	ns := testkit.Namespace(t, "du")
	if _, err := e.store.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "d1", Delay: -time.Second}, {ID: "d2", Delay: -time.Second}}); err != nil {
		t.Fatal(err)
	}
	ds, err := e.store.Pop(ctx, ns, storage.PopParams{Limit: 2, LeaseFor: time.Minute})
	if err != nil || len(ds) != 2 {
		t.Fatalf("pop: %v %v", ds, err)
	}
	toks := []storage.Token{ds[0].Token, ds[1].Token}
	if _, _, err := e.store.Nack(ctx, ns, toks, storage.NackOptions{MaxAttempts: 1, Reason: "gave up"}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"d1", "d2"} {
		r, ok := e.row(ns, id)
		if !ok || r.State != int(storage.StateDead) || r.Attempt != 1 || r.LastError != "gave up" {
			t.Fatalf("mysql row of dead %s: %+v %v", id, r, ok)
		}
	}
	var deadMS int64
	if err := e.db.QueryRow("SELECT dead_ms FROM delayd_tasks WHERE namespace = ? AND id = 'd1'", ns).Scan(&deadMS); err != nil || deadMS == 0 {
		t.Fatalf("dead_ms = %d (%v), want the time it died", deadMS, err)
	}
	moved, err := e.store.Requeue(ctx, ns, storage.RequeueParams{IDs: []string{"d1"}})
	if err != nil || len(moved) != 1 {
		t.Fatalf("requeue: %v %v", moved, err)
	}
	if r, _ := e.row(ns, "d1"); r.State != int(storage.StateScheduled) || r.Attempt != 0 {
		t.Fatalf("mysql row after requeue: %+v", r)
	}
	purged, err := e.store.Purge(ctx, ns, storage.PurgeParams{IDs: []string{"d1", "d2"}})
	if err != nil || len(purged) != 1 || purged[0] != "d2" {
		t.Fatalf("purge: %v %v, want [d2] (d1 is scheduled again)", purged, err)
	}
	if _, ok := e.row(ns, "d2"); ok {
		t.Fatal("purged d2 still in mysql")
	}
	if _, ok := e.row(ns, "d1"); !ok {
		t.Fatal("purge deleted d1, which is not dead")
	}
}
