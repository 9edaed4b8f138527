package mysqlstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/delayd/delayd/storage"
)

// TestWriteThrough walks one task through its lifecycle and checks the
// MySQL row after every step.
func TestWriteThrough(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := context.Background()
	ns := testNamespace()

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

	ds, err := e.store.Pop(ctx, ns, 10, time.Minute)
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
	ds, err = e.store.Pop(ctx, ns, 10, time.Minute)
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
	prev, err := e.store.Remove(ctx, ns, "b")
	if err != nil || prev != storage.StateScheduled {
		t.Fatalf("remove b: %v %v", prev, err)
	}
	if _, ok := e.row(ns, "b"); ok {
		t.Fatal("mysql still has b after remove")
	}
	if _, err := e.store.Remove(ctx, ns, "b"); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("second remove: %v, want ErrNotFound", err)
	}
}
