package dispatcher

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
)

// countingFeed records what is published and answers with receivers
// subscriptions per copy.
type countingFeed struct {
	receivers atomic.Int64
	mu        sync.Mutex
	published []storage.WatchCopy
}

func (f *countingFeed) PublishWatchCopies(_ context.Context, copies []storage.WatchCopy) ([]int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.published = append(f.published, copies...)
	out := make([]int64, len(copies))
	for i := range out {
		out[i] = f.receivers.Load()
	}
	return out, nil
}

func (f *countingFeed) SubscribeWatchCopies(context.Context, string, func() error, func(storage.WatchCopy) error) error {
	panic("not used")
}

func (f *countingFeed) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.published)
}

type stepClock struct{ now atomic.Int64 }

func (c *stepClock) Now() time.Time { return time.Unix(0, c.now.Load()) }

// TestFeedPublishesOnlyWhileWatched: once PUBLISH says nobody watches a
// namespace, its copies are not published for FeedRecheck; then one copy
// probes (the others meanwhile are not published); while someone watches
// every copy is published, and always while this replica has a watcher.
func TestFeedPublishesOnlyWhileWatched(t *testing.T) {
	feed := &countingFeed{}
	clock := &stepClock{}
	clock.now.Store(time.Unix(1000, 0).UnixNano())
	p := newFeedPublisher(feed, clock, time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.run(ctx, slog.New(slog.DiscardHandler)) }()
	defer func() { cancel(); <-done }()

	del := func(id string) storage.Delivery {
		return storage.Delivery{Task: storage.Task{Namespace: "quiet", ID: id}}
	}
	p.offer("quiet", del("a"), clock.Now())
	testkit.Eventually(t, 10*time.Second, "the first copy is published and the namespace marked quiet", func() bool {
		return feed.count() == 1 && !p.watched("quiet")
	})
	for _, id := range []string{"b", "c", "d"} {
		p.offer("quiet", del(id), clock.Now())
	}
	clock.now.Add(int64(FeedRecheck - time.Millisecond))
	p.offer("quiet", del("e"), clock.Now())
	if n := feed.count(); n != 1 {
		t.Fatalf("nobody watches, yet %d copies were published within FeedRecheck; want 1", n)
	}

	// FeedRecheck later one copy probes; the copies made meanwhile are not
	// published, and with nobody watching it is quiet again.
	clock.now.Add(int64(time.Millisecond))
	p.offer("quiet", del("p1"), clock.Now())
	p.offer("quiet", del("p2"), clock.Now())
	testkit.Eventually(t, 10*time.Second, "the probe is published and answered", func() bool {
		return feed.count() == 2 && !p.watched("quiet")
	})

	// The next probe finds a watcher: from then on every copy is published.
	feed.receivers.Store(1)
	clock.now.Add(int64(FeedRecheck))
	p.offer("quiet", del("f"), clock.Now())
	testkit.Eventually(t, 10*time.Second, "the next probe is published", func() bool {
		return feed.count() == 3 && p.watched("quiet")
	})
	p.offer("quiet", del("g"), clock.Now())
	p.offer("quiet", del("h"), clock.Now())
	testkit.Eventually(t, 10*time.Second, "while watched, every copy is published", func() bool { return feed.count() == 5 })

	// The watcher leaves: quiet again. A watcher on this replica makes every
	// copy published at once, whatever PUBLISH said.
	feed.receivers.Store(0)
	p.offer("quiet", del("i"), clock.Now())
	testkit.Eventually(t, 10*time.Second, "quiet once nobody watches", func() bool { return feed.count() == 6 && !p.watched("quiet") })
	p.addLocal("quiet", 1)
	p.offer("quiet", del("j"), clock.Now())
	testkit.Eventually(t, 10*time.Second, "a local watcher's copy is published", func() bool { return feed.count() == 7 })
	p.addLocal("quiet", -1)

	feed.mu.Lock()
	defer feed.mu.Unlock()
	var got []string
	for _, c := range feed.published {
		got = append(got, c.Task.ID)
	}
	if want := "a p1 f g h i j"; fmt.Sprint(got) != "["+want+"]" {
		t.Errorf("published %v, want [%s]", got, want)
	}
}
