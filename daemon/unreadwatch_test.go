package daemon

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/server"
)

// liveHeapPooled is liveHeap after a second collection, which also drops
// what sync.Pools (grpc-go's buffer pools) kept through the first.
func liveHeapPooled() uint64 {
	runtime.GC()
	return liveHeap()
}

// TestUnreadWatchesAreEnded (issue 42 item 6): 95 watches that never read
// (their clients' windows fixed at 64 KiB) while 1,000 deliveries of 32 KiB
// fall due. While a watch stays behind it holds at most its buffer (256 KiB
// of copies, the one being sent included: it counts until the transport
// took it) and what the transport holds, in reply buffers sized to the
// message (the codec's replyPool); once a copy has waited
// dispatcher.DefaultWatchStall for the transport, the watch is ended with
// ResourceExhausted saying the client stopped reading, and its memory and
// its key's stream slot come free. The namespace's subscriber gets every
// delivery meanwhile. The live heap with the watches stuck stays within
// 64 MiB of its start (41 MiB measured) and within 16 MiB once they are
// ended. Before, a watch counted only its buffer (1 MiB), a 33 KiB reply
// took one of grpc-go's 1 MiB pool buffers for as long as the transport
// held it, and nothing ended a watch that stopped reading: +398 MiB, held
// until the client went away (the probe: 300 MiB live for 95
// watches). Not parallel: it measures the heap.
func TestUnreadWatchesAreEnded(t *testing.T) {
	const watches = 95
	rds := testkit.StartRedis(t)
	s := start(t, Config{RedisURL: rds.URL, AdminKey: guardAdminKey, LogLevel: "error",
		Limits: server.Limits{MaxStreamsPerKey: watches}})
	e := newGuardEnv(t, s, "unread-")
	_, watchKey := e.key(delaydv1.KeyScope_KEY_SCOPE_CONSUME)
	ctx, cancel := context.WithTimeout(asKey(context.Background(), watchKey), 2*time.Minute)
	defer cancel()

	base := liveHeapPooled()
	var streams []delaydv1.DeliveryService_WatchDeliveriesClient
	for i := range watches {
		if i%25 == 0 {
			// Fixed windows, as a client that does not read keeps them: the
			// server can put at most 64 KiB of a stream on the wire.
			conn, err := grpc.NewClient(s.d.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = conn.Close() })
			e.dlv = delaydv1.NewDeliveryServiceClient(conn)
		}
		st, err := e.dlv.WatchDeliveries(ctx, &delaydv1.WatchDeliveriesRequest{Namespace: e.ns})
		if err == nil {
			_, err = st.Header()
		}
		if err != nil {
			t.Fatalf("watch %d: %v", i, err)
		}
		streams = append(streams, st) // never read until the end
	}
	got := e.subscribe()

	const tasks, size, batch = 1000, 32 << 10, 100
	payload := make([]byte, size)
	for b := range tasks / batch {
		req := &delaydv1.BatchUpsertTasksRequest{Namespace: e.ns}
		for i := range batch {
			req.Tasks = append(req.Tasks, &delaydv1.UpsertTaskRequest{Id: fmt.Sprintf("t%d", b*batch+i), Payload: payload,
				When: &delaydv1.UpsertTaskRequest_Delay{Delay: durationpb.New(0)}})
		}
		if _, err := s.tasks.BatchUpsertTasks(e.admin, req); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]bool{}
	testkit.Eventually(t, time.Minute, "the subscriber to get every delivery", func() bool {
		for {
			select {
			case id := <-got:
				seen[id] = true
			default:
				return len(seen) == tasks
			}
		}
	})
	stuck := liveHeapPooled()
	t.Logf("%d unread watches, %d deliveries of %d KiB delivered: live heap %d MiB at the start, %+d MiB with the watches stuck",
		watches, tasks, size>>10, base>>20, (int64(stuck)-int64(base))>>20)

	// The watches are ended once a copy waited the stall: their key's
	// stream slots come free, so a new watch of the key is not refused
	// (a refused one ends at once; an open one waits for copies).
	testkit.Eventually(t, time.Minute, "a watch slot of the key to come free", func() bool {
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		defer pcancel()
		st, err := e.dlv.WatchDeliveries(pctx, &delaydv1.WatchDeliveriesRequest{Namespace: e.ns})
		if err == nil {
			_, err = st.Recv()
		}
		return status.Code(err) == codes.DeadlineExceeded
	})
	if grown := int64(stuck) - int64(base); grown > 64<<20 {
		t.Errorf("the live heap was %d MiB over its start with %d watches stuck; want at most 64", grown>>20, watches)
	}
	ended := 0
	for i, st := range streams {
		var err error
		for err == nil {
			_, err = st.Recv()
		}
		if status.Code(err) == codes.ResourceExhausted && strings.Contains(status.Convert(err).Message(), "stopped reading") {
			ended++
		} else if i < 3 {
			t.Logf("watch %d ended with %v", i, err)
		}
	}
	after := liveHeapPooled()
	t.Logf("after the watches ended: live heap %+d MiB over the start; %d of %d watches ended for not reading",
		(int64(after)-int64(base))>>20, ended, watches)
	if ended != watches {
		t.Errorf("%d of %d unread watches were ended with ResourceExhausted saying they stopped reading; want all", ended, watches)
	}
	if grown := int64(after) - int64(base); grown > 16<<20 {
		t.Errorf("the live heap is %d MiB over its start after the unread watches ended; want at most 16", grown>>20)
	}
}

// TestWatchesCannotTakeSubscriberSlots (issue 42 item 6): with
// max_subscribers 3, three watches of the namespace leave its subscriber
// slots alone: a subscriber still opens and gets its delivery, and a
// fourth watch is refused, naming the watch limit. Before, watches and
// subscribers shared the slots: the watches held all 3 and the subscriber
// was refused ResourceExhausted (the probe: 100 watches open, the
// namespace's subscribers refused and nothing delivered).
func TestWatchesCannotTakeSubscriberSlots(t *testing.T) {
	t.Parallel()
	s := start(t, Config{RedisURL: testRedisURL(), AdminKey: guardAdminKey, LogLevel: "error"})
	e := newGuardEnv(t, s, "wslots-")
	if _, err := e.nsc.UpdateNamespace(e.admin, &delaydv1.UpdateNamespaceRequest{
		Namespace:  &delaydv1.Namespace{Name: e.ns, Policy: &delaydv1.NamespacePolicy{MaxSubscribers: 3}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"policy.max_subscribers"}},
	}); err != nil {
		t.Fatal(err)
	}
	_, watcher := e.key(delaydv1.KeyScope_KEY_SCOPE_CONSUME)
	wctx, wcancel := context.WithCancel(asKey(context.Background(), watcher))
	defer wcancel()
	for range 3 {
		e.watch(wctx)
	}
	// A fourth watch is refused: watches have a cap of their own.
	st, err := e.dlv.WatchDeliveries(wctx, &delaydv1.WatchDeliveriesRequest{Namespace: e.ns})
	if err == nil {
		_, err = st.Recv()
	}
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(status.Convert(err).Message(), "watches") {
		t.Errorf("a fourth watch under max_subscribers 3: %v; want ResourceExhausted naming the watches", err)
	}

	ctx, cancel := context.WithTimeout(e.admin, 20*time.Second)
	defer cancel()
	sub, err := e.dlv.Subscribe(ctx, &delaydv1.SubscribeRequest{Namespace: e.ns, MaxInFlight: 1})
	if err != nil {
		t.Fatal(err)
	}
	e.due("after-watches")
	resp, err := sub.Recv()
	if err != nil || resp.GetDelivery().GetTask().GetId() != "after-watches" {
		t.Fatalf("a subscriber beside 3 watches under max_subscribers 3: %v, %v; want the delivery", resp, err)
	}
}
