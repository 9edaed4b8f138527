package daemon

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/push"
)

// End-to-end tests of HTTP push targets (issue 16, item 4): real Redis,
// delayd in-process, a local receiver (httptest) admitted by
// --push-allow 127.0.0.1/32 --push-allow-ports 1024-65535 (the receivers
// listen on random loopback ports; by default only 80 and 443 are allowed).
//
// The tests that start replicas allowing push do not run in parallel:
// every such replica pushes every push namespace of the Redis database (as
// replicas of one deployment do), so another test's replica stopping with
// a request in flight would hand it back and redeliver it, and counts of
// requests would not be this test's alone.

const pushSecret = "push-secret-0123456789abcdef"

// e2ePushPorts is --push-allow-ports for the receivers' random ports.
const e2ePushPorts = "1024-65535"

// pushReq is one request the receiver got.
type pushReq struct {
	at     time.Time
	header http.Header
	raw    []byte
	body   push.Body
}

// receiver is a local push endpoint; answer decides each response.
type receiver struct {
	srv    *httptest.Server
	mu     sync.Mutex
	reqs   []pushReq
	answer func(w http.ResponseWriter, r *http.Request, b push.Body)
}

func newReceiver(t *testing.T, answer func(w http.ResponseWriter, r *http.Request, b push.Body)) *receiver {
	rc := &receiver{answer: answer}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var b push.Body
		_ = json.Unmarshal(raw, &b)
		rc.mu.Lock()
		rc.reqs = append(rc.reqs, pushReq{at: time.Now(), header: r.Header.Clone(), raw: raw, body: b})
		rc.mu.Unlock()
		rc.answer(w, r, b)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) requests() []pushReq {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]pushReq(nil), rc.reqs...)
}

// waitFor waits until cond holds, for at most e2eWait.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testkit.Eventually(t, e2eWait, what, cond)
}

// newPushEnv starts a replica allowing pushes to allow and creates the
// env's namespace with pol (push target included).
func newPushEnv(t *testing.T, allow string, pol *delaydv1.NamespacePolicy) (*e2eEnv, *started) {
	t.Helper()
	return newPushEnvPorts(t, allow, e2ePushPorts, pol)
}

// newPushEnvPorts is newPushEnv with --push-allow-ports ports.
func newPushEnvPorts(t *testing.T, allow, ports string, pol *delaydv1.NamespacePolicy) (*e2eEnv, *started) {
	t.Helper()
	url := testRedisURL()
	e := &e2eEnv{t: t, url: url, rdb: testkit.RedisAt(t, url), ns: "e2e-push-" + suffix()}
	t.Cleanup(func() { cleanNamespace(t, url, e.ns) })
	r := start(t, Config{RedisURL: e.url, LogLevel: "warn", PushAllow: allow, PushAllowPorts: ports})
	_, err := delaydv1.NewNamespaceServiceClient(r.conn).CreateNamespace(ctxFor(t), &delaydv1.CreateNamespaceRequest{
		Namespace: &delaydv1.Namespace{Name: e.ns, Policy: pol},
	})
	if err != nil {
		t.Fatalf("CreateNamespace: %v", err)
	}
	return e, r
}

func (e *e2eEnv) pushReplica(allow string) *started {
	return start(e.t, Config{RedisURL: e.url, LogLevel: "warn", PushAllow: allow, PushAllowPorts: e2ePushPorts})
}

// pushPolicy is a policy pushing to url with fast retries.
func pushPolicy(url string, maxAttempts int32, ackTimeout time.Duration) *delaydv1.NamespacePolicy {
	return &delaydv1.NamespacePolicy{
		AckTimeout: durationpb.New(ackTimeout), MaxAttempts: maxAttempts,
		BackoffInitial: durationpb.New(50 * time.Millisecond), BackoffMax: durationpb.New(200 * time.Millisecond), BackoffMultiplier: 2,
		Push: &delaydv1.PushTarget{Url: url, Secret: pushSecret},
	}
}

func (e *e2eEnv) getTask(r *started, id string) (*delaydv1.Task, error) {
	resp, err := r.tasks.GetTask(ctxFor(e.t), &delaydv1.GetTaskRequest{Namespace: e.ns, Id: id})
	return resp.GetTask(), err
}

// verifyByHand checks a request's Delayd-Signature the way docs/push.md
// tells a receiver to: t and v1 from the header, v1 == hex(HMAC-SHA256(
// secret, t + "." + body)), t within 5 minutes of now.
func verifyByHand(secret string, req pushReq) error {
	var ts, sig string
	for _, part := range strings.Split(req.header.Get("Delayd-Signature"), ",") {
		k, v, _ := strings.Cut(part, "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			sig = v
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return errors.New("no timestamp")
	}
	if d := time.Since(time.Unix(sec, 0)); d > 5*time.Minute || d < -5*time.Minute {
		return errors.New("stale timestamp")
	}
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(ts + "."))
	m.Write(req.raw)
	got, err := hex.DecodeString(sig)
	if err != nil || !hmac.Equal(got, m.Sum(nil)) {
		return errors.New("signature mismatch")
	}
	return nil
}

// TestE2EPushAcksAcrossReplicas: two replicas push a namespace's due tasks
// to the receiver; every task arrives exactly once (no fault, so no
// duplicate), signed as documented, with the documented body, and is gone
// after its 2xx. With the replica the namespace was created through
// stopped, the other goes on pushing alone.
func TestE2EPushAcksAcrossReplicas(t *testing.T) {
	rc := newReceiver(t, func(w http.ResponseWriter, _ *http.Request, _ push.Body) {
		time.Sleep(20 * time.Millisecond)
		w.WriteHeader(http.StatusOK)
	})
	e, a := newPushEnv(t, "127.0.0.1/32", pushPolicy(rc.srv.URL+"/hook", 5, 30*time.Second))
	b := e.pushReplica("127.0.0.1/32")
	const n = 30
	for i := range n {
		e.upsert([]*started{a, b}[i%2], "t"+strconv.Itoa(i), 0)
	}
	waitFor(t, "every task pushed", func() bool { return len(rc.requests()) >= n })
	waitFor(t, "every task acked", func() bool {
		st := e.stats(a)
		return st.GetScheduled()+st.GetDelivered() == 0
	})
	time.Sleep(e2eQuiet)
	reqs := rc.requests()
	seen := map[string]int{}
	for _, req := range reqs {
		seen[req.body.ID]++
		if err := verifyByHand(pushSecret, req); err != nil {
			t.Errorf("request for %s: %v", req.body.ID, err)
		}
		if err := push.Verify([]byte("another-secret-0123456789"), req.header.Get(push.SignatureHeader), req.raw, time.Now(), 0); !errors.Is(err, push.ErrBadSignature) {
			t.Errorf("request for %s verifies with a wrong secret: %v", req.body.ID, err)
		}
	}
	for i := range n {
		id := "t" + strconv.Itoa(i)
		if seen[id] != 1 {
			t.Errorf("task %s pushed %d times, want 1", id, seen[id])
		}
		if _, err := e.getTask(a, id); status.Code(err) != codes.NotFound {
			t.Errorf("GetTask(%s) after its 2xx: %v, want NotFound", id, err)
		}
	}
	if len(reqs) != n {
		t.Errorf("receiver got %d requests, want %d", len(reqs), n)
	}
	first := reqs[0]
	if first.body.Namespace != e.ns || string(first.body.Payload) != "payload-"+first.body.ID || first.body.Attempt != 1 ||
		first.body.MaxAttempts != 5 || first.body.DueTime.IsZero() || first.body.IdempotencyKey == "" ||
		first.header.Get("Idempotency-Key") != first.body.IdempotencyKey || first.header.Get("Content-Type") != "application/json" {
		t.Errorf("first request: body %+v headers %v", first.body, first.header)
	}
	if !strings.Contains(string(first.raw), `"payload":"`) {
		t.Errorf("body %s has no base64 payload", first.raw)
	}

	// A goes away; B alone pushes what falls due now.
	stopCtx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := a.d.Stop(stopCtx); err != nil {
		t.Fatalf("stopping A: %v", err)
	}
	for i := range 5 {
		e.upsert(b, "late"+strconv.Itoa(i), 0)
	}
	waitFor(t, "B pushes alone", func() bool { return len(rc.requests()) >= n+5 })
}

// TestE2EPushRetriesThenDeadLetters: an endpoint answering 500 gets the
// task max_attempts times, with the namespace's backoff between attempts,
// the same idempotency key and a new delivery id each time; then the task
// is a dead letter whose last error names the status.
func TestE2EPushRetriesThenDeadLetters(t *testing.T) {
	rc := newReceiver(t, func(w http.ResponseWriter, _ *http.Request, _ push.Body) {
		http.Error(w, "broken", http.StatusInternalServerError)
	})
	url := testRedisURL()
	e := &e2eEnv{t: t, url: url, rdb: testkit.RedisAt(t, url), ns: "e2e-push-" + suffix()}
	t.Cleanup(func() { cleanNamespace(t, url, e.ns) })
	a := start(t, Config{RedisURL: url, LogLevel: "warn", PushAllow: "127.0.0.1/32", PushAllowPorts: e2ePushPorts, OpsListen: "127.0.0.1:0"})
	if _, err := delaydv1.NewNamespaceServiceClient(a.conn).CreateNamespace(ctxFor(t), &delaydv1.CreateNamespaceRequest{
		Namespace: &delaydv1.Namespace{Name: e.ns, Policy: pushPolicy(rc.srv.URL, 3, 30*time.Second)},
	}); err != nil {
		t.Fatal(err)
	}
	e.upsert(a, "doomed", 0)
	waitFor(t, "task dead", func() bool {
		task, err := e.getTask(a, "doomed")
		return err == nil && task.GetState() == delaydv1.TaskState_TASK_STATE_DEAD
	})
	task, _ := e.getTask(a, "doomed")
	if !strings.Contains(task.GetLastError(), "HTTP 500") {
		t.Errorf("last error %q, want it to name HTTP 500", task.GetLastError())
	}
	time.Sleep(e2eQuiet)
	reqs := rc.requests()
	if len(reqs) != 3 {
		t.Fatalf("receiver got %d requests, want 3 (max_attempts)", len(reqs))
	}
	ids := map[string]bool{}
	for i, req := range reqs {
		if req.body.Attempt != int32(i+1) || req.body.IdempotencyKey != reqs[0].body.IdempotencyKey {
			t.Errorf("request %d: attempt %d key %s, want attempt %d key %s", i, req.body.Attempt, req.body.IdempotencyKey, i+1, reqs[0].body.IdempotencyKey)
		}
		ids[req.body.DeliveryID] = true
		if i > 0 {
			// The first retry waits backoff_initial (50 ms, jitter 20%), the
			// second twice that: lower bounds, which load cannot break.
			if gap, least := req.at.Sub(reqs[i-1].at), time.Duration(i)*40*time.Millisecond; gap < least {
				t.Errorf("attempt %d came %s after the previous one, want at least %s (backoff)", i+1, gap, least)
			}
		}
	}
	if len(ids) != 3 {
		t.Errorf("delivery ids %v, want 3 distinct", ids)
	}
	// The outcomes are counted under the names docs/operating.md gives.
	resp, err := http.Get("http://" + a.d.OpsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	for _, series := range []string{
		`delayd_push_requests_total{namespace="` + e.ns + `",outcome="http_error"} 3`,
		`delayd_push_requests_total{namespace="` + e.ns + `",outcome="ok"} 0`,
		`delayd_push_request_duration_seconds_count{namespace="` + e.ns + `"} 3`,
		`delayd_tasks_dead_total{namespace="` + e.ns + `"} 1`,
	} {
		if !strings.Contains(string(metrics), series) {
			t.Errorf("/metrics lacks %s", series)
		}
	}
}

// TestE2EPushLastErrorNamesNoAddress (issue 32 item 5): a push to a
// port where nothing listens leaves a last error, read by the tenant
// through GetTask, in fixed words that name neither the address nor the
// port nor Go's network text.
func TestE2EPushLastErrorNamesNoAddress(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	_ = lis.Close()
	_, port, _ := net.SplitHostPort(addr)
	e, a := newPushEnv(t, "127.0.0.1/32", pushPolicy("http://"+addr+"/hook", 1, 5*time.Second))
	e.upsert(a, "closed", 0)
	waitFor(t, "task dead after its one attempt", func() bool {
		task, err := e.getTask(a, "closed")
		return err == nil && task.GetState() == delaydv1.TaskState_TASK_STATE_DEAD
	})
	task, _ := e.getTask(a, "closed")
	if got := task.GetLastError(); got != "push: connection refused by target" || strings.Contains(got, port) {
		t.Errorf("last error %q, want %q (no address, no port)", got, "push: connection refused by target")
	}
}

// TestE2EPushTimeoutNacks: an endpoint that does not answer within the ack
// timeout (1 s) has the request cut and the task nacked; after
// max_attempts it is a dead letter saying why.
func TestE2EPushTimeoutNacks(t *testing.T) {
	rc := newReceiver(t, func(_ http.ResponseWriter, r *http.Request, _ push.Body) {
		select {
		case <-r.Context().Done(): // delayd gave up and closed the connection
		case <-time.After(30 * time.Second):
		}
	})
	e, a := newPushEnv(t, "127.0.0.1/32", pushPolicy(rc.srv.URL, 2, time.Second))
	e.upsert(a, "slow", 0)
	waitFor(t, "first attempt made", func() bool { return len(rc.requests()) >= 1 })
	waitFor(t, "task dead after two timeouts", func() bool {
		task, err := e.getTask(a, "slow")
		return err == nil && task.GetState() == delaydv1.TaskState_TASK_STATE_DEAD
	})
	task, _ := e.getTask(a, "slow")
	if !strings.Contains(task.GetLastError(), "no answer within 1s") {
		t.Errorf("last error %q, want the timeout", task.GetLastError())
	}
	reqs := rc.requests()
	if len(reqs) != 2 {
		for _, r := range reqs {
			t.Logf("request at %s: attempt %d delivery %s", r.at.Format("15:04:05.000"), r.body.Attempt, r.body.DeliveryID)
		}
		t.Fatalf("receiver got %d requests, want 2", len(reqs))
	}
	if gap := reqs[1].at.Sub(reqs[0].at); gap < time.Second {
		t.Errorf("second attempt %s after the first, want at least the 1 s timeout", gap)
	}
}

// TestE2EPushURLRefused: URLs the allow list does not admit (hosts and
// ports), bad schemes, missing secrets and short secrets are refused at
// create and update time, naming the field; nothing is stored.
func TestE2EPushURLRefused(t *testing.T) {
	rc := newReceiver(t, func(w http.ResponseWriter, _ *http.Request, _ push.Body) { w.WriteHeader(http.StatusOK) })
	_, port, _ := net.SplitHostPort(rc.srv.Listener.Addr().String())
	e, a := newPushEnvPorts(t, "hooks.example.com,127.0.0.1/32", "80,443,"+port, &delaydv1.NamespacePolicy{})
	nsc := delaydv1.NewNamespaceServiceClient(a.conn)
	for _, c := range []struct {
		url, secret, field, why string
	}{
		{"http://10.0.0.1/hook", pushSecret, "namespace.policy.push.url", "hooks.example.com, 127.0.0.1/32"},
		{"http://169.254.169.254/latest/meta-data", pushSecret, "namespace.policy.push.url", "does not allow"},
		{"http://evil.example.org/", pushSecret, "namespace.policy.push.url", "does not allow"},
		{"ftp://hooks.example.com/x", pushSecret, "namespace.policy.push.url", "http, https"},
		// An allowed address, a port not allowed: delayd's own Redis.
		{"http://127.0.0.1:6379/", pushSecret, "namespace.policy.push.url", "port 6379, which the operator does not allow push to; allowed: ports 80,443," + port + " (--push-allow-ports)"},
		{"https://hooks.example.com:8443/x", pushSecret, "namespace.policy.push.url", "--push-allow-ports"},
		{"https://hooks.example.com/x", "", "namespace.policy.push.secret", "required"},
		{"https://hooks.example.com/x", "short", "namespace.policy.push.secret", "16-1024"},
	} {
		_, err := nsc.UpdateNamespace(ctxFor(t), &delaydv1.UpdateNamespaceRequest{
			Namespace:  &delaydv1.Namespace{Name: e.ns, Policy: &delaydv1.NamespacePolicy{Push: &delaydv1.PushTarget{Url: c.url, Secret: c.secret}}},
			UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"policy.push"}},
		})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), c.field) || !strings.Contains(err.Error(), c.why) {
			t.Errorf("update to %q: %v, want InvalidArgument naming %s and %q", c.url, err, c.field, c.why)
		}
		_, err = nsc.CreateNamespace(ctxFor(t), &delaydv1.CreateNamespaceRequest{
			Namespace: &delaydv1.Namespace{Name: e.ns + "-c", Policy: &delaydv1.NamespacePolicy{Push: &delaydv1.PushTarget{Url: c.url, Secret: c.secret}}},
		})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), c.field) {
			t.Errorf("create with %q: %v, want InvalidArgument naming %s", c.url, err, c.field)
		}
	}
	got, err := nsc.GetNamespace(ctxFor(t), &delaydv1.GetNamespaceRequest{Namespace: e.ns})
	if err != nil || got.GetNamespace().GetPolicy().GetPush() != nil {
		t.Fatalf("after refused updates: push %v, %v; want none", got.GetNamespace().GetPolicy().GetPush(), err)
	}
	// An allowed URL is taken.
	e.update(a, &delaydv1.NamespacePolicy{Push: &delaydv1.PushTarget{Url: rc.srv.URL, Secret: pushSecret}}, "policy.push")
}

// TestE2EPushDisabledWithoutAllow: with --push-allow empty, a policy that
// sets push is refused, naming the flag.
func TestE2EPushDisabledWithoutAllow(t *testing.T) {
	t.Parallel()
	e, a := newE2E(t, testRedisURL())
	for _, call := range []func() error{
		func() error {
			_, err := delaydv1.NewNamespaceServiceClient(a.conn).UpdateNamespace(ctxFor(t), &delaydv1.UpdateNamespaceRequest{
				Namespace:  &delaydv1.Namespace{Name: e.ns, Policy: &delaydv1.NamespacePolicy{Push: &delaydv1.PushTarget{Url: "https://hooks.example.com/", Secret: pushSecret}}},
				UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"policy.push"}},
			})
			return err
		},
		func() error {
			_, err := delaydv1.NewNamespaceServiceClient(a.conn).CreateNamespace(ctxFor(t), &delaydv1.CreateNamespaceRequest{
				Namespace: &delaydv1.Namespace{Name: e.ns + "-c", Policy: &delaydv1.NamespacePolicy{Push: &delaydv1.PushTarget{Url: "https://hooks.example.com/", Secret: pushSecret}}},
			})
			return err
		},
	} {
		if err := call(); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "--push-allow") {
			t.Errorf("push with --push-allow empty: %v, want FailedPrecondition naming --push-allow", err)
		}
	}
}

// TestE2EPushSecretNeverReturned: the secret is in no answer (gRPC get,
// list, update, the HTTP JSON API); secret_set says it is stored; an
// update of the URL without a secret keeps it (the requests are still
// signed with it); a push namespace refuses Subscribe.
func TestE2EPushSecretNeverReturned(t *testing.T) {
	rc := newReceiver(t, func(w http.ResponseWriter, _ *http.Request, _ push.Body) { w.WriteHeader(http.StatusNoContent) })
	url := testRedisURL()
	e := &e2eEnv{t: t, url: url, rdb: testkit.RedisAt(t, url), ns: "e2e-push-" + suffix()}
	t.Cleanup(func() { cleanNamespace(t, url, e.ns) })
	a := start(t, Config{RedisURL: url, LogLevel: "warn", PushAllow: "127.0.0.1/32", PushAllowPorts: e2ePushPorts, HTTPListen: "127.0.0.1:0"})
	nsc := delaydv1.NewNamespaceServiceClient(a.conn)
	created, err := nsc.CreateNamespace(ctxFor(t), &delaydv1.CreateNamespaceRequest{
		Namespace: &delaydv1.Namespace{Name: e.ns, Policy: pushPolicy(rc.srv.URL+"/v1", 5, 30*time.Second)},
	})
	if err != nil {
		t.Fatal(err)
	}
	updated, err := nsc.UpdateNamespace(ctxFor(t), &delaydv1.UpdateNamespaceRequest{
		Namespace:  &delaydv1.Namespace{Name: e.ns, Policy: &delaydv1.NamespacePolicy{Push: &delaydv1.PushTarget{Url: rc.srv.URL + "/v2"}}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"policy.push"}},
	})
	if err != nil {
		t.Fatalf("update of the URL without a secret: %v", err)
	}
	got, err := nsc.GetNamespace(ctxFor(t), &delaydv1.GetNamespaceRequest{Namespace: e.ns})
	if err != nil {
		t.Fatal(err)
	}
	list, err := nsc.ListNamespaces(ctxFor(t), &delaydv1.ListNamespacesRequest{PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for what, m := range map[string]proto.Message{"create": created, "update": updated, "get": got, "list": list} {
		if s := protojson.Format(m); strings.Contains(s, pushSecret) {
			t.Errorf("%s answer carries the secret: %s", what, s)
		}
	}
	if p := got.GetNamespace().GetPolicy().GetPush(); p.GetUrl() != rc.srv.URL+"/v2" || !p.GetSecretSet() || p.GetSecret() != "" {
		t.Errorf("GetNamespace push = %v, want the new URL, secret_set, no secret", p)
	}
	// The HTTP JSON API (Connect) answers the same.
	req, _ := http.NewRequestWithContext(ctxFor(t), http.MethodPost, "http://"+a.d.HTTPAddr()+"/delayd.v1.NamespaceService/GetNamespace",
		strings.NewReader(`{"namespace":"`+e.ns+`"}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || strings.Contains(string(body), pushSecret) || !strings.Contains(string(body), `"secretSet":true`) {
		t.Errorf("HTTP GetNamespace: %d %s; want 200, secretSet, no secret", resp.StatusCode, body)
	}
	// Subscribe is refused while push is set.
	stream, err := delaydv1.NewDeliveryServiceClient(a.conn).Subscribe(ctxFor(t), &delaydv1.SubscribeRequest{Namespace: e.ns})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "policy.push.url") {
		t.Errorf("Subscribe on a push namespace: %v, want FailedPrecondition", err)
	}
	// The kept secret still signs.
	e.upsert(a, "signed", 0)
	waitFor(t, "task pushed", func() bool { return len(rc.requests()) >= 1 })
	r := rc.requests()[0]
	if r.header.Get("Delayd-Signature") == "" || verifyByHand(pushSecret, r) != nil {
		t.Errorf("request after the URL change does not verify with the kept secret")
	}
	if !strings.HasSuffix(rc.requests()[0].body.Namespace, e.ns) {
		t.Errorf("pushed %+v", r.body)
	}
}

// TestE2EPushOffAcrossReplicas: push turned off through replica A stops
// replica B's pusher at once (the change is announced to every replica):
// B serves a Subscribe stream of the namespace, which gets the next task,
// and the endpoint does not.
func TestE2EPushOffAcrossReplicas(t *testing.T) {
	rc := newReceiver(t, func(w http.ResponseWriter, _ *http.Request, _ push.Body) { w.WriteHeader(http.StatusOK) })
	e, a := newPushEnv(t, "127.0.0.1/32", pushPolicy(rc.srv.URL, 5, 30*time.Second))
	b := e.pushReplica("127.0.0.1/32")
	e.upsert(b, "pushed", 0)
	waitFor(t, "first task pushed", func() bool { return len(rc.requests()) >= 1 })

	e.update(a, &delaydv1.NamespacePolicy{}, "policy.push")
	// The announcement travels over Redis pub/sub; give it a moment.
	time.Sleep(e2eQuiet)
	s := e.subscribe(b, 10)
	e.upsert(a, "streamed", 0)
	if d := s.next(t); d.GetTask().GetId() != "streamed" {
		t.Fatalf("B's stream got %s, want streamed", d.GetTask().GetId())
	}
	for _, r := range rc.requests() {
		if r.body.ID == "streamed" {
			t.Fatalf("streamed was pushed after push was turned off")
		}
	}
}

// TestE2EPushDurable: in durable mode (MySQL the authority) a pushed task
// is acked through the durable store: gone after its 2xx, and a task
// whose pushes fail is a dead letter there.
func TestE2EPushDurable(t *testing.T) {
	rc := newReceiver(t, func(w http.ResponseWriter, _ *http.Request, b push.Body) {
		if b.ID == "bad" {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	dsn := testkit.Database(t, "delayd_daemon_push")
	url := testRedisURL()
	e := &e2eEnv{t: t, url: url, rdb: testkit.RedisAt(t, url), ns: "e2e-push-" + suffix()}
	t.Cleanup(func() { cleanNamespace(t, url, e.ns) })
	a := start(t, Config{RedisURL: url, MySQLDSN: dsn, LogLevel: "warn", PushAllow: "127.0.0.1/32", PushAllowPorts: e2ePushPorts})
	if _, err := delaydv1.NewNamespaceServiceClient(a.conn).CreateNamespace(ctxFor(t), &delaydv1.CreateNamespaceRequest{
		Namespace: &delaydv1.Namespace{Name: e.ns, Policy: pushPolicy(rc.srv.URL, 2, 30*time.Second)},
	}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"ok1", "ok2", "bad"} {
		e.upsert(a, id, 0)
	}
	waitFor(t, "ok1 and ok2 acked, bad dead", func() bool {
		_, e1 := e.getTask(a, "ok1")
		_, e2 := e.getTask(a, "ok2")
		bad, e3 := e.getTask(a, "bad")
		return status.Code(e1) == codes.NotFound && status.Code(e2) == codes.NotFound && e3 == nil &&
			bad.GetState() == delaydv1.TaskState_TASK_STATE_DEAD
	})
	bad, _ := e.getTask(a, "bad")
	if !strings.Contains(bad.GetLastError(), "HTTP 503") {
		t.Errorf("bad's last error %q, want HTTP 503", bad.GetLastError())
	}
}

// TestPushCAMustHoldCertificates: a --push-ca file without a PEM
// certificate stops delayd from starting, naming the flag, rather than
// leaving https pushes to fail one by one.
func TestPushCAMustHoldCertificates(t *testing.T) {
	t.Parallel()
	bad := t.TempDir() + "/ca.pem"
	if err := os.WriteFile(bad, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Start(t.Context(), Config{Listen: "127.0.0.1:0", RedisURL: testRedisURL(), PushAllow: "127.0.0.1/32", PushCAFile: bad}, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "--push-ca") {
		t.Fatalf("Start with a --push-ca file holding no certificate: %v, want an error naming --push-ca", err)
	}
}
