package dispatcher

import (
	"errors"
	"testing"
	"time"

	"github.com/delayd/delayd/storage"
)

// TestSlowStoreDoesNotStarveReaping: a store that keeps answering, only
// slowly, holds reaping for at most maxHold; a store whose calls fail (a
// stall) keeps holding it, so renewals land before any reap.
func TestSlowStoreDoesNotStarveReaping(t *testing.T) {
	h := newHealth(60*time.Millisecond, nil) // slowCall 10 ms, hold 30 ms, maxHold 30 ms
	slow := func(err error) { h.observe(time.Now().Add(-h.slowCall), err) }

	slow(nil)
	if h.heldFor() == 0 {
		t.Fatal("reaping not held right after a slow call")
	}
	released := false
	for end := time.Now().Add(50 * h.maxHold()); time.Now().Before(end); time.Sleep(h.slowCall / 2) {
		slow(nil) // trouble again and again: the hold alone would never end
		if h.heldFor() == 0 {
			released = true
			break
		}
	}
	if !released {
		t.Fatalf("reaping still held after %s of slow but successful calls; want released after maxHold %s", 50*h.maxHold(), h.maxHold())
	}

	h = newHealth(60*time.Millisecond, nil)
	for end := time.Now().Add(5 * h.maxHold()); time.Now().Before(end); time.Sleep(h.slowCall / 2) {
		slow(errors.Join(storage.ErrUnavailable))
		if h.heldFor() == 0 {
			t.Fatal("reaping released while the store's calls fail (a stall): a reap would run before the renewals when it resumes")
		}
	}
}
