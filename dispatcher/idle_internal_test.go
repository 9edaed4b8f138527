package dispatcher

import (
	"context"
	"testing"
	"time"

	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/storagefake"
)

// TestDueButNothingMovedBacksOffBriefly (issue 20): when the store says a
// task is due but neither pop nor reap moves anything (another replica took
// it first, round after round), the loop backs off without spinning, and
// never for long: the backoff used to double up to the safety poll (1 s),
// so tasks falling due meanwhile could wait up to a second.
func TestDueButNothingMovedBacksOffBriefly(t *testing.T) {
	store := storagefake.New(nil)
	ctx := context.Background()
	if _, err := store.Upsert(ctx, "idle", []storage.UpsertSpec{{ID: "x", Delay: -time.Second}}); err != nil {
		t.Fatal(err)
	}
	thief := storagefake.NewFaulty(store)
	thief.SetFault(func(storagefake.Op, string) storagefake.Fault { return storagefake.Fault{Skip: true} })
	d, err := New(Config{Store: thief, SafetyPoll: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	d.base = ctx
	n := newNamespace(d, "idle")
	n.add(newStream(1, 10, nil))
	reap := true
	for i := range 40 {
		wait, blocked, reapNext := n.tick(reap)
		if blocked {
			t.Fatalf("round %d: blocked on credit with 10 free", i)
		}
		if wait > maxIdleWait {
			t.Fatalf("round %d: the loop sleeps %v while a task is due; want at most %v", i, wait, maxIdleWait)
		}
		if wait <= 0 && !reapNext {
			t.Fatalf("round %d: spins (wait %v) without even reaping next", i, wait)
		}
		reap = reapNext
	}
	if pops := thief.Calls(storagefake.OpPop); pops < 20 {
		t.Errorf("%d pops in 40 rounds, want one per round at least every other round", pops)
	}
}
