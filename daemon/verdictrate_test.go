package daemon

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/fieldmaskpb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
)

// upsertLatencies upserts tasks of ns one after the other for d and
// returns each call's latency, sorted.
func upsertLatencies(t *testing.T, ctx context.Context, tasks delaydv1.TaskServiceClient, ns string, d time.Duration) []time.Duration {
	t.Helper()
	var lat []time.Duration
	for end := time.Now().Add(d); time.Now().Before(end); {
		at := time.Now()
		if _, err := tasks.UpsertTask(ctx, upsert(ns, "probe")); err != nil {
			t.Fatalf("the other tenant's upsert: %v", err)
		}
		lat = append(lat, time.Since(at))
	}
	slices.Sort(lat)
	return lat
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

// TestStreamVerdictsPayTheRateLimit (issue 42 item 5): every
// StreamDeliveries request that carries verdicts takes a token of its
// namespace's rate limit, as the unary AckTasks it replaces does; over the
// limit the stream waits for one (the client's sends back up), so the
// streams stay open. 4 streams of one consume key, each sending requests of
// 1,000 acks as fast as it can, under rate_limit 10/s (burst 10): the
// verdict answers stay within the burst plus 10 a second, and every stream
// is still open at the end. Before, only the stream's first request paid:
// the 4 streams sent 5,576 requests (5.58 M verdicts) in 10 s.
// Another tenant's upsert latency is logged beside its control (a figure,
// not an assertion). Not parallel: it measures latency.
func TestStreamVerdictsPayTheRateLimit(t *testing.T) {
	s := start(t, Config{RedisURL: testRedisURL(), AdminKey: guardAdminKey, LogLevel: "error"})
	flooder := newGuardEnv(t, s, "vrate-")
	other := newGuardEnv(t, s, "vrate-other-")
	const rate, burst = 10, 10
	if _, err := flooder.nsc.UpdateNamespace(flooder.admin, &delaydv1.UpdateNamespaceRequest{
		Namespace:  &delaydv1.Namespace{Name: flooder.ns, Policy: &delaydv1.NamespacePolicy{RateLimit: rate, RateBurst: burst}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"policy.rate_limit", "policy.rate_burst"}},
	}); err != nil {
		t.Fatal(err)
	}
	_, consume := flooder.key(delaydv1.KeyScope_KEY_SCOPE_CONSUME)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	control := upsertLatencies(t, other.admin, s.tasks, other.ns, 2*time.Second)

	// One real delivery's token, acked 1,000 times a request: the first
	// ack deletes the task, the rest are answered stale by the store.
	flooder.due("t")
	dlv := delaydv1.NewDeliveryServiceClient(s.conn)
	var token string
	{
		sctx, scancel := context.WithCancel(asKey(ctx, consume))
		st, err := dlv.StreamDeliveries(sctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&delaydv1.StreamDeliveriesRequest{Namespace: flooder.ns, MaxInFlight: 1}); err != nil {
			t.Fatal(err)
		}
		resp, err := st.Recv()
		if err != nil || len(resp.GetDeliveries()) == 0 {
			t.Fatalf("the first delivery: %v, %v", resp, err)
		}
		token = resp.GetDeliveries()[0].GetToken()
		scancel()
	}
	acks := make([]string, 1000)
	for i := range acks {
		acks[i] = token
	}

	const streams = 4
	var answered atomic.Int64
	floodCtx, stopFlood := context.WithCancel(asKey(ctx, consume))
	defer stopFlood()
	// Every stream is open before any sends verdicts: an opening is
	// charged too, and refused (not waited for) over the limit.
	var open []delaydv1.DeliveryService_StreamDeliveriesClient
	for i := range streams {
		st, err := dlv.StreamDeliveries(floodCtx)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&delaydv1.StreamDeliveriesRequest{Namespace: flooder.ns, MaxInFlight: 1}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Header(); err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
		open = append(open, st)
	}
	var mu sync.Mutex
	var endedEarly []error // what ended a stream before the flood stopped
	var wg sync.WaitGroup
	for _, st := range open {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for st.Send(&delaydv1.StreamDeliveriesRequest{AckTokens: acks}) == nil {
			}
		}()
		go func() {
			defer wg.Done()
			for {
				resp, err := st.Recv()
				if err != nil {
					if floodCtx.Err() == nil {
						mu.Lock()
						endedEarly = append(endedEarly, err)
						mu.Unlock()
					}
					return
				}
				if len(resp.GetAckResults()) > 0 {
					answered.Add(1)
				}
			}
		}()
	}
	floodStart := time.Now()
	during := upsertLatencies(t, other.admin, s.tasks, other.ns, 5*time.Second)
	got, elapsed := answered.Load(), time.Since(floodStart)
	mu.Lock()
	early := slices.Clone(endedEarly)
	mu.Unlock()
	openAtEnd := streams - len(early)
	stopFlood()
	wg.Wait()

	t.Logf("%d streams under rate_limit %d/s (burst %d): %d verdict requests answered in %v (%.1f/s, %d verdicts); %d of %d streams open at the end",
		streams, rate, burst, got, elapsed.Round(time.Millisecond), float64(got)/elapsed.Seconds(), got*int64(len(acks)), openAtEnd, streams)
	t.Logf("the other tenant's upsert: control p50 %v p99 %v (%d calls); during the flood p50 %v p99 %v (%d calls)",
		quantile(control, 0.5), quantile(control, 0.99), len(control), quantile(during, 0.5), quantile(during, 0.99), len(during))
	if most := int64(burst + rate*elapsed.Seconds() + 1); got > most {
		t.Errorf("%d verdict requests were answered in %v under rate_limit %d/s, burst %d; want at most %d", got, elapsed, rate, burst, most)
	}
	if openAtEnd != streams {
		t.Errorf("%d of %d streams ended during the flood (%v); want them waiting for the rate limit, not ended", streams-openAtEnd, streams, early)
	}
}
