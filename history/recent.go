package history

import (
	"slices"
	"sync"
	"time"

	"github.com/delayd/delayd/storage"
)

// RecentWindow is the span Recent covers: 5 minutes.
const RecentWindow = 5 * time.Minute

// recentSamples is how many of the latest lateness figures per namespace
// the percentiles are taken from.
const recentSamples = 1024

// Recent keeps, per namespace, what this replica delivered over the last
// RecentWindow: a count per second (for the rate) and the latest lateness
// figures (for percentiles). It is fed by the Recorder's Pop, for every
// namespace, with no store call. The figures are those of one namespace
// incarnation (its create time, as the Recorder looked it up before the
// pop): a namespace re-created under a deleted one's name starts from
// none, and a pop made for the old one is not counted for the new one.
// Memory is bounded per namespace, and a namespace that delivered nothing
// for a RecentWindow is let go. Safe for concurrent use.
type Recent struct {
	mu  sync.Mutex
	nss map[string]*recentNS
	now func() time.Time
	// swept is when nss was last swept of idle namespaces (Unix s).
	swept int64
}

// recentNS is one namespace incarnation's ring of per-second counts and of
// lateness samples.
type recentNS struct {
	inc   int64 // the namespace incarnation the figures are of
	last  int64 // the Unix second of the latest observation
	secs  [int(RecentWindow / time.Second)]int64
	stamp [int(RecentWindow / time.Second)]int64 // the Unix second secs[i] counts
	late  [recentSamples]time.Duration
	at    [recentSamples]int64 // the Unix second of late[i]
	n     int                  // samples held (≤ recentSamples)
	next  int
}

// NewRecent returns an empty Recent on the local clock.
func NewRecent() *Recent {
	return &Recent{nss: map[string]*recentNS{}, now: time.Now}
}

// observe records deliveries of incarnation inc of ns with these lateness
// figures. The figures of an earlier incarnation are dropped for a later
// one's; a pop made for an earlier incarnation than the one held is not
// counted.
func (r *Recent) observe(ns string, inc int64, late []time.Duration) {
	if r == nil || len(late) == 0 {
		return
	}
	sec := r.now().Unix()
	r.mu.Lock()
	defer r.mu.Unlock()
	x := r.nss[ns]
	switch {
	case x != nil && inc < x.inc:
		return
	case x == nil || inc > x.inc:
		r.sweepLocked(sec)
		x = &recentNS{inc: inc}
		r.nss[ns] = x
	}
	x.last = sec
	i := int(sec % int64(len(x.secs)))
	if x.stamp[i] != sec {
		x.stamp[i], x.secs[i] = sec, 0
	}
	x.secs[i] += int64(len(late))
	for _, l := range late {
		x.late[x.next], x.at[x.next] = l, sec
		x.next = (x.next + 1) % recentSamples
		x.n = min(x.n+1, recentSamples)
	}
}

// sweepLocked lets go of the namespaces that delivered nothing over the
// last RecentWindow, at most once per RecentWindow; r.mu is held.
func (r *Recent) sweepLocked(sec int64) {
	window := int64(RecentWindow / time.Second)
	if sec-r.swept < window {
		return
	}
	r.swept = sec
	for ns, x := range r.nss {
		if sec-x.last >= window {
			delete(r.nss, ns)
		}
	}
}

// Deliveries reports the recent deliveries of incarnation inc of ns on
// this replica (none when what it holds is another incarnation's).
func (r *Recent) Deliveries(ns string, inc int64) storage.RecentDeliveries {
	out := storage.RecentDeliveries{Window: RecentWindow}
	if r == nil {
		return out
	}
	sec := r.now().Unix()
	from := sec - int64(RecentWindow/time.Second) + 1
	r.mu.Lock()
	x := r.nss[ns]
	var late []time.Duration
	if x != nil && x.inc == inc {
		for i, s := range x.stamp {
			if s >= from && s <= sec {
				out.Count += x.secs[i]
			}
		}
		for i := range x.n {
			if x.at[i] >= from {
				late = append(late, x.late[i])
			}
		}
	}
	r.mu.Unlock()
	out.PerSecond = float64(out.Count) / RecentWindow.Seconds()
	if len(late) > 0 {
		slices.Sort(late)
		q := func(p float64) time.Duration { return late[min(len(late)-1, int(p*float64(len(late))))] }
		out.P50, out.P90, out.P99 = q(0.50), q(0.90), q(0.99)
	}
	return out
}
