package metrics

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delayd/delayd/storage"
)

// seriesOf returns the exposition lines with a series of namespace ns.
func seriesOf(body, ns string) []string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if strings.Contains(l, `namespace="`+ns+`"`) && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}

// report makes every per-namespace series of ns, through the instrumented
// store s and m's reports.
func report(m *Metrics, s storage.Store, ns string) {
	ctx := context.Background()
	_, _ = s.Upsert(ctx, ns, make([]storage.UpsertSpec, 1))
	_, _ = s.Ack(ctx, ns, nil)
	_, _ = s.Reap(ctx, ns, 10, storage.NackOptions{})
	m.Delivered(ns, time.Millisecond)
	m.Pushed(ns, storage.PushOK, time.Millisecond)
}

// TestForgetNamespaceDropsItsSeries: a forgotten namespace's task
// counters, lateness histogram and push series leave the exposition; its
// subscriber gauge stays while streams still count in it and goes at a
// later forget once it is zero; later reports start from zero; other
// namespaces' series stay.
func TestForgetNamespaceDropsItsSeries(t *testing.T) {
	m := New(Options{})
	s := m.InstrumentStore("redis", &fakeStore{ups: []storage.UpsertResult{{}},
		sts: []storage.TokenStatus{storage.TokenOK}, moved: []storage.Moved{{State: storage.StateDead}}})
	for _, ns := range []string{"orders", "other"} {
		report(m, s, ns)
		m.Subscribers(ns, 1)
	}
	before := seriesOf(scrape(t, m), "orders")
	if len(before) < 10 {
		t.Fatalf("orders has %d series before the forget, want every kind:\n%s", len(before), strings.Join(before, "\n"))
	}
	m.ForgetNamespace("orders")
	body := scrape(t, m)
	if got := seriesOf(body, "orders"); len(got) != 1 || got[0] != `delayd_subscribers{namespace="orders"} 1` {
		t.Errorf("after the forget, orders' series:\n%s\nwant only its subscriber gauge (a stream still open)", strings.Join(got, "\n"))
	}
	if got, want := len(seriesOf(body, "other")), len(before); got != want {
		t.Errorf("the other namespace has %d series after orders' forget, want %d", got, want)
	}
	m.Subscribers("orders", -1) // the stream ends
	m.ForgetNamespace("orders")
	if got := seriesOf(scrape(t, m), "orders"); len(got) != 0 {
		t.Errorf("after the stream ended and a second forget: %s", strings.Join(got, "\n"))
	}
	m.Delivered("orders", time.Millisecond)
	if body := scrape(t, m); !strings.Contains(body, `delayd_delivery_lateness_seconds_count{namespace="orders"} 1`) {
		t.Errorf("a report after the forget does not start from zero:\n%s", strings.Join(seriesOf(body, "orders"), "\n"))
	}
}

// TestDropNamespaceForgetsAtOnce: the instrumented store's DropNamespace
// of a namespace incarnation (DeleteNamespace) drops its series; a drop
// without one (an index rebuild) does not.
func TestDropNamespaceForgetsAtOnce(t *testing.T) {
	m := New(Options{})
	s := m.InstrumentStore("redis", &dropStore{})
	report(m, s, "orders")
	if _, err := s.DropNamespace(context.Background(), "orders", 0); err != nil {
		t.Fatal(err)
	}
	if got := seriesOf(scrape(t, m), "orders"); len(got) == 0 {
		t.Error("a drop without an incarnation (a rebuild) dropped the series")
	}
	if _, err := s.DropNamespace(context.Background(), "orders", 1_700_000_000_000); err != nil {
		t.Fatal(err)
	}
	if got := seriesOf(scrape(t, m), "orders"); len(got) != 0 {
		t.Errorf("after DeleteNamespace's drop: %s", strings.Join(got, "\n"))
	}
}

// dropStore is fakeStore with DropNamespace.
type dropStore struct{ fakeStore }

func (*dropStore) DropNamespace(context.Context, string, int64) (int64, error) { return 0, nil }

// registry answers namespaces from a map (absent: not found; a nil
// Namespace value's name "flaky": unavailable) and counts lookups.
type registry struct {
	nss     map[string]storage.Namespace
	lookups atomic.Int64
}

func (r *registry) Namespace(_ context.Context, ns string, create bool) (storage.Namespace, error) {
	r.lookups.Add(1)
	if create {
		return storage.Namespace{}, fmt.Errorf("a sweep created %s", ns)
	}
	if ns == "flaky" {
		return storage.Namespace{}, storage.ErrUnavailable
	}
	n, ok := r.nss[ns]
	if !ok {
		return storage.Namespace{}, storage.ErrNotFound
	}
	return n, nil
}

// TestSweepDropsDeletedAndRecreatedNamespaces: a scrape drops the series
// of a namespace the registry no longer has (deleted on another replica)
// and of one re-created since its series began (they were the old one's),
// and keeps those of a namespace that stands and of one the registry
// could not answer for; it asks the registry at most once per interval.
func TestSweepDropsDeletedAndRecreatedNamespaces(t *testing.T) {
	m := New(Options{})
	s := m.InstrumentStore("redis", &fakeStore{ups: []storage.UpsertResult{{}}})
	for _, ns := range []string{"gone", "recreated", "live", "flaky"} {
		report(m, s, ns)
	}
	now := time.Now()
	reg := &registry{nss: map[string]storage.Namespace{
		"recreated": {Name: "recreated", CreateTime: now.Add(time.Second)},
		"live":      {Name: "live", CreateTime: now.Add(-time.Hour)},
	}}
	m.ForgetDeleted(reg, time.Hour)
	body := scrape(t, m)
	for ns, want := range map[string]bool{"gone": false, "recreated": false, "live": true, "flaky": true} {
		if got := len(seriesOf(body, ns)) > 0; got != want {
			t.Errorf("%s has series after the sweep: %v, want %v", ns, got, want)
		}
	}
	if n := reg.lookups.Load(); n != 4 {
		t.Errorf("the sweep looked %d namespaces up, want the 4 with series", n)
	}
	report(m, s, "gone") // a late report of a call in flight at the delete
	scrape(t, m)
	if n := reg.lookups.Load(); n != 4 {
		t.Errorf("a second scrape within the interval looked namespaces up again: %d lookups", n)
	}
}
