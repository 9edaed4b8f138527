package dispatcher

import (
	"testing"

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
