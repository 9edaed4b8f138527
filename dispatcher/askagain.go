package dispatcher

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"strconv"
	"time"

	"github.com/delayd/delayd/storage"
)

// Pops that can be asked again (issue 38). A pop's answer can be lost after
// the store did the work: a store timeout while Redis was stalled, a cut
// connection; the tasks it leased would wait, leased to nobody, until the
// liveness lease runs out, and then reach a subscriber as their second
// attempt. So every pop carries a request id (storage.PopParams.RequestID):
// a pop that failed is kept as asked, and the loop asks it again, with the
// same id and limit 0, before its next pop, until it answers. The answer is
// what the first one leased (handed to the streams like any pop's), or
// nothing — and then the store's record of that nothing cancels the first
// one, should it still run. A pop is asked again until the store's record
// of it may be gone (popRecordWindow after it was sent); then its tasks, if
// it ran, come back when their lease runs out, as before. A loop that ends
// with pops still asked asks each once more and hands back what it leased
// (giveUpAsked).

// popRecordTimeouts is how many store timeouts the store keeps the record
// of a pop (PopParams.RequestWindow): a stall shorter than that loses no
// answer, and the records take the pop rate times the window of memory.
const popRecordTimeouts = 6

// popRecordWindow is how long the store keeps the record of a pop.
func (c *Config) popRecordWindow() time.Duration {
	return popRecordTimeouts * c.StoreTimeout
}

// askedPop is a pop whose answer was lost (its call failed).
type askedPop struct {
	id    string
	since time.Time // when it was sent, by the local clock
	// got are the deliveries it already handed out: a sharded namespace's
	// pop answers what some shards leased with the error of the others,
	// and asked again answers those too.
	got  map[storage.Token]bool
	dist distribution // the streams and leases it was popped for
}

// newReqPrefix returns the random prefix of a dispatcher's request ids,
// so the ids of two replicas never meet.
func newReqPrefix() string {
	var b [6]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// popID returns a new request id for a pop.
func (d *Dispatcher) popID() string {
	return d.reqPrefix + "-" + strconv.FormatUint(d.reqSeq.Add(1), 36)
}

// lost records the pops of a round whose calls failed (ids[i] with
// errs[i] != nil), with what each handed out anyway, to be asked again.
func (n *namespace) lost(ids []string, errs []error, results [][]storage.Delivery, sent time.Time, p distribution) {
	for i, err := range errs {
		if err == nil {
			continue
		}
		a := askedPop{id: ids[i], since: sent, got: map[storage.Token]bool{}, dist: p}
		for _, del := range results[i] {
			a.got[del.Token] = true
		}
		n.asked = append(n.asked, a)
	}
}

// askAgain asks every pop whose answer was lost again (see the file
// comment) and hands out what they leased. A pop that still gets no answer
// stays asked; one whose record may be gone is given up. It returns the
// first error.
func (n *namespace) askAgain(ctx context.Context) error {
	cfg := &n.d.cfg
	window := cfg.popRecordWindow()
	var first error
	kept := n.asked[:0]
	for _, a := range n.asked {
		if cfg.Clock.Now().Sub(a.since) >= window {
			n.d.log.LogAttrs(ctx, slog.LevelWarn, "dispatcher: a pop whose answer was lost got none within its record's window; what it leased, if it ran, is delivered again when the lease runs out",
				slog.String("namespace", n.name), slog.String("request", a.id))
			continue
		}
		c, cancel := context.WithTimeout(ctx, cfg.StoreTimeout)
		before := cfg.Clock.Now()
		dels, err := n.ask(c, a)
		cancel()
		if len(dels) > 0 {
			p := a.dist
			p.popped = cfg.Clock.Now()
			p.deadline = p.popped.Add(p.leaseFor)
			// The store leased them when the first pop ran, maybe long
			// before this call or while it waited on a stalled store: an
			// upper bound of how far the store's clock is ahead, the
			// larger of this call's measure and the last pop's, so a lease
			// is taken to have run out early rather than late.
			p.ahead = dels[0].LeaseDeadline.Add(-p.storeLease).Sub(before)
			n.mu.Lock()
			if n.aheadKnown {
				p.ahead = max(p.ahead, n.ahead)
			}
			n.mu.Unlock()
			n.distribute(dels, p)
		}
		if err != nil {
			kept = append(kept, a)
			if first == nil {
				first = err
			}
			continue
		}
		n.d.log.LogAttrs(ctx, slog.LevelInfo, "dispatcher: a pop whose answer was lost was asked again",
			slog.String("namespace", n.name), slog.String("request", a.id), slog.Int("deliveries", len(dels)),
			slog.Duration("since", cfg.Clock.Now().Sub(a.since)))
	}
	clear(n.asked[len(kept):])
	n.asked = kept
	return first
}

// ask asks a again (its request id, limit 0) and returns the deliveries
// of its answer it had not handed out yet, marking them handed out.
func (n *namespace) ask(ctx context.Context, a askedPop) ([]storage.Delivery, error) {
	cfg := &n.d.cfg
	r, err := cfg.Store.PopWake(ctx, n.name, storage.PopParams{RequestID: a.id, RequestWindow: cfg.popRecordWindow(),
		LeaseFor: a.dist.storeLease, TellFor: a.dist.leaseFor})
	var fresh []storage.Delivery
	for _, del := range r.Deliveries {
		if !a.got[del.Token] {
			a.got[del.Token] = true
			fresh = append(fresh, del)
		}
	}
	return fresh, err
}

// giveUpAsked ends the pops still asked when the loop ends (its last
// stream left, or Stop): each is asked once more, within one StoreTimeout
// for all, and what it leased goes back unsent (handBack: due at once, no
// attempt spent) instead of waiting out its lease; one that has not run is
// cancelled by that ask, so it leases nothing when it runs late. A pop that
// gets no answer even now is left to its lease.
func (n *namespace) giveUpAsked() {
	if len(n.asked) == 0 {
		return
	}
	cfg := &n.d.cfg
	ctx, cancel := context.WithTimeout(n.d.base, cfg.StoreTimeout)
	defer cancel()
	var back []storage.Token
	for _, a := range n.asked {
		dels, err := n.ask(ctx, a)
		for _, del := range dels {
			back = append(back, del.Token)
		}
		if err != nil {
			n.d.log.LogAttrs(ctx, slog.LevelWarn, "dispatcher: a pop whose answer was lost could not be asked again as its namespace loop ended; what it leased, if it ran, is delivered again when the lease runs out",
				slog.String("namespace", n.name), slog.String("request", a.id), slog.String("error", err.Error()))
		}
	}
	clear(n.asked)
	n.asked = nil
	if len(back) > 0 {
		n.d.handBack(ctx, n, nil, back)
	}
}
