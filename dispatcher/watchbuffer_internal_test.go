package dispatcher

import (
	"testing"
	"time"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
)

// TestWatcherBufferIsBoundedByBytes: copies wait for a slow watcher only up
// to Watcher.BufferBytes of payload (one copy always fits); the rest are
// missed and counted, a copy counts until its Send returned (the
// transport holds it meanwhile), and reading makes room again. Before the bound a
// watch that never read held 256 copies of any size (40 such watches held
// 733 MiB).
func TestWatcherBufferIsBoundedByBytes(t *testing.T) {
	w := newWatcher(Watcher{Buffer: 256, BufferBytes: 10 << 10})
	copyOf := func(size int) Watched {
		return Watched{Delivery: storage.Delivery{Task: storage.Task{Payload: make([]byte, size)}}}
	}
	w.offer(copyOf(64 << 10)) // larger than the bound: fits alone
	w.offer(copyOf(1))
	if len(w.ch) != 1 || w.missed.Load() != 1 {
		t.Fatalf("after a copy past the bound: %d waiting, %d missed; want 1 and 1", len(w.ch), w.missed.Load())
	}
	c := w.next(<-w.ch)
	if c.Missed != 1 {
		t.Fatalf("the next copy says %d missed, want 1", c.Missed)
	}
	w.offer(copyOf(1))
	if w.missed.Load() != 1 {
		t.Fatalf("a copy offered while the large one is being sent: %d missed, want 1 (the copy being sent counts)", w.missed.Load())
	}
	w.sent(c)
	w.missed.Store(0)
	for range 100 {
		w.offer(copyOf(1 << 10))
	}
	waiting := len(w.ch)
	if want := (10 << 10) / (1<<10 + watchCopyOverhead); waiting != want {
		t.Fatalf("%d copies of 1 KiB wait under a 10 KiB bound; want %d", waiting, want)
	}
	if w.missed.Load() != int64(100-waiting) {
		t.Fatalf("missed %d, want %d", w.missed.Load(), 100-waiting)
	}
	for len(w.ch) > 0 {
		w.sent(w.next(<-w.ch))
	}
	if b := w.bytes.Load(); b != 0 {
		t.Fatalf("an empty watcher counts %d bytes", b)
	}
}

// TestStalledSendEndsTheWatch: a Send that does not return within the
// watcher's Stall is given up on (ErrWatchBehind) while the copy still
// counts against the watcher's bytes; the sender goroutine ends once that
// Send returns. A Send that returns in time gives its bytes back.
func TestStalledSendEndsTheWatch(t *testing.T) {
	release := make(chan struct{})
	calls := 0
	w := Watcher{Stall: 50 * time.Millisecond, Send: func(c Watched) error {
		calls++
		if calls == 2 {
			<-release // the reader stopped reading
		}
		return nil
	}}
	wt := newWatcher(Watcher{Buffer: 4, BufferBytes: 1 << 20})
	out := startSender(w, wt)
	copyOf := Watched{Delivery: storage.Delivery{Task: storage.Task{Payload: make([]byte, 1000)}}}
	stopped := make(chan struct{})
	for i, want := range []error{nil, ErrWatchBehind} {
		wt.offer(copyOf)
		if err := out.send(t.Context(), stopped, wt.next(<-wt.ch)); err != want {
			t.Fatalf("send %d: %v, want %v", i, err, want)
		}
	}
	if b := wt.bytes.Load(); b != copyCost(copyOf) {
		t.Errorf("with a Send stuck, the watcher counts %d bytes; want the stuck copy's %d", b, copyCost(copyOf))
	}
	out.close()
	close(release) // the stream ended: the stuck Send returns
	testkit.Eventually(t, 10*time.Second, "the stuck copy's bytes to be given back", func() bool { return wt.bytes.Load() == 0 })
}
