package server_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/storagefake"
)

// TestFairDispatch: one namespace draining a backlog of 100,000 due tasks
// does not hold up another namespace's due task on the same replica — the
// quiet namespace's task is delivered while the busy backlog is still
// draining (asserted by the busy namespace's count of due tasks at that
// moment, not by a clock).
func TestFairDispatch(t *testing.T) {
	if testing.Short() {
		t.Skip("100,000 tasks; skipped with -short")
	}
	t.Parallel()
	const backlog = 100_000
	e := newTenEnv(t)
	r := e.replica(tenOpts{})
	pol := &delaydv1.NamespacePolicy{AckTimeout: durationpb.New(time.Hour)}
	busy := e.newNamespace(r, "fair-busy-", pol)
	quiet := e.newNamespace(r, "fair-quiet-", pol)

	// The backlog, all due already, written straight into the index.
	ctx := context.Background()
	specs := make([]storage.UpsertSpec, storagefake.MaxBatch)
	for b := 0; b < backlog/storagefake.MaxBatch; b++ {
		for i := range specs {
			specs[i] = storage.UpsertSpec{ID: "b" + strconv.Itoa(b*storagefake.MaxBatch+i), Payload: []byte("x"), Delay: -time.Second}
		}
		if _, err := e.store.Upsert(ctx, busy, specs); err != nil {
			t.Fatalf("seed backlog: %v", err)
		}
	}

	// The busy subscriber drains the backlog: it acks what it gets, in
	// batches, as a real consumer would.
	bctx, stopBusy := context.WithCancel(admin())
	var drained atomic.Int64
	var wg sync.WaitGroup
	defer func() { stopBusy(); wg.Wait() }()
	stream, err := r.dlv.Subscribe(bctx, &delaydv1.SubscribeRequest{Namespace: busy, MaxInFlight: 1000})
	if err != nil {
		t.Fatal(err)
	}
	firstBusy := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		var tokens []string
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			if drained.Add(1) == 1 {
				close(firstBusy)
			}
			tokens = append(tokens, resp.GetDelivery().GetToken())
			if len(tokens) == 100 {
				if _, err := r.dlv.AckTasks(bctx, &delaydv1.AckTasksRequest{Namespace: busy, Tokens: tokens}); err != nil {
					return
				}
				tokens = tokens[:0]
			}
		}
	}()
	select {
	case <-firstBusy:
	case <-time.After(dlvWait):
		t.Fatal("the busy namespace delivered nothing")
	}

	// The quiet namespace gets one task, due now, while the busy one drains.
	qctx, stopQuiet := context.WithCancel(admin())
	defer stopQuiet()
	qstream, err := r.dlv.Subscribe(qctx, &delaydv1.SubscribeRequest{Namespace: quiet, MaxInFlight: 10})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := qstream.Header(); err != nil {
		t.Fatal(err)
	}
	if err := upsertAs(admin(), r, quiet, "q1"); err != nil {
		t.Fatal(err)
	}
	resp, err := qstream.Recv()
	if err != nil {
		t.Fatalf("quiet subscriber: %v", err)
	}
	st, err := e.store.Stats(ctx, busy)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("quiet task delivered after %d of %d busy deliveries; busy still has %d due, %d in flight",
		drained.Load(), backlog, st.DueNow, st.Delivered)
	if resp.GetDelivery().GetTask().GetId() != "q1" {
		t.Errorf("quiet delivery = %v", resp.GetDelivery().GetTask())
	}
	if st.DueNow == 0 {
		t.Errorf("the busy backlog had fully drained before the quiet task arrived (%d delivered): the quiet namespace waited for it", drained.Load())
	}
}
