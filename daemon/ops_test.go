package daemon

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/internal/testkit"
)

// httpGet returns the status and body of GET url.
func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(body)
}

// seriesValue returns the value of one series in a text exposition, e.g.
// `delayd_tasks_acked_total{namespace="x"}`; ok is false if it is absent.
func seriesValue(body, series string) (float64, bool) {
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f, err == nil
		}
	}
	return 0, false
}

// promtool returns the path of promtool, failing the test with what to do
// when it is missing (make test installs it: scripts/ensure-promtool.sh).
func promtool(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool is not installed: run scripts/ensure-promtool.sh (Debian package prometheus), or make test, which runs it")
	}
	return path
}

// TestOpsListenerServesMetricsHealthAndReadiness runs tasks through a real
// daemon over gRPC, then scrapes its ops listener: the counters, the
// lateness histogram, the subscriber gauge, the task counts, the store and
// gRPC metrics and build info are there with the values the traffic
// implies, and promtool accepts the exposition.
func TestOpsListenerServesMetricsHealthAndReadiness(t *testing.T) {
	t.Parallel()
	url := testRedisURL()
	ns := "ops-" + suffix()
	cleanNamespace(t, url, ns)
	s := start(t, Config{RedisURL: url, OpsListen: "127.0.0.1:0"})
	ops := "http://" + s.d.OpsAddr()
	ctx := ctxFor(t)

	const due = 3
	for i := range due {
		req := &delaydv1.UpsertTaskRequest{Namespace: ns, Id: "due-" + strconv.Itoa(i), Payload: []byte("p"),
			When: &delaydv1.UpsertTaskRequest_Delay{Delay: durationpb.New(0)}}
		if _, err := s.tasks.UpsertTask(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.tasks.UpsertTask(ctx, upsert(ns, "later")); err != nil { // due in an hour
		t.Fatal(err)
	}
	deliveries := delaydv1.NewDeliveryServiceClient(s.conn)
	stream, err := deliveries.Subscribe(ctx, &delaydv1.SubscribeRequest{Namespace: ns, MaxInFlight: 10})
	if err != nil {
		t.Fatal(err)
	}
	var tokens []string
	for range due {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, resp.GetDelivery().GetToken())
	}
	if _, err := deliveries.AckTasks(ctx, &delaydv1.AckTasksRequest{Namespace: ns, Tokens: tokens}); err != nil {
		t.Fatal(err)
	}

	body := latenessObserved(t, s, ns, due)
	nsl := `{namespace="` + ns + `"}`
	want := map[string]float64{
		"delayd_tasks_upserted_total" + nsl:                      due + 1,
		"delayd_tasks_acked_total" + nsl:                         due,
		"delayd_delivery_lateness_seconds_count" + nsl:           due,
		"delayd_subscribers" + nsl:                               1,
		`delayd_tasks{namespace="` + ns + `",state="scheduled"}`: 1,
		`delayd_tasks{namespace="` + ns + `",state="delivered"}`: 0,
		`delayd_tasks_due{namespace="` + ns + `"}`:               0,
		// "later" falls due within the hour (less the moments since its
		// upsert), not within 15 minutes.
		`delayd_tasks_due_forecast{namespace="` + ns + `",within="15m"}`:                                                              0,
		`delayd_tasks_due_forecast{namespace="` + ns + `",within="1h"}`:                                                               1,
		`delayd_tasks_due_forecast{namespace="` + ns + `",within="24h"}`:                                                              1,
		`grpc_server_handled_total{grpc_code="OK",grpc_method="AckTasks",grpc_service="delayd.v1.DeliveryService",grpc_type="unary"}`: 1,
		`grpc_server_started_total{grpc_method="Subscribe",grpc_service="delayd.v1.DeliveryService",grpc_type="server_stream"}`:       1,
		// Every registered method's series exist from the start (InitGRPC).
		`grpc_server_started_total{grpc_method="PurgeDeadLetters",grpc_service="delayd.v1.NamespaceService",grpc_type="unary"}`:        0,
		`grpc_server_msg_sent_total{grpc_method="WatchDeliveries",grpc_service="delayd.v1.DeliveryService",grpc_type="server_stream"}`: 0,
	}
	// Subscribe's deliveries are counted by the lateness histogram only, not
	// per message by the gRPC metrics (docs/operating.md says why).
	if strings.Contains(body, `grpc_server_msg_sent_total{grpc_method="Subscribe"`) {
		t.Error("grpc_server_msg_sent_total counts Subscribe's deliveries")
	}
	for series, v := range want {
		got, ok := seriesValue(body, series)
		if !ok || got != v {
			t.Errorf("%s = %v (present %v), want %v", series, got, ok, v)
		}
	}
	// Lateness: tasks due at once are delivered within the hour bucket and
	// never measured negative (below the first bucket means <= 1 ms).
	if got, _ := seriesValue(body, `delayd_delivery_lateness_seconds_bucket{namespace="`+ns+`",le="3600"}`); got != due {
		t.Errorf("lateness le=3600 bucket = %v, want %d", got, due)
	}
	for _, series := range []string{
		`delayd_store_call_duration_seconds_count{op="pop",store="redis"}`,
		`delayd_store_call_duration_seconds_count{op="upsert",store="redis"}`,
	} {
		if got, ok := seriesValue(body, series); !ok || got < 1 {
			t.Errorf("%s = %v (present %v), want >= 1", series, got, ok)
		}
	}
	if !strings.Contains(body, "delayd_build_info{commit=") {
		t.Error("delayd_build_info is missing")
	}

	// Every metric the alert rules and the dashboard use is in the scrape.
	checkDeployReferences(t, body)

	// promtool checks the exposition itself (names, types, help, units).
	cmd := exec.Command(promtool(t), "check", "metrics")
	cmd.Stdin = strings.NewReader(body)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}

	if code, body := httpGet(t, ops+"/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz = %d %q", code, body)
	}
	if code, body := httpGet(t, ops+"/readyz"); code != http.StatusOK || body != "ready\n" {
		t.Errorf("/readyz = %d %q", code, body)
	}
	if code, _ := httpGet(t, ops+"/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("/debug/pprof/ without Pprof = %d, want 404", code)
	}
	// The first log line names the build.
	first, _, _ := strings.Cut(s.log.String(), "\n")
	if !strings.Contains(first, "delayd starting") || !strings.Contains(first, "version=") || !strings.Contains(first, "commit=") {
		t.Errorf("first log line = %q, want the version and commit", first)
	}
}

// TestReadyzSaysWhyWhenRedisIsDown kills the daemon's own Redis: /readyz
// answers 503 naming Redis while /healthz stays 200; pprof is served when
// asked for.
func TestReadyzSaysWhyWhenRedisIsDown(t *testing.T) {
	t.Parallel()
	own := testkit.StartRedis(t)
	s := start(t, Config{RedisURL: own.URL, OpsListen: "127.0.0.1:0", Pprof: true, StoreTimeout: time.Second})
	ops := "http://" + s.d.OpsAddr()
	if code, _ := httpGet(t, ops+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz with Redis up = %d", code)
	}
	if code, _ := httpGet(t, ops+"/debug/pprof/"); code != http.StatusOK {
		t.Errorf("/debug/pprof/ with Pprof = %d, want 200", code)
	}
	own.Kill()
	code, body := httpGet(t, ops+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "redis") {
		t.Errorf("/readyz with Redis down = %d %q, want 503 naming redis", code, body)
	}
	if code, _ := httpGet(t, ops+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz with Redis down = %d, want 200 (the process is alive)", code)
	}
}

// deployDir is the repository's deploy/ folder.
var deployDir = filepath.Join("..", "deploy")

// metricRef finds the delayd and gRPC server metric names an expression uses.
var metricRef = regexp.MustCompile(`\b(delayd_[a-z_]+|grpc_server_[a-z_]+)\b`)

// dashboardExprs returns every query expression of the Grafana dashboard,
// failing the test when it is not valid JSON or a panel has no query.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(deployDir, "grafana", "delayd.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID    string `json:"uid"`
		Panels []struct {
			ID      int    `json:"id"`
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("deploy/grafana/delayd.json: %v", err)
	}
	if dash.UID == "" || len(dash.Panels) == 0 {
		t.Fatal("deploy/grafana/delayd.json: no uid or no panels")
	}
	var exprs []string
	ids := map[int]bool{}
	for _, p := range dash.Panels {
		if ids[p.ID] {
			t.Errorf("dashboard panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("dashboard panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	return exprs
}

// checkDeployReferences fails the test for every metric the alert rules or
// the dashboard name that a real scrape (body) does not expose: a renamed
// metric breaks the alert or panel silently otherwise.
func checkDeployReferences(t *testing.T, body string) {
	t.Helper()
	exposed := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "# TYPE "); ok {
			name, kind, _ := strings.Cut(rest, " ")
			exposed[name] = true
			if kind == "histogram" {
				for _, sfx := range []string{"_bucket", "_sum", "_count"} {
					exposed[name+sfx] = true
				}
			}
		}
	}
	rules, err := os.ReadFile(filepath.Join(deployDir, "prometheus", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	sources := map[string][]string{"deploy/prometheus/alerts.yml": {string(rules)}, "deploy/grafana/delayd.json": dashboardExprs(t)}
	for file, texts := range sources {
		n := 0
		for _, text := range texts {
			for _, name := range metricRef.FindAllString(text, -1) {
				n++
				if !exposed[name] {
					t.Errorf("%s uses %s, which delayd does not expose", file, name)
				}
			}
		}
		if n == 0 {
			t.Errorf("%s uses no delayd metric", file)
		}
	}
}

// TestAlertRules checks deploy/prometheus/alerts.yml with promtool and runs
// its unit tests (alerts_test.yml): each alert fires on the series it is
// meant for, with its labels and summary, and stays quiet otherwise.
func TestAlertRules(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(deployDir, "prometheus")
	testkit.Inputs(t, "..", "deploy/prometheus") // promtool's
	for _, args := range [][]string{{"check", "rules", "alerts.yml"}, {"test", "rules", "alerts_test.yml"}} {
		cmd := exec.Command(promtool(t), args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestPastDueTimeIsNotLateness: a task upserted with a due time in the past
// is due at once, and its lateness is measured from when delayd accepted
// it, not from that due time: the lateness histogram puts it under a
// minute (not the years since 2020) and no late-delivery warning is logged,
// so neither a dashboard nor DelaydDeliveryLate (deploy/prometheus) sees a
// stall that is not there. A task due later than it was accepted is
// measured from its due time, as before.
func TestPastDueTimeIsNotLateness(t *testing.T) {
	t.Parallel()
	url := testRedisURL()
	ns := "past-" + suffix()
	cleanNamespace(t, url, ns)
	s := start(t, Config{RedisURL: url, OpsListen: "127.0.0.1:0"})
	ctx := ctxFor(t)
	past := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	if _, err := s.tasks.UpsertTask(ctx, &delaydv1.UpsertTaskRequest{Namespace: ns, Id: "past", Payload: []byte("p"),
		When: &delaydv1.UpsertTaskRequest_DueTime{DueTime: timestamppb.New(past)}}); err != nil {
		t.Fatal(err)
	}
	deliveries := delaydv1.NewDeliveryServiceClient(s.conn)
	stream, err := deliveries.Subscribe(ctx, &delaydv1.SubscribeRequest{Namespace: ns, MaxInFlight: 10})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetDelivery().GetTask().GetDueTime().AsTime(); !got.Equal(past) {
		t.Errorf("the delivery's due time is %v, want the %v asked for", got, past)
	}
	body := latenessObserved(t, s, ns, 1)
	count, _ := seriesValue(body, `delayd_delivery_lateness_seconds_count{namespace="`+ns+`"}`)
	underMinute, _ := seriesValue(body, `delayd_delivery_lateness_seconds_bucket{namespace="`+ns+`",le="60"}`)
	if count != 1 || underMinute != 1 {
		t.Errorf("lateness histogram: %v deliveries, %v of them under a minute; want 1 and 1 (measured from the upsert, not from 2020)", count, underMinute)
	}
	if strings.Contains(s.log.String(), "delivered late") {
		t.Errorf("a task due before it was upserted was logged as late:\n%s", s.log.String())
	}
}

// latenessObserved waits until ns's lateness histogram has counted n
// deliveries and returns the /metrics body that shows it. The dispatcher
// observes a delivery after the stream's send returns, so a client that has
// received it may read /metrics first (a whole-suite run under scripts/hog.sh
// did: "0 deliveries").
func latenessObserved(t *testing.T, s *started, ns string, n float64) string {
	t.Helper()
	var code int
	var body string
	waitFor(t, "the lateness histogram of "+ns+" to count the deliveries", func() bool {
		code, body = httpGet(t, "http://"+s.d.OpsAddr()+"/metrics")
		got, _ := seriesValue(body, `delayd_delivery_lateness_seconds_count{namespace="`+ns+`"}`)
		return code != http.StatusOK || got >= n
	})
	if code != http.StatusOK {
		t.Fatalf("/metrics = %d", code)
	}
	return body
}

// TestLateDeliveryIsMeasuredFromDueTime: a task that fell due while no
// subscriber was connected is delivered late when one comes, and that
// lateness (from its due time, which was after its upsert) reaches the
// lateness histogram and the late-delivery warning: the stall issue 20
// wants never silent. (The past-due-time rule, TestPastDueTimeIsNotLateness,
// must not zero it: after a pop the task's update time is the pop's.)
func TestLateDeliveryIsMeasuredFromDueTime(t *testing.T) {
	t.Parallel()
	url := testRedisURL()
	ns := "late-" + suffix()
	cleanNamespace(t, url, ns)
	s := start(t, Config{RedisURL: url, OpsListen: "127.0.0.1:0"})
	ctx := ctxFor(t)
	if _, err := s.tasks.UpsertTask(ctx, &delaydv1.UpsertTaskRequest{Namespace: ns, Id: "late", Payload: []byte("p"),
		When: &delaydv1.UpsertTaskRequest_Delay{Delay: durationpb.New(100 * time.Millisecond)}}); err != nil {
		t.Fatal(err)
	}
	const idle = 2500 * time.Millisecond // no subscriber: the task waits past its due time
	time.Sleep(idle)
	deliveries := delaydv1.NewDeliveryServiceClient(s.conn)
	stream, err := deliveries.Subscribe(ctx, &delaydv1.SubscribeRequest{Namespace: ns, MaxInFlight: 10})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	body := latenessObserved(t, s, ns, 1)
	count, _ := seriesValue(body, `delayd_delivery_lateness_seconds_count{namespace="`+ns+`"}`)
	underTwo, _ := seriesValue(body, `delayd_delivery_lateness_seconds_bucket{namespace="`+ns+`",le="1"}`)
	if count != 1 || underTwo != 0 {
		t.Errorf("lateness histogram: %v deliveries, %v of them at most 1 s late; want 1 and 0 (the task waited %v past its due time)", count, underTwo, idle)
	}
	// The warning follows the observation, on the sending goroutine.
	for deadline := time.Now().Add(e2eWait); !strings.Contains(s.log.String(), "delivered late") && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(s.log.String(), "delivered late") {
		t.Errorf("a task delivered %v late was not logged as late:\n%s", idle, s.log.String())
	}
}

// TestPastDueTimeIsNotRecentLateness: GetNamespaceStats' recent lateness
// follows the same rule as the lateness histogram (TestPastDueTimeIsNotLateness):
// a task upserted with a due time in the past is not years late.
func TestPastDueTimeIsNotRecentLateness(t *testing.T) {
	t.Parallel()
	url := testRedisURL()
	ns := "pastrecent-" + suffix()
	cleanNamespace(t, url, ns)
	s := start(t, Config{RedisURL: url})
	ctx := ctxFor(t)
	past := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	if _, err := s.tasks.UpsertTask(ctx, &delaydv1.UpsertTaskRequest{Namespace: ns, Id: "past", Payload: []byte("p"),
		When: &delaydv1.UpsertTaskRequest_DueTime{DueTime: timestamppb.New(past)}}); err != nil {
		t.Fatal(err)
	}
	stream, err := delaydv1.NewDeliveryServiceClient(s.conn).Subscribe(ctx, &delaydv1.SubscribeRequest{Namespace: ns, MaxInFlight: 10})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	st, err := delaydv1.NewNamespaceServiceClient(s.conn).GetNamespaceStats(ctx, &delaydv1.GetNamespaceStatsRequest{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	if p99 := st.GetRecentLatenessP99().AsDuration(); st.GetRecentLatenessP99() == nil || p99 > time.Minute {
		t.Errorf("recent lateness p99 = %v (set %v); want under a minute: measured from the upsert, not from 2020", p99, st.GetRecentLatenessP99() != nil)
	}
}
