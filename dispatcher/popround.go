package dispatcher

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/delayd/delayd/storage"
)

// A namespace loop's pop round: the free credit per set of kinds
// (creditGroups), one Pop or several at once for each group (popGroup),
// and what distribute needs to know about the round (distribution).

// pop pops for free credit: one Pop of at most PopBatch, or, when free
// exceeds PopBatch and the last round came back full, up to PopConcurrency
// Pops at once whose limits add up to at most free (the credit is reserved before the calls; what they do
// not fill stays free). Every popped delivery is distributed, even when
// another of the calls failed. It returns how many were popped, whether
// every call was filled (more may be due), and the first error.
//
// wake is the store's answer of when the namespace has work next, from
// the pop that ran last in the store (each PopWake answers it after its own
// move); when no pop ran (no group had credit), a PopWake of limit 0 asks
// it, so the caller never needs a second call.
func (n *namespace) pop(ctx context.Context, free int, pol storage.Policy) (got int, full bool, wake storage.PopResult, err error) {
	groups := n.creditGroups()
	if len(groups) == 1 && groups[0].key == "" {
		return n.popGroup(ctx, creditGroup{free: free}, pol)
	}
	full = false
	asked := false
	for _, g := range groups {
		if g.free <= 0 {
			continue
		}
		gg, gf, gw, ge := n.popGroup(ctx, g, pol)
		got += gg
		full = full || gf
		if ge == nil {
			wake, asked = gw, true // later groups ran later: their answer is the latest
		}
		if err == nil {
			err = ge
		}
	}
	if !asked && err == nil {
		c, cancel := context.WithTimeout(ctx, n.d.cfg.StoreTimeout)
		wake, err = n.d.cfg.Store.PopWake(c, n.name, storage.PopParams{})
		cancel()
	}
	return got, full, wake, err
}

// roundUp rounds d up to a multiple of precision (precision <= 0: d), so
// tasks due within one precision step are popped by one wake, never before
// they are due.
func roundUp(d, precision time.Duration) time.Duration {
	if precision <= 0 {
		return d
	}
	return (d + precision - 1) / precision * precision
}

// creditGroup is the free credit of the streams that take the same kinds.
type creditGroup struct {
	key   string   // stream.kindKey; "" for every kind
	kinds []string // nil for every kind
	free  int
}

// creditGroups returns the free credit per set of kinds, the groups with
// kinds first (in key order), every kind last, so a stream of given kinds
// gets the tasks of those kinds before one that takes anything.
func (n *namespace) creditGroups() []creditGroup {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []creditGroup
	for _, st := range n.streams {
		i := slices.IndexFunc(out, func(g creditGroup) bool { return g.key == st.kindKey })
		if i < 0 {
			out = append(out, creditGroup{key: st.kindKey, kinds: st.kinds})
			i = len(out) - 1
		}
		out[i].free += st.room()
	}
	slices.SortFunc(out, func(a, b creditGroup) int {
		if (a.key == "") != (b.key == "") {
			if a.key == "" {
				return 1
			}
			return -1
		}
		return strings.Compare(a.key, b.key)
	})
	return out
}

// onlyKinds reports whether every stream takes given kinds only (so due
// tasks may be of kinds nobody takes).
func (n *namespace) onlyKinds() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, st := range n.streams {
		if st.kindKey == "" {
			return false
		}
	}
	return len(n.streams) > 0
}

// popGroup pops for the free credit of one group of streams (see pop) and
// hands what it popped to those streams.
func (n *namespace) popGroup(ctx context.Context, g creditGroup, pol storage.Policy) (got int, full bool, wake storage.PopResult, err error) {
	cfg := &n.d.cfg
	free := g.free
	leaseFor := pol.AckTimeout
	// The store lease is the short liveness lease, renewed while this
	// replica holds the delivery; the subscriber is told the ack timeout.
	storeLease := leaseFor
	if cfg.Liveness > 0 && cfg.Liveness < leaseFor {
		storeLease = cfg.Liveness
	}
	// Fan out only while a backlog drains (the last round came back
	// full): under a steady flow one Pop finds the few tasks that just fell
	// due, and more calls would only cost Redis and this loop.
	calls := 1
	if n.popFull {
		calls = min(cfg.PopConcurrency, (free+cfg.PopBatch-1)/cfg.PopBatch)
	}
	limits := make([]int, calls)
	for i, left := 0, free; i < calls; i++ {
		limits[i] = min(left, cfg.PopBatch)
		left -= limits[i]
	}
	results := make([][]storage.Delivery, calls)
	wakes := make([]storage.PopResult, calls)
	errs := make([]error, calls)
	ids := make([]string, calls)
	for i := range ids {
		ids[i] = n.d.popID()
	}
	before := cfg.Clock.Now()
	popOne := func(i int) {
		c, cancel := context.WithTimeout(ctx, cfg.StoreTimeout)
		defer cancel()
		wakes[i], errs[i] = cfg.Store.PopWake(c, n.name, storage.PopParams{Limit: limits[i], LeaseFor: storeLease, TellFor: leaseFor,
			MaxRate: pol.MaxDispatchRate, Burst: storage.DispatchBurst(pol.MaxDispatchRate), Kinds: g.kinds,
			RequestID: ids[i], RequestWindow: cfg.popRecordWindow()})
		results[i] = wakes[i].Deliveries
		wakes[i].Deliveries = nil
	}
	if calls > 1 {
		var wg sync.WaitGroup
		for i := 1; i < calls; i++ {
			wg.Go(func() { popOne(i) })
		}
		popOne(0)
		wg.Wait()
	} else {
		popOne(0)
	}
	// The store's deadline is store-now + the lease; reading the local
	// clock after the calls errs on the late side, so credit is never freed
	// before the store's lease really ended.
	popped := cfg.Clock.Now()
	deadline := popped.Add(leaseFor)
	full = true
	all := results[0]
	for i, dels := range results {
		if i > 0 {
			all = append(all, dels...)
		}
		if err == nil && errs[i] != nil {
			err = errs[i]
		}
		if len(dels) < limits[i] {
			full = false
		}
		// The call that ran last in the store saw the others' moves: its
		// answer of the next wake is the one to plan by.
		if errs[i] == nil && !wakes[i].Now.Before(wake.Now) {
			wake = wakes[i]
		}
	}
	if calls > 1 {
		// Each call's batch is in due order, but the calls ran in Redis in
		// any order: merge them, so every stream receives its share of the
		// round in due order.
		slices.SortStableFunc(all, func(a, b storage.Delivery) int { return a.Task.DueTime.Compare(b.Task.DueTime) })
	}
	dist := distribution{deadline: deadline, popped: popped, leaseFor: leaseFor, storeLease: storeLease, kindKey: g.key}
	if err != nil {
		n.lost(ids, errs, results, before, dist)
	}
	if len(all) > 0 {
		// The store answered each lease deadline as its time of the pop
		// plus storeLease: that time minus the local time before the calls
		// is how far the store's clock may be ahead of the local one.
		ahead := all[0].LeaseDeadline.Add(-storeLease).Sub(before)
		for _, del := range all[1:] {
			ahead = max(ahead, del.LeaseDeadline.Add(-storeLease).Sub(before))
		}
		dist.ahead = ahead
		n.distribute(all, dist)
		got = len(all)
	}
	return got, full, wake, err
}

// distribution is what distribute needs to know about one pop round.
type distribution struct {
	deadline   time.Time     // local estimate of the deadline the subscriber is told
	popped     time.Time     // local time after the pop
	leaseFor   time.Duration // the ack timeout the subscriber is told
	storeLease time.Duration // the lease the pop asked the store for
	ahead      time.Duration // see namespace.ahead
	kindKey    string        // the streams the round was popped for (stream.kindKey)
}
