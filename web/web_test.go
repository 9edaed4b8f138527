package web_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/delayd/delayd/daemon"
	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/server"
)

// The HTTP edge tests run a real delayd (real Redis from TEST_REDIS_URL,
// auth on) with its HTTP listener on a free loopback port, and speak to it
// the way curl, a browser and a Connect client do.

const adminKey = "web-test-admin-key-0123456789abcdef"

func TestMain(m *testing.M) { testkit.Main(m) }

type env struct {
	t    *testing.T
	base string // http://host:port
	d    *daemon.Daemon
}

func start(t *testing.T, limits server.Limits) *env {
	t.Helper()
	d, err := daemon.Start(t.Context(), daemon.Config{
		Listen: "127.0.0.1:0", HTTPListen: "127.0.0.1:0", RedisURL: testkit.RedisURL(),
		AdminKey: adminKey, Limits: limits,
	}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("daemon.Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := d.Stop(ctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	return &env{t: t, base: "http://" + d.HTTPAddr(), d: d}
}

// call makes a Connect unary call with a JSON body, as curl does, and
// returns the HTTP status and the decoded JSON answer.
func (e *env) call(key, method string, body any) (int, map[string]any) {
	e.t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		e.t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(e.t.Context(), http.MethodPost, e.base+"/delayd.v1."+method, bytes.NewReader(b))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatalf("%s: %v", method, err)
	}
	defer resp.Body.Close()
	out := map[string]any{}
	raw, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(raw, &out); err != nil {
		e.t.Fatalf("%s: answer %q is not JSON: %v", method, raw, err)
	}
	return resp.StatusCode, out
}

// mustCall is call that expects 200.
func (e *env) mustCall(key, method string, body any) map[string]any {
	e.t.Helper()
	code, out := e.call(key, method, body)
	if code != http.StatusOK {
		e.t.Fatalf("%s: HTTP %d %v", method, code, out)
	}
	return out
}

func (e *env) namespace(prefix string, policy map[string]any) string {
	e.t.Helper()
	ns := prefix + testkit.Suffix()
	e.mustCall(adminKey, "NamespaceService/CreateNamespace", map[string]any{"namespace": map[string]any{"name": ns, "policy": policy}})
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		b, _ := json.Marshal(map[string]any{"namespace": ns, "force": true})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.base+"/delayd.v1.NamespaceService/DeleteNamespace", bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+adminKey)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	})
	return ns
}

func TestConnectJSONUpsertGetRemove(t *testing.T) {
	t.Parallel()
	e := start(t, server.Limits{})
	ns := e.namespace("web-", nil)

	up := e.mustCall(adminKey, "TaskService/UpsertTask", map[string]any{
		"namespace": ns, "id": "order-42", "kind": "order.close",
		"payload": "aGVsbG8=", "delay": "900s",
	})
	if up["created"] != true || up["task"].(map[string]any)["state"] != "TASK_STATE_SCHEDULED" {
		t.Fatalf("UpsertTask = %v", up)
	}
	got := e.mustCall(adminKey, "TaskService/GetTask", map[string]any{"namespace": ns, "id": "order-42"})
	task := got["task"].(map[string]any)
	if task["id"] != "order-42" || task["kind"] != "order.close" || task["payload"] != "aGVsbG8=" || task["generation"] != "1" {
		t.Fatalf("GetTask = %v", got)
	}
	rm := e.mustCall(adminKey, "TaskService/RemoveTask", map[string]any{"namespace": ns, "id": "order-42"})
	if rm["removed"] != true || rm["previousState"] != "TASK_STATE_SCHEDULED" {
		t.Fatalf("RemoveTask = %v", rm)
	}
	// Errors carry the gRPC code and the same message a gRPC client gets.
	code, out := e.call(adminKey, "TaskService/GetTask", map[string]any{"namespace": ns, "id": "order-42"})
	if code != http.StatusNotFound || out["code"] != "not_found" || !strings.Contains(fmt.Sprint(out["message"]), `task "order-42" not found`) {
		t.Errorf("GetTask after remove: HTTP %d %v; want 404 not_found naming the task", code, out)
	}
	code, out = e.call(adminKey, "TaskService/UpsertTask", map[string]any{"namespace": ns, "id": "bad/id", "delay": "1s"})
	if code != http.StatusBadRequest || out["code"] != "invalid_argument" || !strings.Contains(fmt.Sprint(out["message"]), "id has '/'") {
		t.Errorf("bad id: HTTP %d %v; want 400 invalid_argument naming the field", code, out)
	}
	code, out = e.call(adminKey, "TaskService/UpsertTask", map[string]any{"namespace": ns, "idd": "x", "delay": "1s"})
	if code != http.StatusBadRequest || !strings.Contains(fmt.Sprint(out["message"]), "idd") {
		t.Errorf("misspelled field: HTTP %d %v; want 400 naming it", code, out)
	}
}

// TestConnectJSONSchedules: ScheduleService over HTTP/JSON as curl calls
// it: create with a cron in a zone, preview in UTC and local time, pause
// with an update mask spelt in JSON, errors naming the field.
func TestConnectJSONSchedules(t *testing.T) {
	t.Parallel()
	e := start(t, server.Limits{})
	ns := e.namespace("web-sched-", nil)
	created := e.mustCall(adminKey, "ScheduleService/CreateSchedule", map[string]any{"schedule": map[string]any{
		"namespace": ns, "id": "statement", "cron": "0 6 1 * *", "timeZone": "America/New_York",
		"catchUp": "CATCH_UP_POLICY_LATEST", "task": map[string]any{"kind": "statement.monthly", "payload": "e30="},
	}})
	sc := created["schedule"].(map[string]any)
	if sc["state"] != "SCHEDULE_STATE_ACTIVE" || sc["cron"] != "0 6 1 * *" || sc["nextSlotTime"] == nil {
		t.Fatalf("CreateSchedule = %v", created)
	}
	prev := e.mustCall(adminKey, "ScheduleService/PreviewSchedule", map[string]any{"namespace": ns, "id": "statement", "count": 2,
		"after": "2027-11-15T00:00:00Z"})
	firings := prev["firings"].([]any)
	first := firings[0].(map[string]any)
	if first["slotTime"] != "2027-12-01T11:00:00Z" || first["localTime"] != "2027-12-01T06:00:00-05:00 EST" ||
		first["taskId"] != "statement.20271201T110000Z" || prev["timeZone"] != "America/New_York" {
		t.Fatalf("PreviewSchedule = %v", prev)
	}
	up := e.mustCall(adminKey, "ScheduleService/UpdateSchedule", map[string]any{
		"schedule": map[string]any{"namespace": ns, "id": "statement", "catchUpWindow": "86400s"}, "updateMask": "catchUpWindow"})
	if up["schedule"].(map[string]any)["catchUpWindow"] != "86400s" {
		t.Fatalf("UpdateSchedule = %v", up)
	}
	code, out := e.call(adminKey, "ScheduleService/CreateSchedule", map[string]any{"schedule": map[string]any{
		"namespace": ns, "id": "bad", "cron": "0 6 31 2 *"}})
	if code != http.StatusBadRequest || !strings.Contains(fmt.Sprint(out["message"]), "schedule.cron never fires") {
		t.Fatalf("a cron that never fires: HTTP %d %v", code, out)
	}
}

// TestUpdateNamespaceMaskOverHTTP (issue 41): over Connect JSON, as curl
// sends it, a pause with "updateMask": "policy.paused" (protojson's string
// form of a FieldMask) keeps the namespace's dispatch-rate cap; the same
// pause without a mask is refused with 400 invalid_argument naming
// update_mask, and changes nothing.
func TestUpdateNamespaceMaskOverHTTP(t *testing.T) {
	t.Parallel()
	e := start(t, server.Limits{})
	ns := e.namespace("web-mask-", map[string]any{"maxDispatchRate": 50})
	policy := func() map[string]any {
		got := e.mustCall(adminKey, "NamespaceService/GetNamespace", map[string]any{"namespace": ns})
		return got["namespace"].(map[string]any)["policy"].(map[string]any)
	}
	pause := map[string]any{"name": ns, "policy": map[string]any{"paused": true}}

	for _, body := range []map[string]any{{"namespace": pause}, {"namespace": pause, "updateMask": ""}} {
		code, out := e.call(adminKey, "NamespaceService/UpdateNamespace", body)
		if msg := fmt.Sprint(out["message"]); code != http.StatusBadRequest || out["code"] != "invalid_argument" ||
			!strings.Contains(msg, "update_mask is required") || !strings.Contains(msg, "policy.paused") {
			t.Errorf("UpdateNamespace %v: HTTP %d %v; want 400 invalid_argument naming update_mask and its paths", body, code, out)
		}
	}
	if p := policy(); p["paused"] == true || p["maxDispatchRate"] != 50.0 {
		t.Fatalf("after the refused updates the policy is %v; want not paused, maxDispatchRate 50", p)
	}
	e.mustCall(adminKey, "NamespaceService/UpdateNamespace", map[string]any{"namespace": pause, "updateMask": "policy.paused"})
	if p := policy(); p["paused"] != true || p["maxDispatchRate"] != 50.0 {
		t.Fatalf("after a pause with its mask the policy is %v; want paused, maxDispatchRate 50", p)
	}
}

// TestSameAuthAsGRPC: no key, a bad key, and a key of another namespace
// are refused over HTTP exactly as over gRPC.
func TestSameAuthAsGRPC(t *testing.T) {
	t.Parallel()
	e := start(t, server.Limits{})
	nsA := e.namespace("web-a-", nil)
	nsB := e.namespace("web-b-", nil)
	key := e.mustCall(adminKey, "NamespaceService/CreateKey", map[string]any{"namespace": nsA, "scopes": []string{"KEY_SCOPE_PRODUCE"}})
	secret := key["secret"].(string)

	get := map[string]any{"namespace": nsB, "id": "x"}
	for _, c := range []struct {
		key      string
		status   int
		code     string
		contains string
	}{
		{"", http.StatusUnauthorized, "unauthenticated", "missing API key"},
		{"dk_0123456789abcdef_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", http.StatusUnauthorized, "unauthenticated", "invalid API key"},
		{"not-a-key-at-all", http.StatusUnauthorized, "unauthenticated", "invalid API key"},
		{secret, http.StatusForbidden, "permission_denied", fmt.Sprintf("belongs to namespace %q and may not call TaskService.GetTask on another namespace", nsA)},
	} {
		status, out := e.call(c.key, "TaskService/GetTask", get)
		if status != c.status || out["code"] != c.code || !strings.Contains(fmt.Sprint(out["message"]), c.contains) {
			t.Errorf("key %q: HTTP %d %v; want %d %s containing %q", c.key, status, out, c.status, c.code, c.contains)
		}
	}
	// The namespace's own key works.
	status, out := e.call(secret, "TaskService/GetTask", map[string]any{"namespace": nsA, "id": "x"})
	if status != http.StatusNotFound {
		t.Errorf("own namespace: HTTP %d %v; want 404 (allowed, no such task)", status, out)
	}
}

// TestSameLimitsAsGRPC: the message size limit and a namespace's rate limit
// apply over HTTP.
func TestSameLimitsAsGRPC(t *testing.T) {
	t.Parallel()
	e := start(t, server.Limits{MaxMessageBytes: 64 << 10})
	ns := e.namespace("web-lim-", map[string]any{"rateLimit": 1, "rateBurst": 2})

	big := strings.Repeat("A", 100<<10) // base64 of 75 KiB: over the 64 KiB message limit
	status, out := e.call(adminKey, "TaskService/UpsertTask", map[string]any{"namespace": ns, "id": "big", "delay": "1s", "payload": big})
	if status == http.StatusOK || out["code"] != "resource_exhausted" {
		t.Errorf("oversized message: HTTP %d %v; want resource_exhausted", status, out)
	}
	limited := false
	for i := 0; i < 5 && !limited; i++ {
		status, out = e.call(adminKey, "TaskService/GetTask", map[string]any{"namespace": ns, "id": "x"})
		limited = status == http.StatusTooManyRequests && out["code"] == "resource_exhausted" && strings.Contains(fmt.Sprint(out["message"]), "rate")
	}
	if !limited {
		t.Errorf("5 calls at once on a namespace limited to 1/s (burst 2): never refused; last HTTP %d %v", status, out)
	}
}

// envelope frames one Connect/gRPC-Web streaming message.
func envelope(flags byte, msg []byte) []byte {
	b := make([]byte, 5+len(msg))
	b[0] = flags
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	copy(b[5:], msg)
	return b
}

// readEnvelope reads one frame.
func readEnvelope(r *bufio.Reader) (flags byte, msg []byte, err error) {
	var h [5]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	msg = make([]byte, binary.BigEndian.Uint32(h[1:]))
	_, err = io.ReadFull(r, msg)
	return h[0], msg, err
}

// TestConnectStreamingSubscribeAndAck: a Subscribe stream over the Connect
// protocol (HTTP/1.1, JSON) gets a due task; the token acks it over JSON.
func TestConnectStreamingSubscribeAndAck(t *testing.T) {
	t.Parallel()
	e := start(t, server.Limits{})
	ns := e.namespace("web-sub-", nil)

	// Over HTTP the stream's headers arrive with its first message, so the
	// task is made due first.
	e.mustCall(adminKey, "TaskService/UpsertTask", map[string]any{"namespace": ns, "id": "due-now", "delay": "0s", "payload": "aGk="})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	body, _ := json.Marshal(map[string]any{"namespace": ns, "maxInFlight": 1})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.base+"/delayd.v1.DeliveryService/Subscribe", bytes.NewReader(envelope(0, body)))
	req.Header.Set("Content-Type", "application/connect+json")
	req.Header.Set("Authorization", "Bearer "+adminKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("Subscribe: HTTP %d", resp.StatusCode)
	}

	flags, msg, err := readEnvelope(bufio.NewReader(resp.Body))
	if err != nil || flags != 0 {
		t.Fatalf("first frame: flags %d, %v (%s)", flags, err, msg)
	}
	var sub struct {
		Delivery struct {
			Task  struct{ ID, Payload string }
			Token string
		}
	}
	if err := json.Unmarshal(msg, &sub); err != nil || sub.Delivery.Task.ID != "due-now" || sub.Delivery.Token == "" {
		t.Fatalf("delivery %s: %v", msg, err)
	}
	ack := e.mustCall(adminKey, "DeliveryService/AckTasks", map[string]any{"namespace": ns, "tokens": []string{sub.Delivery.Token}})
	if r := ack["results"].([]any)[0].(map[string]any); r["status"] != "TOKEN_STATUS_OK" {
		t.Errorf("ack: %v", ack)
	}
}

// TestGRPCWebAndNativeGRPC: the same service over gRPC-Web (binary) and
// over native gRPC (HTTP/2 without TLS) on the HTTP port.
func TestGRPCWebAndNativeGRPC(t *testing.T) {
	t.Parallel()
	e := start(t, server.Limits{})
	ns := e.namespace("web-gw-", nil)
	e.mustCall(adminKey, "TaskService/UpsertTask", map[string]any{"namespace": ns, "id": "t1", "delay": "60s"})

	reqMsg, _ := proto.Marshal(&delaydv1.GetTaskRequest{Namespace: ns, Id: "t1"})
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, e.base+"/delayd.v1.TaskService/GetTask", bytes.NewReader(envelope(0, reqMsg)))
	req.Header.Set("Content-Type", "application/grpc-web+proto")
	req.Header.Set("Authorization", "Bearer "+adminKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	_, msg, err := readEnvelope(r)
	if err != nil {
		t.Fatalf("gRPC-Web message: %v", err)
	}
	var got delaydv1.GetTaskResponse
	if err := proto.Unmarshal(msg, &got); err != nil || got.GetTask().GetId() != "t1" {
		t.Fatalf("gRPC-Web GetTask = %v, %v", &got, err)
	}
	flags, trailer, err := readEnvelope(r)
	if err != nil || flags&0x80 == 0 || !strings.Contains(strings.ToLower(string(trailer)), "grpc-status: 0") {
		t.Errorf("gRPC-Web trailer frame: flags %x %q %v", flags, trailer, err)
	}

	conn, err := grpc.NewClient(e.d.HTTPAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+adminKey)
	g, err := delaydv1.NewTaskServiceClient(conn).GetTask(ctx, &delaydv1.GetTaskRequest{Namespace: ns, Id: "t1"})
	if err != nil || g.GetTask().GetId() != "t1" {
		t.Fatalf("gRPC over the HTTP port: %v, %v", g, err)
	}
}

// TestContentTypeAndSizeAnswers: a call on an existing RPC path without a
// Content-Type, or with one the edge does not speak, is answered 415 with
// a JSON error naming Content-Type and what is allowed (not a bare 404); a
// body over the message limit is answered 413 naming the limit and the
// flag that sets it (not "429 max buffer size").
func TestContentTypeAndSizeAnswers(t *testing.T) {
	t.Parallel()
	e := start(t, server.Limits{})
	ns := e.namespace("web-ct-", nil)
	chunked := false // send the body without a Content-Length
	post := func(contentType string, body []byte) (int, string, map[string]any) {
		t.Helper()
		var rd io.Reader = bytes.NewReader(body)
		if chunked {
			rd = io.MultiReader(rd) // length unknown to net/http
		}
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, e.base+"/delayd.v1.TaskService/UpsertTask", rd)
		if err != nil {
			t.Fatal(err)
		}
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		req.Header.Set("Authorization", "Bearer "+adminKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		out := map[string]any{}
		if err := json.Unmarshal(raw, &out); err != nil {
			t.Errorf("Content-Type %q: answer %q (HTTP %d) is not JSON", contentType, raw, resp.StatusCode)
		}
		return resp.StatusCode, resp.Header.Get("Content-Type"), out
	}
	ok, _ := json.Marshal(map[string]any{"namespace": ns, "id": "ct-1", "delay": "60s"})
	for _, ct := range []string{"", "text/plain", "application/x-www-form-urlencoded", "application/xml"} {
		code, rct, out := post(ct, ok)
		msg := fmt.Sprint(out["message"])
		if code != http.StatusUnsupportedMediaType || rct != "application/json" || out["code"] != "invalid_argument" ||
			!strings.Contains(msg, "Content-Type") || !strings.Contains(msg, "application/json") {
			t.Errorf("Content-Type %q: HTTP %d (%s) %v; want 415 JSON naming Content-Type and application/json", ct, code, rct, out)
		}
	}
	// what is allowed still works
	if code, _, out := post("application/json", ok); code != http.StatusOK {
		t.Errorf("application/json: HTTP %d %v", code, out)
	}
	big, _ := json.Marshal(map[string]any{"namespace": ns, "id": "ct-big", "delay": "60s", "payload": make([]byte, 6<<20)})
	for _, chunked = range []bool{false, true} {
		code, _, out := post("application/json", big)
		msg := fmt.Sprint(out["message"])
		if code != http.StatusRequestEntityTooLarge || out["code"] != "resource_exhausted" ||
			!strings.Contains(msg, strconv.Itoa(server.DefaultMaxMessageBytes)) || !strings.Contains(msg, "--max-message-bytes") {
			t.Errorf("6 MiB body (chunked %v): HTTP %d %v; want 413 naming the limit (%d bytes) and --max-message-bytes",
				chunked, code, out, server.DefaultMaxMessageBytes)
		}
	}
	// a body of unknown length within the limit goes through
	if code, _, out := post("application/json", ok); code != http.StatusOK {
		t.Errorf("chunked, small: HTTP %d %v", code, out)
	}
}

// TestUnknownPathIsJSON404 (issue 41): a path that is no RPC and not the
// console answers 404 with a Connect JSON error (code unimplemented, as a
// gRPC client gets for an unknown method) naming the path, the method it
// probably meant, how the API's paths are made, and every one of them;
// it used to be a bare text "Not Found".
func TestUnknownPathIsJSON404(t *testing.T) {
	t.Parallel()
	e := start(t, server.Limits{})
	for _, tc := range []struct {
		method, path, say string
	}{
		{http.MethodPost, "/delayd.v1.TaskService/Upsert", "did you mean /delayd.v1.TaskService/UpsertTask?"},
		{http.MethodPost, "/TaskService/UpsertTask", "did you mean /delayd.v1.TaskService/UpsertTask?"},
		{http.MethodGet, "/api/tasks", "no such path /api/tasks: delayd's HTTP API is POST /<service>/<method>"},
		{http.MethodGet, "/favicon.ico", "the web console is at /ui/"},
	} {
		req, err := http.NewRequestWithContext(t.Context(), tc.method, e.base+tc.path, strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+adminKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body struct {
			Code    string   `json:"code"`
			Message string   `json:"message"`
			Paths   []string `json:"paths"`
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err := json.Unmarshal(raw, &body); err != nil || resp.StatusCode != http.StatusNotFound ||
			resp.Header.Get("Content-Type") != "application/json" || body.Code != "unimplemented" ||
			!strings.Contains(body.Message, tc.say) || !strings.Contains(body.Message, "delayd.v1.TaskService") ||
			!strings.Contains(body.Message, "delayd.v1.NamespaceService") {
			t.Errorf("%s %s: HTTP %d %s %s; want a JSON 404 saying %q", tc.method, tc.path, resp.StatusCode, resp.Header.Get("Content-Type"), raw, tc.say)
			continue
		}
		for _, p := range []string{"/delayd.v1.TaskService/UpsertTask", "/delayd.v1.DeliveryService/Subscribe", "/delayd.v1.NamespaceService/UpdateNamespace"} {
			if !slices.Contains(body.Paths, p) {
				t.Errorf("%s %s: paths %v lack %s", tc.method, tc.path, body.Paths, p)
			}
		}
	}
	// The console and the RPCs are untouched.
	if code, _ := e.call(adminKey, "TaskService/GetTask", map[string]any{"namespace": "web-404", "id": "x"}); code != http.StatusNotFound {
		t.Errorf("GetTask of a missing task: HTTP %d, want 404 from the RPC", code)
	}
	resp, err := http.Get(e.base + "/ui/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /ui/: HTTP %d", resp.StatusCode)
	}
}

// TestJSONFormatErrorsNameFieldAndFormat (issue 41): a payload that is not
// base64, a duration without its s, a time that is not RFC 3339 are
// InvalidArgument naming the field, its value and the format wanted; a
// payload's message said "invalid value for bytes field payload" without
// the word base64, a duration's "invalid google.protobuf.Duration value
// \"30\"" without the field or the format.
func TestJSONFormatErrorsNameFieldAndFormat(t *testing.T) {
	t.Parallel()
	e := start(t, server.Limits{})
	ns := e.namespace("web-fmt-", nil)
	for _, tc := range []struct {
		method string
		body   map[string]any
		say    []string
	}{
		{"TaskService/UpsertTask", map[string]any{"namespace": ns, "id": "o1", "payload": `{"order":42}`, "delay": "30s"},
			[]string{`payload (line 1:`, `is "{\"order\":42}", which is not base64`, `"eyJvcmRlciI6NDJ9"`}},
		{"TaskService/UpsertTask", map[string]any{"namespace": ns, "id": "o1", "delay": "30"},
			[]string{`delay (line 1:`, `is "30", which is not a duration`, `"30s"`, `"900s" for 15 minutes`}},
		{"TaskService/UpsertTask", map[string]any{"namespace": ns, "id": "o1", "delay": "15m"},
			[]string{`delay (line 1:`, `is "15m", which is not a duration`}},
		{"TaskService/UpsertTask", map[string]any{"namespace": ns, "id": "o1", "dueTime": "tomorrow"},
			[]string{`dueTime (line 1:`, `is "tomorrow", which is not a time`, "RFC 3339"}},
		{"DeliveryService/NackTasks", map[string]any{"namespace": ns, "tokens": []string{"x"}, "retryAfter": "10"},
			[]string{`retryAfter (line 1:`, "which is not a duration"}},
		{"NamespaceService/UpdateNamespace", map[string]any{"namespace": map[string]any{"name": ns, "policy": map[string]any{"ackTimeout": "1m"}}, "updateMask": "policy.ackTimeout"},
			[]string{`ackTimeout (line 1:`, `is "1m", which is not a duration`}},
	} {
		code, out := e.call(adminKey, tc.method, tc.body)
		msg := fmt.Sprint(out["message"])
		if code != http.StatusBadRequest || out["code"] != "invalid_argument" {
			t.Errorf("%s %v: HTTP %d %v; want 400 invalid_argument", tc.method, tc.body, code, out)
			continue
		}
		for _, s := range tc.say {
			if !strings.Contains(msg, s) {
				t.Errorf("%s %v: %q lacks %q", tc.method, tc.body, msg, s)
			}
		}
	}
}
