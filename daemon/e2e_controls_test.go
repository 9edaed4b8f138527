package daemon

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
)

// End-to-end tests of the delivery controls (issue 16) over real Redis,
// with two replicas where a control is claimed to hold across replicas.

// setPaused sets the namespace's policy.paused through replica r.
func (e *e2eEnv) setPaused(r *started, paused bool) {
	e.t.Helper()
	_, err := delaydv1.NewNamespaceServiceClient(r.conn).UpdateNamespace(ctxFor(e.t), &delaydv1.UpdateNamespaceRequest{
		Namespace:  &delaydv1.Namespace{Name: e.ns, Policy: &delaydv1.NamespacePolicy{Paused: paused}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"policy.paused"}},
	})
	if err != nil {
		e.t.Fatalf("UpdateNamespace(paused=%v): %v", paused, err)
	}
}

func (e *e2eEnv) stats(r *started) *delaydv1.GetNamespaceStatsResponse {
	e.t.Helper()
	st, err := delaydv1.NewNamespaceServiceClient(r.conn).GetNamespaceStats(ctxFor(e.t), &delaydv1.GetNamespaceStatsRequest{Namespace: e.ns})
	if err != nil {
		e.t.Fatalf("GetNamespaceStats: %v", err)
	}
	return st
}

// TestE2EPauseResumeAcrossReplicas: a pause made through replica A stops
// the deliveries of replica B's subscriber (upserts, gets and acks still
// work; the delivery already out is acked), stats on B say paused, and a
// resume through A makes B deliver the waiting tasks.
func TestE2EPauseResumeAcrossReplicas(t *testing.T) {
	t.Parallel()
	e, a := newE2E(t, testRedisURL())
	b := e.replica()
	s := e.subscribe(b, 10)

	e.upsert(a, "before", 0)
	held := s.next(t)

	e.setPaused(a, true)
	// The announcement travels over Redis pub/sub; give it a moment so the
	// pause is in force on B before the tasks fall due.
	time.Sleep(e2eQuiet)
	for _, id := range []string{"p1", "p2", "p3"} {
		e.upsert(a, id, 0)
	}
	select {
	case d := <-s.ch:
		t.Fatalf("delivered %s while paused", d.GetTask().GetId())
	case <-time.After(e2eQuiet):
	}
	if st := e.ack(b, held.GetToken()); st[0] != delaydv1.TokenStatus_TOKEN_STATUS_OK {
		t.Fatalf("ack of the delivery made before the pause: %v, want OK", st[0])
	}
	got, err := a.tasks.GetTask(ctxFor(t), &delaydv1.GetTaskRequest{Namespace: e.ns, Id: "p1"})
	if err != nil || got.GetTask().GetState() != delaydv1.TaskState_TASK_STATE_SCHEDULED {
		t.Fatalf("GetTask(p1) while paused: %v, %v; want SCHEDULED", got.GetTask().GetState(), err)
	}
	st := e.stats(b)
	if !st.GetPaused() || st.GetDueNow() != 3 || st.GetDelivered() != 0 {
		t.Fatalf("stats on B while paused: paused %v due_now %d delivered %d; want true, 3, 0",
			st.GetPaused(), st.GetDueNow(), st.GetDelivered())
	}

	resumed := time.Now()
	e.setPaused(a, false)
	seen := map[string]bool{}
	for range 3 {
		d := s.next(t)
		seen[d.GetTask().GetId()] = true
		e.ack(b, d.GetToken())
	}
	t.Logf("B delivered the 3 waiting tasks %s after the resume through A", time.Since(resumed))
	if !seen["p1"] || !seen["p2"] || !seen["p3"] {
		t.Fatalf("after resume delivered %v, want p1, p2, p3", seen)
	}
	if e.stats(b).GetPaused() {
		t.Fatalf("stats on B after resume: paused true, want false")
	}
}

// update changes the policy fields paths name through replica r.
func (e *e2eEnv) update(r *started, pol *delaydv1.NamespacePolicy, paths ...string) {
	e.t.Helper()
	_, err := delaydv1.NewNamespaceServiceClient(r.conn).UpdateNamespace(ctxFor(e.t), &delaydv1.UpdateNamespaceRequest{
		Namespace:  &delaydv1.Namespace{Name: e.ns, Policy: pol},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: paths},
	})
	if err != nil {
		e.t.Fatalf("UpdateNamespace(%v): %v", paths, err)
	}
}

// TestE2EUpdateNamespaceMask (issue 41): over gRPC, a pause with
// update_mask policy.paused leaves the namespace's dispatch-rate cap as it
// was; the same pause without a mask (or with a mask of no path) is refused
// naming update_mask and changes nothing, where it used to reset every
// other policy field (the cap of 50 became unlimited).
func TestE2EUpdateNamespaceMask(t *testing.T) {
	t.Parallel()
	e, a := newE2E(t, testRedisURL())
	nsc := delaydv1.NewNamespaceServiceClient(a.conn)
	e.update(a, &delaydv1.NamespacePolicy{MaxDispatchRate: 50, MaxAttempts: 3}, "policy.max_dispatch_rate", "policy.max_attempts")
	policy := func() *delaydv1.NamespacePolicy {
		t.Helper()
		got, err := nsc.GetNamespace(ctxFor(t), &delaydv1.GetNamespaceRequest{Namespace: e.ns})
		if err != nil {
			t.Fatalf("GetNamespace: %v", err)
		}
		return got.GetNamespace().GetPolicy()
	}

	pause := &delaydv1.NamespacePolicy{Paused: true}
	for _, mask := range []*fieldmaskpb.FieldMask{nil, {}} {
		_, err := nsc.UpdateNamespace(ctxFor(t), &delaydv1.UpdateNamespaceRequest{
			Namespace: &delaydv1.Namespace{Name: e.ns, Policy: pause}, UpdateMask: mask,
		})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "update_mask is required") ||
			!strings.Contains(err.Error(), "policy.paused") {
			t.Errorf("UpdateNamespace without a mask (%v): %v; want InvalidArgument naming update_mask and its paths", mask, err)
		}
	}
	if p := policy(); p.GetPaused() || p.GetMaxDispatchRate() != 50 || p.GetMaxAttempts() != 3 {
		t.Fatalf("after the refused updates: paused %v, max_dispatch_rate %v, max_attempts %d; want false, 50, 3",
			p.GetPaused(), p.GetMaxDispatchRate(), p.GetMaxAttempts())
	}

	e.update(a, pause, "policy.paused")
	if p := policy(); !p.GetPaused() || p.GetMaxDispatchRate() != 50 || p.GetMaxAttempts() != 3 {
		t.Fatalf("after a pause with its mask: paused %v, max_dispatch_rate %v, max_attempts %d; want true, 50, 3",
			p.GetPaused(), p.GetMaxDispatchRate(), p.GetMaxAttempts())
	}
	// The whole policy, on purpose: what it leaves unset takes the defaults.
	e.update(a, &delaydv1.NamespacePolicy{MaxAttempts: 5}, "policy")
	if p := policy(); p.GetPaused() || p.GetMaxDispatchRate() != 0 || p.GetMaxAttempts() != 5 {
		t.Fatalf("after replacing the policy: paused %v, max_dispatch_rate %v, max_attempts %d; want false, 0, 5",
			p.GetPaused(), p.GetMaxDispatchRate(), p.GetMaxAttempts())
	}
}

// popRecord is one delivery as a subscriber saw it.
type popRecord struct {
	id      string
	replica int
	// popped is when the store leased the task, by the store's clock: the
	// lease deadline minus the namespace's ack timeout (one hour).
	popped time.Time
}

// TestE2EDispatchRateCapAcrossReplicas: a backlog of 200 due tasks in a
// namespace capped at 50 deliveries/s, drained by subscribers on two
// replicas, is delivered once each, by both replicas, and never faster
// than the cap: in every one-second window of the store's pop times at
// most 50 + the burst (5), and the whole backlog takes about 4 s (at least
// 195/50 s by the store's clock). Pop times come from the lease deadlines
// (store clock), so a loaded machine cannot make the test fail, only slow.
func TestE2EDispatchRateCapAcrossReplicas(t *testing.T) {
	t.Parallel()
	const (
		n    = 200
		rate = 50.0
	)
	burst := storage.DispatchBurst(rate)
	e, a := newE2E(t, testRedisURL())
	b := e.replica()
	e.update(a, &delaydv1.NamespacePolicy{MaxDispatchRate: rate}, "policy.max_dispatch_rate")
	now := timestamppb.New(e.redisNow())
	e.batchUpsert([]*started{a}, "r", n, func(int) *timestamppb.Timestamp { return now })

	var (
		mu   sync.Mutex
		recs []popRecord
		wg   sync.WaitGroup
	)
	for i, r := range []*started{a, b} {
		s := e.subscribe(r, 1000)
		dlv := delaydv1.NewDeliveryServiceClient(r.conn)
		wg.Go(func() {
			for d := range s.ch {
				mu.Lock()
				recs = append(recs, popRecord{id: d.GetTask().GetId(), replica: i,
					popped: d.GetLeaseDeadline().AsTime().Add(-time.Hour)})
				mu.Unlock()
				if _, err := dlv.AckTasks(context.Background(), &delaydv1.AckTasksRequest{Namespace: e.ns, Tokens: []string{d.GetToken()}}); err != nil {
					t.Errorf("AckTasks: %v", err)
				}
			}
		})
		t.Cleanup(s.end)
	}
	testkit.Eventually(t, 60*time.Second, fmt.Sprintf("%d deliveries", n), func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(recs) >= n
	})
	time.Sleep(e2eQuiet) // duplicates, if any, show
	mu.Lock()
	got := slices.Clone(recs)
	mu.Unlock()

	seen := map[string]int{}
	perReplica := [2]int{}
	for _, r := range got {
		seen[r.id]++
		perReplica[r.replica]++
	}
	if len(seen) != n || len(got) != n {
		t.Fatalf("%d deliveries of %d distinct tasks, want %d of %d", len(got), len(seen), n, n)
	}
	if perReplica[0] == 0 || perReplica[1] == 0 {
		t.Fatalf("deliveries per replica %v: want both replicas delivering (the cap is shared)", perReplica)
	}
	slices.SortFunc(got, func(x, y popRecord) int { return x.popped.Compare(y.popped) })
	span := got[n-1].popped.Sub(got[0].popped)
	minSpan := time.Duration(float64(n-burst) / rate * float64(time.Second))
	// A pop time is whole milliseconds; allow that much rounding.
	if span < minSpan-10*time.Millisecond {
		t.Errorf("200 tasks popped within %s by the store's clock; at %g/s with burst %d they need at least %s", span, rate, burst, minSpan)
	}
	worst := 0
	for i := range got {
		j := i
		for j < n && got[j].popped.Sub(got[i].popped) < time.Second {
			j++
		}
		worst = max(worst, j-i)
	}
	if limit := int(rate) + burst + 1; worst > limit {
		t.Errorf("%d tasks popped within one second; the cap allows %d (rate %g + burst %d, +1 for ms rounding)", worst, limit, rate, burst)
	}
	t.Logf("200 tasks at %g/s: popped over %s (store clock), at most %d in any 1 s window, per replica %v", rate, span, worst, perReplica)
}

// TestE2ESubscribeKinds: over gRPC, a stream with kinds receives only
// tasks of those kinds (one of them the empty kind), a task of another
// kind stays SCHEDULED and counts in due_now, and a request with too many
// kinds is refused naming the field.
func TestE2ESubscribeKinds(t *testing.T) {
	t.Parallel()
	e, r := newE2E(t, testRedisURL())
	dlv := delaydv1.NewDeliveryServiceClient(r.conn)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := dlv.Subscribe(ctx, &delaydv1.SubscribeRequest{Namespace: e.ns, MaxInFlight: 10, Kinds: []string{"order.close", ""}})
	if err == nil {
		_, err = stream.Header()
	}
	if err != nil {
		t.Fatalf("Subscribe with kinds: %v", err)
	}
	for id, kind := range map[string]string{"close-1": "order.close", "plain-1": "", "remind-1": "order.remind"} {
		if _, err := r.tasks.UpsertTask(ctxFor(t), &delaydv1.UpsertTaskRequest{Namespace: e.ns, Id: id, Kind: kind,
			When: &delaydv1.UpsertTaskRequest_Delay{Delay: durationpb.New(0)}}); err != nil {
			t.Fatalf("UpsertTask(%s): %v", id, err)
		}
	}
	got := map[string]bool{}
	for range 2 {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		got[resp.GetDelivery().GetTask().GetId()] = true
	}
	if !got["close-1"] || !got["plain-1"] {
		t.Fatalf("stream of order.close and \"\" received %v, want close-1 and plain-1", got)
	}
	time.Sleep(e2eQuiet)
	task, err := r.tasks.GetTask(ctxFor(t), &delaydv1.GetTaskRequest{Namespace: e.ns, Id: "remind-1"})
	if err != nil || task.GetTask().GetState() != delaydv1.TaskState_TASK_STATE_SCHEDULED {
		t.Fatalf("remind-1, a kind no stream takes: %v, %v; want SCHEDULED", task.GetTask().GetState(), err)
	}
	if st := e.stats(r); st.GetDueNow() != 1 || st.GetDueByKind()["order.remind"] != 1 || len(st.GetDueByKind()) != 1 {
		t.Fatalf("due_now = %d, due_by_kind = %v; want 1, {order.remind: 1} (remind-1 waits for a stream of its kind)",
			st.GetDueNow(), st.GetDueByKind())
	}

	many := make([]string, 33)
	for i := range many {
		many[i] = fmt.Sprintf("k%d", i)
	}
	bad, err := dlv.Subscribe(ctx, &delaydv1.SubscribeRequest{Namespace: e.ns, Kinds: many})
	if err == nil {
		_, err = bad.Recv()
	}
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "kinds") {
		t.Fatalf("Subscribe with 33 kinds: %v; want InvalidArgument naming kinds", err)
	}
}
