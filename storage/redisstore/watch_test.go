package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
)

// TestWatchCopiesRoundTrip: PUBLISH answers 0 while nobody subscribes to a
// namespace's watch channel; a subscriber gets each copy of its namespace,
// whole (payload bytes, times, Dropped), and none of another namespace.
func TestWatchCopiesRoundTrip(t *testing.T) {
	t.Parallel()
	s := New(testkit.Redis(t), Options{})
	ns, other := "watch-"+testkit.Suffix(), "watch-"+testkit.Suffix()
	at := time.UnixMilli(1_700_000_000_123).UTC()
	copyOf := func(ns, id string) storage.WatchCopy {
		return storage.WatchCopy{
			Task: storage.Task{Namespace: ns, ID: id, Kind: "k", Payload: []byte{0, 1, 0xff}, State: storage.StateDelivered,
				Attempt: 2, Generation: 3, DueTime: at, LeaseDeadline: at.Add(time.Minute)},
			LeaseDeadline: at.Add(time.Minute), SentAt: at.Add(time.Millisecond), Dropped: 4,
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	n, err := s.PublishWatchCopies(ctx, []storage.WatchCopy{copyOf(ns, "a")})
	if err != nil || len(n) != 1 || n[0] != 0 {
		t.Fatalf("publish with nobody watching = %v, %v; want [0]", n, err)
	}

	ready := make(chan struct{})
	got := make(chan storage.WatchCopy, 10)
	subCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- s.SubscribeWatchCopies(subCtx, ns, func() error { close(ready); return nil },
			func(c storage.WatchCopy) error { got <- c; return nil })
	}()
	<-ready
	n, err = s.PublishWatchCopies(ctx, []storage.WatchCopy{copyOf(other, "x"), copyOf(ns, "b")})
	if err != nil || len(n) != 2 || n[0] != 0 || n[1] != 1 {
		t.Fatalf("publish with one watcher of %s = %v, %v; want [0 1]", ns, n, err)
	}
	select {
	case c := <-got:
		if diff := cmp.Diff(copyOf(ns, "b"), c); diff != "" {
			t.Errorf("copy (-want +got):\n%s", diff)
		}
	case <-ctx.Done():
		t.Fatal("no copy arrived")
	}
	stop()
	if err := <-done; err != context.Canceled {
		t.Errorf("SubscribeWatchCopies after cancel: %v", err)
	}
	if len(got) != 0 {
		t.Errorf("extra copies: %v", <-got)
	}
}
