package metrics

import (
	"context"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/delayd/delayd/storage"
)

// fakeStore answers every call at once with results made up front, so the
// allocations measured are the instrumentation's alone.
type fakeStore struct {
	storage.Store
	sts   []storage.TokenStatus
	moved []storage.Moved
	dels  []storage.Delivery
	ups   []storage.UpsertResult
	ext   []storage.ExtendResult
}

func (f *fakeStore) Upsert(context.Context, string, []storage.UpsertSpec) ([]storage.UpsertResult, error) {
	return f.ups, nil
}

func (f *fakeStore) Remove(context.Context, string, string, storage.Version) (storage.State, error) {
	return storage.StateScheduled, nil
}

func (f *fakeStore) RemoveTasks(context.Context, string, storage.RemoveTasksParams) (storage.RemoveTasksResult, error) {
	return storage.RemoveTasksResult{Removed: 2}, nil
}

func (f *fakeStore) Extend(context.Context, string, []storage.Token, time.Duration) ([]storage.ExtendResult, error) {
	return f.ext, nil
}

func (f *fakeStore) Ack(context.Context, string, []storage.Token) ([]storage.TokenStatus, error) {
	return f.sts, nil
}

func (f *fakeStore) Nack(context.Context, string, []storage.Token, storage.NackOptions) ([]storage.TokenStatus, []storage.Moved, error) {
	return f.sts, f.moved, nil
}

func (f *fakeStore) Reap(context.Context, string, int, storage.NackOptions) ([]storage.Moved, error) {
	return f.moved, nil
}

func (f *fakeStore) Pop(context.Context, string, storage.PopParams) ([]storage.Delivery, error) {
	return f.dels, nil
}

// TestReportsDoNotAllocate: the per-task reports (lateness, subscriber
// changes) and every instrumented per-task store call (the upsert, remove,
// pop, ack, nack, extend and reap paths) allocate nothing once a
// namespace's children are resolved.
func TestReportsDoNotAllocate(t *testing.T) {
	m := New(Options{})
	fake := &fakeStore{
		sts:   []storage.TokenStatus{storage.TokenOK, storage.TokenStale},
		moved: []storage.Moved{{State: storage.StateScheduled}, {State: storage.StateDead}},
		dels:  make([]storage.Delivery, 3),
		ups:   []storage.UpsertResult{{}, {Stale: true}},
		ext:   make([]storage.ExtendResult, 2),
	}
	s := m.InstrumentStore("redis", fake)
	ctx := context.Background()
	tokens := []storage.Token{{}, {}}
	specs := make([]storage.UpsertSpec, 2)
	m.Delivered("orders", time.Millisecond) // resolve the children once
	m.Pushed("orders", storage.PushOK, time.Millisecond)
	for name, fn := range map[string]func(){
		"Upsert":      func() { _, _ = s.Upsert(ctx, "orders", specs) },
		"Remove":      func() { _, _ = s.Remove(ctx, "orders", "t1", storage.Version{}) },
		"RemoveTasks": func() { _, _ = s.RemoveTasks(ctx, "orders", storage.RemoveTasksParams{}) },
		"Extend":      func() { _, _ = s.Extend(ctx, "orders", tokens, time.Second) },
		"Delivered":   func() { m.Delivered("orders", 3*time.Millisecond) },
		"Subscribers": func() { m.Subscribers("orders", 1); m.Subscribers("orders", -1) },
		"Pushed":      func() { m.Pushed("orders", storage.PushTimeout, time.Second) },
		"Pop":         func() { _, _ = s.Pop(ctx, "orders", storage.PopParams{Limit: 10, LeaseFor: time.Second}) },
		"Ack":         func() { _, _ = s.Ack(ctx, "orders", tokens) },
		"Nack":        func() { _, _, _ = s.Nack(ctx, "orders", tokens, storage.NackOptions{}) },
		"Reap":        func() { _, _ = s.Reap(ctx, "orders", 10, storage.NackOptions{}) },
	} {
		if n := testing.AllocsPerRun(1000, fn); n != 0 {
			t.Errorf("%s allocates %v times per call, want 0", name, n)
		}
	}
}

// TestNamespaceLabelIsBounded: past MaxNamespaces, namespaces share the
// "_other" series, so a tenant flood cannot grow the series without bound.
func TestNamespaceLabelIsBounded(t *testing.T) {
	m := New(Options{MaxNamespaces: 2})
	for _, ns := range []string{"a", "b", "c", "d"} {
		m.Delivered(ns, time.Millisecond)
	}
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for series, want := range map[string]bool{
		`delayd_delivery_lateness_seconds_count{namespace="a"} 1`:      true,
		`delayd_delivery_lateness_seconds_count{namespace="b"} 1`:      true,
		`delayd_delivery_lateness_seconds_count{namespace="c"}`:        false,
		`delayd_delivery_lateness_seconds_count{namespace="_other"} 2`: true,
	} {
		if got := strings.Contains(string(body), series); got != want {
			t.Errorf("exposition contains %s: %v, want %v", series, got, want)
		}
	}
}

// TestStoreCountsOutcomes: the instrumented store counts what the calls
// did (only OK tokens, dead moves) and times every call.
func TestStoreCountsOutcomes(t *testing.T) {
	m := New(Options{})
	fake := &fakeStore{
		sts:   []storage.TokenStatus{storage.TokenOK, storage.TokenStale, storage.TokenOK},
		moved: []storage.Moved{{State: storage.StateScheduled}, {State: storage.StateDead}},
	}
	s := m.InstrumentStore("redis", fake)
	ctx := context.Background()
	_, _ = s.Ack(ctx, "ns", nil)
	_, _, _ = s.Nack(ctx, "ns", nil, storage.NackOptions{})
	_, _ = s.Reap(ctx, "ns", 10, storage.NackOptions{})
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	for _, series := range []string{
		`delayd_tasks_acked_total{namespace="ns"} 2`,
		`delayd_tasks_nacked_total{namespace="ns"} 2`,
		`delayd_leases_expired_total{namespace="ns"} 2`,
		`delayd_tasks_dead_total{namespace="ns"} 2`, // one from the nack, one from the reap
		`delayd_store_call_duration_seconds_count{op="reap",store="redis"} 1`,
		`delayd_store_errors_total{op="reap",store="redis"} 0`,
	} {
		if !strings.Contains(body, series) {
			t.Errorf("exposition lacks %s", series)
		}
	}
}

// TestLibraryLoadsCounted: loads of the Lua library are counted by reason
// under the name docs/operating.md gives.
func TestLibraryLoadsCounted(t *testing.T) {
	m := New(Options{})
	m.LibraryLoaded("start")
	m.LibraryLoaded("missing")
	m.LibraryLoaded("missing")
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	for _, series := range []string{
		`delayd_redis_library_loads_total{reason="start"} 1`,
		`delayd_redis_library_loads_total{reason="missing"} 2`,
	} {
		if !strings.Contains(body, series) {
			t.Errorf("exposition lacks %s", series)
		}
	}
}

// TestPushedCountsOutcomes: push requests are counted per namespace and
// outcome, under the names docs/operating.md gives; namespaces that never
// push export no push series.
func TestPushedCountsOutcomes(t *testing.T) {
	m := New(Options{})
	m.Delivered("quiet", time.Millisecond)
	m.Pushed("hooks", storage.PushOK, 10*time.Millisecond)
	m.Pushed("hooks", storage.PushOK, 10*time.Millisecond)
	m.Pushed("hooks", storage.PushHTTPError, time.Second)
	m.Pushed("hooks", storage.PushTimeout, 30*time.Second)
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for series, want := range map[string]bool{
		`delayd_push_requests_total{namespace="hooks",outcome="ok"} 2`:            true,
		`delayd_push_requests_total{namespace="hooks",outcome="http_error"} 1`:    true,
		`delayd_push_requests_total{namespace="hooks",outcome="timeout"} 1`:       true,
		`delayd_push_requests_total{namespace="hooks",outcome="connect_error"} 0`: true,
		`delayd_push_requests_total{namespace="hooks",outcome="refused"} 0`:       true,
		`delayd_push_request_duration_seconds_count{namespace="hooks"} 4`:         true,
		`delayd_push_requests_total{namespace="quiet"`:                            false,
	} {
		if got := strings.Contains(string(body), series); got != want {
			t.Errorf("exposition contains %s: %v, want %v", series, got, want)
		}
	}
}
