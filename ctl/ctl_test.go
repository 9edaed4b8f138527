package ctl_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/internal/testkit/delaydtest"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/ctl"
	"github.com/delayd/delayd/daemon"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func TestMain(m *testing.M) {
	testkit.Main(m,
		// miniredis (embedded mode) and grpc keep background goroutines
		// that end shortly after Stop.
		goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	)
}

const adminKey = "delayctl-test-admin-key-0123456789"

// delayd starts an in-process delayd in embedded mode with auth on, on a
// free loopback port, and returns its address.
func delayd(t *testing.T) string {
	t.Helper()
	return delaydWith(t, daemon.Config{})
}

// delaydWith is delayd with cfg's other settings.
func delaydWith(t *testing.T, cfg daemon.Config) string {
	t.Helper()
	cfg.Listen, cfg.AdminKey = "127.0.0.1:0", adminKey
	d, err := daemon.Start(t.Context(), cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("daemon.Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := d.Stop(ctx); err != nil {
			t.Errorf("daemon Stop: %v", err)
		}
	})
	return d.Addr()
}

// run runs delayctl with args against addr with key, and returns its
// transcript: the command, stdout, stderr and exit code.
func run(ctx context.Context, addr, key string, args ...string) (transcript string, code int) {
	env := map[string]string{"DELAYD_ADDR": addr, "DELAYD_API_KEY": key}
	var out, errOut testkit.SyncBuffer
	code = ctl.Main(ctx, args, func(k string) string { return env[k] }, strings.NewReader("from stdin"), &out, &errOut)
	var b strings.Builder
	fmt.Fprintf(&b, "$ delayctl %s\n%s", strings.Join(args, " "), out.String())
	if e := errOut.String(); e != "" {
		fmt.Fprintf(&b, "[stderr] %s", e)
	}
	fmt.Fprintf(&b, "[exit %d]\n\n", code)
	return b.String(), code
}

var (
	reSecret = regexp.MustCompile(`dk_[0-9a-f]{16}_[A-Za-z0-9_-]{43}`)
	reKeyID  = regexp.MustCompile(`\b[0-9a-f]{16}\b`)
	reTime   = regexp.MustCompile(`\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})`)
)

// normalize replaces what differs between runs: secrets, key ids, times.
func normalize(s string) string {
	s = reSecret.ReplaceAllString(s, "<secret>")
	s = reKeyID.ReplaceAllString(s, "<key-id>")
	return reTime.ReplaceAllString(s, "<time>")
}

// golden compares got with testdata/name.golden (or rewrites it with -update).
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./ctl -update to create it)", err)
	}
	if string(want) != got {
		t.Errorf("output differs from %s (go test ./ctl -update rewrites it after a deliberate change)\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

// step is one delayctl invocation of a scenario and the exit code it must
// have.
type step struct {
	key  string // "" = the admin key
	code int
	args []string
}

func scenario(t *testing.T, ctx context.Context, addr string, steps []step) string {
	t.Helper()
	var all strings.Builder
	for _, s := range steps {
		key := s.key
		if key == "" {
			key = adminKey
		}
		out, code := run(ctx, addr, key, s.args...)
		if code != s.code {
			t.Errorf("exit %d, want %d:\n%s", code, s.code, out)
		}
		all.WriteString(out)
	}
	return normalize(all.String())
}

func args(s string) []string { return strings.Fields(s) }

// TestGoldenNamespacesKeysTasks walks namespaces, keys and tasks, in table
// and JSON form, with the errors a person meets: the server's message and
// a non-zero exit.
func TestGoldenNamespacesKeysTasks(t *testing.T) {
	addr := delayd(t)
	ctx := t.Context()

	steps := []step{
		{code: 0, args: args("ns create orders --max-attempts 3 --ack-timeout 45s")},
		{code: 0, args: args("ns create loans")},
		{code: 1, args: args("ns create orders")},
		{code: 0, args: args("ns update orders --max-attempts 5")},
		{code: 2, args: args("ns update orders")},
		{code: 0, args: args("ns get orders -o json")},
		{code: 0, args: args("task upsert orders order-1 --delay 1h --kind order.close --payload hello")},
		{code: 0, args: args("task upsert orders order-1 --delay 2h --kind order.close --payload @-")},
		{code: 0, args: args("task upsert orders order-2 --at " + time.Now().Add(48*time.Hour).UTC().Format(time.RFC3339))},
		{code: 2, args: args("task upsert orders order-3")},
		{code: 2, args: args("task upsert orders order-3 --delay 1s --at 2099-01-02T03:04:05Z")},
		{code: 1, args: args("task upsert orders bad/id --delay 1s")},
		{code: 0, args: args("task get orders order-1")},
		{code: 0, args: args("task get orders order-2 -o json")},
		{code: 1, args: args("task get orders missing")},
		{code: 0, args: args("task list orders")},
		{code: 0, args: args("task list orders --no-payload -o json")},
		{code: 2, args: args("task list orders --state later")},
		{code: 0, args: args("ns stats orders")},
		{code: 0, args: args("ns list")},
		{code: 0, args: args("ns list -o json")},
		{code: 0, args: args("task remove orders order-2")},
		{code: 0, args: args("task remove orders order-2")},
		{code: 0, args: args("whoami")},
		{code: 2, args: args("key create orders --scope produce,teleport")},
		{code: 1, args: args("ns update orders --max-attempts 5000")},
		{code: 1, args: args("ns delete orders")},
		{code: 0, args: args("ns delete loans")},
		{code: 1, args: args("key revoke 0123456789abcdef")},
		{code: 1, key: "dk_0123456789abcdef_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", args: args("ns list")},
		{code: 2, args: args("ns list -o yaml")},
	}
	got := scenario(t, ctx, addr, steps)

	// A key of one namespace: it sees its own tasks, never another
	// namespace's, and cannot administer.
	out, code := run(ctx, addr, adminKey, args("key create orders --scope produce --description reader -o json")...)
	if code != 0 {
		t.Fatalf("key create:\n%s", out)
	}
	secret := reSecret.FindString(out)
	if secret == "" {
		t.Fatalf("no secret in:\n%s", out)
	}
	got += normalize(out)
	got += scenario(t, ctx, addr, []step{
		{key: secret, code: 0, args: args("whoami -o json")},
		{key: secret, code: 0, args: args("task list orders")},
		{key: secret, code: 1, args: args("ns create other")},
		{key: secret, code: 1, args: args("ns stats orders")},
		{code: 0, args: args("key list orders")},
	})
	// Revoked, the key is refused at once; the list no longer shows it.
	var created struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):strings.LastIndex(out, "}")+1]), &created); err != nil || created.ID == "" {
		t.Fatalf("no key id in:\n%s", out)
	}
	got += scenario(t, ctx, addr, []step{
		{code: 0, args: args("key revoke " + created.ID)},
		{key: secret, code: 1, args: args("task list orders")},
		{code: 0, args: args("key list orders")},
	})
	golden(t, "namespaces_keys_tasks", got)
}

// TestGoldenDeadLetters: dead letters listed, filtered, requeued and
// purged by id, by filter and with --all.
func TestGoldenDeadLetters(t *testing.T) {
	addr := delayd(t)
	ctx := t.Context()
	if _, code := run(ctx, addr, adminKey, args("ns create billing --max-attempts 1")...); code != 0 {
		t.Fatal("ns create failed")
	}
	c, err := client.New(addr, client.WithAPIKey(adminKey))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Due in id order (in the past: due now), delivered one at a time, so
	// they die in id order and list the same way every run.
	past := time.Now().Add(-time.Hour)
	for i, id := range []string{"inv-1", "inv-2", "inv-3", "pay-1", "pay-2"} {
		kind := "invoice.send"
		if strings.HasPrefix(id, "pay") {
			kind = "payment.retry"
		}
		at := client.At(past.Add(time.Duration(i) * time.Second))
		if _, err := c.Upsert(ctx, "billing", client.TaskSpec{ID: id, Kind: kind, When: at}); err != nil {
			t.Fatal(err)
		}
	}
	// A consumer that fails every task: with max attempts 1 each dies.
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- c.Consume(cctx, "billing", func(_ context.Context, d *client.Delivery) error {
			return fmt.Errorf("upstream said no to %s", d.Task.ID)
		}, client.ConsumeOptions{Concurrency: 1, MaxInFlight: 1})
	}()
	admin := c.Admin()
	waitFor(t, func() bool {
		s, err := admin.Stats(ctx, "billing")
		return err == nil && s.Dead == 5
	})
	cancel()
	<-done

	got := scenario(t, ctx, addr, []step{
		{code: 0, args: args("dead list billing")},
		{code: 0, args: args("dead list billing --kind payment.retry -o json")},
		{code: 2, args: args("dead requeue billing")},
		{code: 2, args: args("dead requeue billing inv-1 --all")},
		// One of the two is no dead letter: it is said, and the exit is 1.
		{code: 1, args: args("dead requeue billing inv-1 not-dead --delay 1h")},
		{code: 1, args: args("dead requeue billing inv-1")},
		{code: 0, args: args("dead purge billing --error-contains inv-2")},
		{code: 0, args: args("dead requeue billing --id-prefix pay- --delay 1h")},
		{code: 0, args: args("dead list billing")},
		{code: 0, args: args("dead purge billing --all")},
		{code: 0, args: args("ns stats billing -o json")},
	})
	golden(t, "dead_letters", got)
}

// TestTailWatchesWithoutConsuming: while tail runs, a real subscriber still
// gets every task on its first attempt and acks it.
func TestTailWatchesWithoutConsuming(t *testing.T) {
	addr := delayd(t)
	ctx := t.Context()
	if _, code := run(ctx, addr, adminKey, args("ns create devices")...); code != 0 {
		t.Fatal("ns create failed")
	}
	// A consume-only key may tail; a produce-only key may not.
	c, err := client.New(addr, client.WithAPIKey(adminKey))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, consumeKey, err := c.Admin().CreateKey(ctx, "devices", []client.Scope{client.ScopeConsume}, "")
	if err != nil {
		t.Fatal(err)
	}
	_, produceKey, err := c.Admin().CreateKey(ctx, "devices", []client.Scope{client.ScopeProduce}, "")
	if err != nil {
		t.Fatal(err)
	}
	refused, code := run(ctx, addr, produceKey, args("tail devices --count 1")...)
	if code != 1 || !strings.Contains(refused, "PermissionDenied") {
		t.Errorf("tail with a produce key:\n%s\nwant PermissionDenied, exit 1", refused)
	}

	env := map[string]string{"DELAYD_ADDR": addr, "DELAYD_API_KEY": consumeKey}
	var out, errOut testkit.SyncBuffer
	tailDone := make(chan int, 1)
	go func() {
		tailDone <- ctl.Main(ctx, args("tail devices --count 3"), func(k string) string { return env[k] }, nil, &out, &errOut)
	}()
	waitFor(t, func() bool { return strings.Contains(errOut.String(), "watching deliveries of devices") })

	var mu sync.Mutex
	attempts := map[string]int32{}
	cctx, cancel := context.WithCancel(ctx)
	consumed := make(chan error, 1)
	go func() {
		consumed <- c.Consume(cctx, "devices", func(_ context.Context, d *client.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			attempts[d.Task.ID] = d.Task.Attempt
			return nil
		}, client.ConsumeOptions{})
	}()
	for _, id := range []string{"dev-a", "dev-b", "dev-c"} {
		if _, err := c.Upsert(ctx, "devices", client.TaskSpec{ID: id, Kind: "device.offline", Payload: []byte("lease of " + id), When: client.After(0)}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case code := <-tailDone:
		if code != 0 {
			t.Fatalf("tail exited %d: %s", code, errOut.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("tail printed %q and is still waiting", out.String())
	}
	// Every task reached the subscriber once, on attempt 1, and was acked.
	waitFor(t, func() bool {
		s, err := c.Admin().Stats(ctx, "devices")
		mu.Lock()
		defer mu.Unlock()
		return err == nil && len(attempts) == 3 && s.Scheduled+s.Delivered+s.Dead == 0
	})
	cancel()
	if err := <-consumed; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("Consume: %v", err)
	}
	for id, a := range attempts {
		if a != 1 {
			t.Errorf("subscriber got %s on attempt %d, want 1", id, a)
		}
	}
	lines := strings.Split(strings.TrimSpace(normalize(out.String())), "\n")
	slices.Sort(lines) // deliveries of tasks due together come in any order
	golden(t, "tail", strings.Join(lines, "\n")+"\n")
}

// waitFor polls cond until it holds (bounded: a broken feature fails the
// test instead of hanging it).
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 30s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestTailSeesEveryReplica (issue 14): tail connected to one delayd sees
// the deliveries another delayd on the same Redis makes (its subscriber is
// connected there). Before the watch feed it saw none and waited forever.
func TestTailSeesEveryReplica(t *testing.T) {
	a := delaydtest.Start(t, daemon.Config{AdminKey: adminKey})
	b := delaydtest.Start(t, daemon.Config{AdminKey: adminKey})
	ctx := t.Context()
	ns := "tail-" + testkit.Suffix()
	if out, code := run(ctx, a.Addr(), adminKey, args("ns create "+ns)...); code != 0 {
		t.Fatalf("ns create: %s", out)
	}
	t.Cleanup(func() { run(context.Background(), a.Addr(), adminKey, args("ns delete "+ns+" --force")...) })

	env := map[string]string{"DELAYD_ADDR": a.Addr(), "DELAYD_API_KEY": adminKey}
	var out, errOut testkit.SyncBuffer
	tailDone := make(chan int, 1)
	tctx, stopTail := context.WithCancel(ctx)
	defer stopTail()
	go func() {
		tailDone <- ctl.Main(tctx, args("tail "+ns+" --count 3"), func(k string) string { return env[k] }, nil, &out, &errOut)
	}()
	waitFor(t, func() bool { return strings.Contains(errOut.String(), "watching deliveries of "+ns) })

	c, err := client.New(b.Addr(), client.WithAPIKey(adminKey))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cctx, cancel := context.WithCancel(ctx)
	consumed := make(chan error, 1)
	go func() {
		consumed <- c.Consume(cctx, ns, func(context.Context, *client.Delivery) error { return nil }, client.ConsumeOptions{})
	}()
	for _, id := range []string{"r-1", "r-2", "r-3"} {
		if _, err := c.Upsert(ctx, ns, client.TaskSpec{ID: id, When: client.After(0)}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case code := <-tailDone:
		if code != 0 {
			t.Errorf("tail exited %d: %s", code, errOut.String())
		}
	case <-time.After(30 * time.Second):
		t.Errorf("tail on one replica printed %q of the deliveries the other made, and is still waiting", out.String())
	}
	for _, id := range []string{"r-1", "r-2", "r-3"} {
		if !strings.Contains(out.String(), id) {
			t.Errorf("tail output lacks %s:\n%s", id, out.String())
		}
	}
	cancel()
	if err := <-consumed; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("Consume: %v", err)
	}
}

// TestGoldenConditionalAndBulk: create-only and compare-and-set upserts and
// removes, and removing many tasks by ids and by filter.
func TestGoldenConditionalAndBulk(t *testing.T) {
	addr := delayd(t)
	ctx := t.Context()
	got := scenario(t, ctx, addr, []step{
		{code: 0, args: args("ns create shop")},
		{code: 0, args: args("task upsert shop order-1 --delay 1h --kind order.close --create-only")},
		{code: 1, args: args("task upsert shop order-1 --delay 2h --kind order.close --create-only")},
		{code: 0, args: args("task upsert shop order-1 --delay 2h --kind order.close --if-generation 1")},
		{code: 1, args: args("task upsert shop order-1 --delay 3h --if-generation 1")},
		{code: 2, args: args("task upsert shop order-1 --delay 3h --if-generation 1 --create-only")},
		{code: 1, args: args("task remove shop order-1 --if-generation 1")},
		{code: 0, args: args("task remove shop order-1 --if-generation 2 -o json")},
		{code: 0, args: args("task upsert shop order-2 --delay 1h --kind order.close")},
		{code: 0, args: args("task upsert shop order-3 --delay 1h --kind order.close")},
		{code: 0, args: args("task upsert shop remind-1 --delay 1h --kind order.remind")},
		{code: 0, args: args("task upsert shop remind-2 --delay 1h --kind order.remind")},
		{code: 0, args: args("task remove-many shop remind-1 missing")},
		{code: 2, args: args("task remove-many shop")},
		{code: 2, args: args("task remove-many shop order-2 --kind order.close")},
		{code: 0, args: args("task remove-many shop --kind order.close --state scheduled -o json")},
		{code: 0, args: args("task list shop")},
		// A due time already past is accepted as due now, and said so.
		{code: 0, args: args("task upsert shop order-past --at 2020-01-01T00:00:00Z")},
		// Durations take days; past the horizon (366d) the server says so.
		{code: 0, args: args("task upsert shop order-later --delay 2d")},
		{code: 1, args: args("task upsert shop order-later --delay 400d")},
		{code: 2, args: args("task upsert shop order-later --delay 400x")},
	})
	golden(t, "conditional_bulk", got)
}

// TestGoldenDeliveryControls: the delivery controls of issue 16 through
// delayctl: pause and the dispatch-rate cap in the stats table, the due
// tasks per kind under it, and a push target set, refused, re-keyed and
// turned off, its secret never printed.
func TestGoldenDeliveryControls(t *testing.T) {
	addr := delaydWith(t, daemon.Config{PushAllow: "hooks.example.com"})
	ctx := t.Context()
	const secret = "push-secret-ZYXWVUTSRQPONMLK"
	got := scenario(t, ctx, addr, []step{
		{code: 0, args: args("ns create shop")},
		{code: 0, args: args("ns update shop --paused --max-dispatch-rate 50")},
		{code: 0, args: args("task upsert shop a1 --delay 0s --kind order.close")},
		{code: 0, args: args("task upsert shop a2 --delay 0s --kind order.close")},
		{code: 0, args: args("task upsert shop b1 --delay 0s --kind order.remind")},
		{code: 0, args: args("task upsert shop c1 --delay 0s")},
		{code: 0, args: args("ns stats shop")},
		{code: 0, args: args("ns stats shop -o json")},
		{code: 0, args: args("ns update shop --paused=false --max-dispatch-rate 0")},
		{code: 0, args: args("ns create hooks --push-url https://hooks.example.com/delayd --push-secret " + secret)},
		{code: 0, args: args("ns get hooks -o json")},
		{code: 1, args: args("ns update hooks --push-url http://169.254.169.254/latest")},
		{code: 1, args: args("ns create nosecret --push-url https://hooks.example.com/x")},
		{code: 0, args: args("ns update hooks --push-secret another-secret-QWERTYUIOP")},
		{code: 0, args: args("ns update hooks --push-url https://hooks.example.com/v2")},
		{code: 0, args: args("ns stats hooks")},
		{code: 0, args: []string{"ns", "update", "hooks", "--push-url="}},
		{code: 2, args: args("ns update shop --push-secret another-secret-QWERTYUIOP")},
	})
	for _, s := range []string{secret, "another-secret-QWERTYUIOP"} {
		if strings.Count(got, s) != strings.Count(got, "--push-secret "+s) {
			t.Errorf("the push secret %q is printed outside the command lines:\n%s", s, got)
		}
	}
	// How late the oldest due task is differs between runs.
	got = regexp.MustCompile(`("oldest_due_lateness": )"[^"]+"`).ReplaceAllString(got, `$1"<lateness>"`)
	got = regexp.MustCompile(`(?m)^(shop +(?:\d+ +){4})\S+`).ReplaceAllString(got, "${1}<lateness>")
	// and so does the width of that column.
	got = regexp.MustCompile(`(?m)^(NAMESPACE|shop) .*$`).ReplaceAllStringFunc(got, func(line string) string {
		return strings.Join(strings.Fields(line), " ")
	})
	golden(t, "delivery_controls", got)
}

// TestGoldenHistoryAndForecast: a namespace that keeps history shows a
// task's events, oldest first, also after the task is removed (who did
// it: the key id); one that keeps none says how to turn it on; stats show
// the due forecast.
func TestGoldenHistoryAndForecast(t *testing.T) {
	addr := delayd(t)
	got := scenario(t, t.Context(), addr, []step{
		{code: 0, args: args("ns create ledger --history-retention-bytes 65536")},
		{code: 0, args: args("task upsert ledger loan-1 --delay 90m --payload due")},
		{code: 0, args: args("task upsert ledger loan-1 --delay 150m --payload renewed")},
		{code: 0, args: args("task upsert ledger loan-2 --delay 5h30m")},
		{code: 0, args: args("ns stats ledger --forecast")},
		{code: 0, args: args("task remove ledger loan-1")},
		{code: 0, args: args("task history ledger loan-1")},
		{code: 0, args: args("task history ledger loan-1 -o json")},
		{code: 0, args: args("ns create quiet")},
		{code: 1, args: args("task history quiet loan-1")},
	})
	golden(t, "history_forecast", got)
}

// TestNsUpdateKeepsUnnamedFields (issue 41): `ns update --paused` sends
// only policy.paused as the update mask, so the namespace keeps its
// dispatch-rate cap and attempts; `ns update` with no policy flag is a
// usage error (exit 2) and sends nothing, so delayctl never makes the
// maskless request the server refuses.
func TestNsUpdateKeepsUnnamedFields(t *testing.T) {
	addr := delayd(t)
	ctx := t.Context()
	policy := func() map[string]any {
		t.Helper()
		out, code := run(ctx, addr, adminKey, "ns", "get", "keep", "-o", "json")
		if code != 0 {
			t.Fatalf("ns get:\n%s", out)
		}
		js := out[strings.Index(out, "{") : strings.LastIndex(out, "}")+1]
		var n struct {
			Policy map[string]any `json:"policy"`
		}
		if err := json.Unmarshal([]byte(js), &n); err != nil {
			t.Fatalf("ns get -o json: %v\n%s", err, out)
		}
		return n.Policy
	}
	for _, s := range []struct {
		code int
		args string
	}{
		{0, "ns create keep --max-dispatch-rate 50 --max-attempts 3"},
		{0, "ns update keep --paused"},
		{2, "ns update keep"},
	} {
		if out, code := run(ctx, addr, adminKey, args(s.args)...); code != s.code {
			t.Fatalf("exit %d, want %d:\n%s", code, s.code, out)
		}
	}
	if p := policy(); p["paused"] != true || p["max_dispatch_rate"] != 50.0 || p["max_attempts"] != 3.0 {
		t.Errorf("after ns update --paused the policy is %v; want paused, max_dispatch_rate 50, max_attempts 3", p)
	}
	if out, code := run(ctx, addr, adminKey, "ns", "update", "keep", "--paused=false"); code != 0 {
		t.Fatalf("resume: exit %d\n%s", code, out)
	}
	if p := policy(); p["paused"] != false || p["max_dispatch_rate"] != 50.0 {
		t.Errorf("after ns update --paused=false the policy is %v; want not paused, max_dispatch_rate 50", p)
	}
}

// TestGoldenSchedules walks the schedule commands: create with a cron in a
// zone, get, list, previews across daylight-saving changes (a stored
// schedule, and a rule tried before creating it), update, pause, resume,
// delete, and the errors of a rule that never fires and of a missing rule.
func TestGoldenSchedules(t *testing.T) {
	addr := delayd(t)
	sched := func(a ...string) []string { return append([]string{"schedule"}, a...) }
	got := scenario(t, t.Context(), addr, []step{
		{code: 0, args: sched("create", "billing", "statement", "--cron", "0 6 1 * *", "--tz", "America/New_York",
			"--kind", "statement.monthly", "--payload", `{"run":"monthly"}`, "--catch-up", "latest", "--id-prefix", "stmt-")},
		{code: 0, args: sched("list", "billing")},
		{code: 0, args: sched("preview", "billing", "statement", "-n", "3", "--after", "2027-09-15T00:00:00Z")},
		{code: 0, args: sched("preview", "billing", "--cron", "30 2 * * *", "--tz", "Europe/Berlin", "-n", "3", "--after", "2027-03-26T12:00:00Z")},
		{code: 0, args: sched("preview", "billing", "--every", "90m", "-n", "2", "--after", "2027-01-01T00:00:00Z", "-o", "json")},
		{code: 0, args: sched("update", "billing", "statement", "--cron", "0 7 1 * *", "--jitter", "10m")},
		{code: 0, args: sched("pause", "billing", "statement")},
		{code: 0, args: sched("resume", "billing", "statement", "-o", "json")},
		{code: 1, args: sched("create", "billing", "never", "--cron", "0 6 31 2 *")},
		{code: 1, args: sched("create", "billing", "sloppy", "--every", "1500ms")},
		{code: 2, args: sched("create", "billing", "norule")},
		{code: 2, args: sched("create", "billing", "x", "--every", "1h", "--catch-up", "sometimes")},
		{code: 0, args: sched("delete", "billing", "statement")},
		{code: 1, args: sched("get", "billing", "statement")},
	})
	// The tz release depends on the host (its zoneinfo, or the one
	// embedded in the binary).
	golden(t, "schedules", regexp.MustCompile(`(tz database |"tz_data_version": ")[^\n"]+`).ReplaceAllString(got, "${1}<tz>"))
}

// TestVersion (issue 41): delayctl --version prints its version, commit
// and Go version, as delayd --version does, and connects to nothing (no
// server is listening at the address it is given).
func TestVersion(t *testing.T) {
	out, code := run(t.Context(), "127.0.0.1:1", "", "--version")
	if code != ctl.ExitOK || !regexp.MustCompile(`(?m)^delayctl \S+ \(commit \S+, go1\.\d+`).MatchString(out) {
		t.Errorf("delayctl --version:\n%s\nwant exit 0 and \"delayctl <version> (commit <commit>, go…)\"", out)
	}
}
