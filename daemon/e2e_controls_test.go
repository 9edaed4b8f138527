package daemon

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/fieldmaskpb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
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
