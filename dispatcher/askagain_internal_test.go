package dispatcher

import (
	"context"
	"testing"
	"time"

	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/storagefake"
)

// A loop that ends while pops whose answer was lost are still asked (its
// last stream left, or Stop) asks each once more: what one leased goes
// back unsent, due at once and with its attempt given back, instead of
// waiting out its lease; one that has not run is cancelled, so it leases
// nothing when it runs late (issue 38 item 1). Before, the loop just
// ended: a lost pop's tasks stayed leased to nobody.
func TestEndingLoopGivesUpAskedPops(t *testing.T) {
	store := storagefake.New(nil)
	ctx := context.Background()
	if _, err := store.Upsert(ctx, "giveup", []storage.UpsertSpec{{ID: "ran", Delay: -2 * time.Second}, {ID: "later", Delay: -time.Second}}); err != nil {
		t.Fatal(err)
	}
	d, err := New(Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	d.base = ctx
	n := newNamespace(d, "giveup")
	dist := distribution{leaseFor: time.Hour, storeLease: time.Hour}
	// "ran" was leased by a pop whose answer was lost; "never" has not run.
	if ds, err := store.Pop(ctx, "giveup", storage.PopParams{RequestID: "ran-1", Limit: 1, LeaseFor: time.Hour}); err != nil || len(ds) != 1 {
		t.Fatalf("pop: %v, %v", ds, err)
	}
	now := d.cfg.Clock.Now()
	n.asked = []askedPop{{id: "ran-1", since: now, got: map[storage.Token]bool{}, dist: dist},
		{id: "never-1", since: now, got: map[storage.Token]bool{}, dist: dist}}
	n.giveUpAsked()
	if len(n.asked) != 0 {
		t.Errorf("%d pops still asked after the loop ended", len(n.asked))
	}
	task, err := store.Get(ctx, "giveup", "ran")
	if err != nil || task.State != storage.StateScheduled || task.Attempt != 0 {
		t.Errorf("the lost pop's task = %+v, %v; want scheduled again, attempt 0 (handed back unsent)", task, err)
	}
	// the pop that never ran, run late, leases nothing
	if ds, err := store.Pop(ctx, "giveup", storage.PopParams{RequestID: "never-1", Limit: 5, LeaseFor: time.Hour}); err != nil || len(ds) != 0 {
		t.Errorf("the cancelled pop run late = %v, %v; want nothing", ds, err)
	}
}
