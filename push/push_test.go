package push_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/push"
	"github.com/delayd/delayd/storage"
)

func TestMain(m *testing.M) {
	testkit.Main(m)
}

func mustAllow(t *testing.T, list string) *push.Allow {
	t.Helper()
	a, err := push.ParseAllow(list)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// loopbackPorts are the ports the tests' receivers (httptest, on random
// loopback ports) listen on: --push-allow-ports must name them.
const loopbackPorts = "1024-65535"

// mustAllowPorts is mustAllow with the ports allowed (--push-allow-ports).
func mustAllowPorts(t *testing.T, list, ports string) *push.Allow {
	t.Helper()
	a, err := mustAllow(t, list).WithPorts(ports)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestParseAllow: hosts, wildcards, addresses and prefixes parse; anything
// else is refused with the entry named.
func TestParseAllow(t *testing.T) {
	a := mustAllow(t, "hooks.example.com, *.svc.example.com 203.0.113.0/24,2001:db8::/32,198.51.100.7")
	if !a.Enabled() || a.String() != "hooks.example.com,*.svc.example.com,203.0.113.0/24,2001:db8::/32,198.51.100.7" {
		t.Fatalf("ParseAllow = %q, enabled %v", a.String(), a.Enabled())
	}
	if e := mustAllow(t, " "); e.Enabled() {
		t.Fatal("an empty list enables push")
	}
	for _, bad := range []string{"http://x.example.com", "a..b", "*.", "exa mple/x", "-x.example.com", "10.0.0.0/33"} {
		if _, err := push.ParseAllow(bad); err == nil {
			t.Errorf("ParseAllow(%q) accepted", bad)
		}
	}
	if got := a.Ports(); got != "80,443" {
		t.Errorf("ports allowed by default = %q, want 80,443", got)
	}
	if w, err := a.WithPorts(" 443, 8000-8999 "); err != nil || w.Ports() != "443,8000-8999" || a.Ports() != "80,443" {
		t.Errorf("WithPorts = %v, %v (the original then allows %q)", w, err, a.Ports())
	}
	for _, bad := range []string{"0", "65536", "http", "9000-8000", "80-", "-80", "1-2-3"} {
		if _, err := a.WithPorts(bad); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", bad)) {
			t.Errorf("WithPorts(%q) = %v, want an error naming it", bad, err)
		}
	}
}

// TestCheckURL: what a tenant may set as push URL under an allow list.
func TestCheckURL(t *testing.T) {
	ctx := context.Background()
	a := mustAllowPorts(t, "hooks.example.com,*.svc.example.com,203.0.113.0/24,127.0.0.1", "80,443,8080,9")
	for url, wantErr := range map[string]string{
		"https://hooks.example.com/delayd":    "",
		"http://HOOKS.example.com:8080/x?y=1": "",
		"https://hooks.example.com:443/":      "",
		"https://hooks.example.com:6379/":     "port 6379, which the operator does not allow push to; allowed: ports 80,443,8080,9 (--push-allow-ports)",
		"http://127.0.0.1:3306/":              "port 3306",
		"https://a.svc.example.com/":          "",
		"https://b.a.svc.example.com/":        "",
		"https://svc.example.com/":            "does not allow",
		"https://203.0.113.9/hook":            "",
		"https://203.0.114.9/hook":            "does not allow",
		"http://127.0.0.1:9/":                 "",
		"http://[::1]/":                       "does not allow",
		"ftp://hooks.example.com/":            `scheme "ftp"`,
		"https://user:pw@hooks.example.com/":  "credentials",
		"https://hooks.example.com/#frag":     "fragment",
		"hooks.example.com/x":                 "scheme",
		"https:///x":                          "no host",
		"https://hooks.example.com:99999/":    "port",
		"https://evil.example.net/":           "does not allow",
		"https://localhost/":                  "does not allow", // resolves to 127.0.0.1, but only prefixes admit unlisted names and it may resolve to ::1 too
		"https://hooks.example.com/" + strings.Repeat("a", push.MaxURLBytes): "bytes",
	} {
		err := a.CheckURL(ctx, url)
		switch {
		case wantErr == "" && err != nil:
			t.Errorf("CheckURL(%q) = %v, want allowed", url, err)
		case wantErr != "" && (err == nil || !strings.Contains(err.Error(), wantErr)):
			if url == "https://localhost/" && err == nil {
				continue // a resolver answering 127.0.0.1 only admits it by the prefix: fine
			}
			t.Errorf("CheckURL(%q) = %v, want an error containing %q", url, err, wantErr)
		}
	}
	if err := mustAllow(t, "").CheckURL(ctx, "https://hooks.example.com/"); !errors.Is(err, push.ErrDisabled) || !strings.Contains(err.Error(), "--push-allow") {
		t.Errorf("CheckURL with push disabled = %v, want ErrDisabled naming the flag", err)
	}
	// The error says what is allowed.
	if err := a.CheckURL(ctx, "https://evil.example.net/"); err == nil || !strings.Contains(err.Error(), "hooks.example.com, *.svc.example.com") {
		t.Errorf("refusal %v does not list what is allowed", err)
	}
}

// TestDefaultPorts (issue 32 item 5): by default a push URL may name 80 or
// 443 only, a URL without a port names its scheme's, and any other port is
// refused naming it and the flag that widens the list.
func TestDefaultPorts(t *testing.T) {
	ctx := context.Background()
	a := mustAllow(t, "hooks.example.com,127.0.0.1/32")
	for url, wantErr := range map[string]string{
		"https://hooks.example.com/":      "",
		"https://hooks.example.com:443/":  "",
		"http://hooks.example.com/":       "",
		"http://hooks.example.com:80/":    "",
		"https://hooks.example.com:80/":   "",
		"http://127.0.0.1/":               "",
		"https://hooks.example.com:8443/": "port 8443, which the operator does not allow push to; allowed: ports 80,443 (--push-allow-ports)",
		"http://127.0.0.1:6379/":          "port 6379",
		"http://127.0.0.1:22/":            "port 22",
	} {
		err := a.CheckURL(ctx, url)
		if wantErr == "" && err != nil || wantErr != "" && (err == nil || !strings.Contains(err.Error(), wantErr)) {
			t.Errorf("CheckURL(%q) = %v, want %q", url, err, wantErr)
		}
	}
}

// TestDialRefusesPortsNotAllowed (issue 32 item 5): the port is checked
// again on the connection, so a URL set under wider ports (or a redirect
// of the connection's address) reaches nothing on a port not allowed
// now; the tenant's last error says only that the address is not allowed.
func TestDialRefusesPortsNotAllowed(t *testing.T) {
	srv, port, hits := countingReceiver(t)
	target := storage.PushTarget{URL: srv.URL + "/", Secret: "0123456789abcdef"}
	ctx := context.Background()

	// Allowed when the port is listed: the request arrives.
	wide := push.NewClient(push.ClientOptions{Allow: mustAllowPorts(t, "127.0.0.1/32", "443,"+port)})
	defer wide.Close()
	if o, err := wide.Push(ctx, target, delivery("t1", 1), 10, 5*time.Second); o != storage.PushOK || err != nil {
		t.Fatalf("port %s allowed: %v %v", port, o, err)
	}
	// The default list: refused at dial, nothing sent.
	var logs bytes.Buffer
	narrow := push.NewClient(push.ClientOptions{Allow: mustAllow(t, "127.0.0.1/32"), Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	defer narrow.Close()
	o, err := narrow.Push(ctx, target, delivery("t1", 1), 10, 5*time.Second)
	if o != storage.PushRefused || err == nil || err.Error() != "push: address not allowed (the operator's --push-allow and --push-allow-ports)" {
		t.Errorf("port %s not allowed: %v %v, want refused with the stable wording", port, o, err)
	}
	// The operator's log names what was dialed.
	if !strings.Contains(logs.String(), "127.0.0.1:"+port) {
		t.Errorf("the operator's log does not name the address refused: %s", logs.String())
	}
	if hits.Load() != 1 {
		t.Errorf("receiver reached %d times, want once (by the client allowing its port)", hits.Load())
	}
}

// TestLastErrorRevealsNoConnectionDetails (issue 32 item 5): a push that
// cannot connect — a closed port, a target that closes the connection, an
// unresolvable name, a refused address — leaves a last error in a few
// stable words, without the address, the port or the network stack's
// text; the whole error goes to the operator's log.
func TestLastErrorRevealsNoConnectionDetails(t *testing.T) {
	ctx := context.Background()
	closedLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closedLis.Addr().String()
	_ = closedLis.Close()
	// A target that accepts and closes at once.
	hangup, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hangup.Close()
	go func() {
		for {
			c, err := hangup.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	var logs bytes.Buffer
	c := push.NewClient(push.ClientOptions{Allow: mustAllowPorts(t, "127.0.0.1/32,hooks.invalid", loopbackPorts),
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	defer c.Close()
	for _, tc := range []struct {
		url     string
		outcome storage.PushOutcome
		want    string
	}{
		{"http://" + closedAddr + "/", storage.PushConnectError, "push: connection refused by target"},
		{"http://" + hangup.Addr().String() + "/", storage.PushConnectError, "push: target closed the connection"},
		{"http://hooks.invalid:8080/", storage.PushConnectError, "push: the target's host name could not be resolved"},
		{"http://127.0.0.2:8080/", storage.PushRefused, "push: address not allowed (the operator's --push-allow and --push-allow-ports)"},
	} {
		// A different namespace each, so each failure is logged.
		del := delivery("t1", 1)
		del.Task.Namespace = tc.url
		o, err := c.Push(ctx, storage.PushTarget{URL: tc.url, Secret: "0123456789abcdef"}, del, 10, 5*time.Second)
		if o != tc.outcome || err == nil || err.Error() != tc.want {
			t.Errorf("%s: %v %v, want %v %q", tc.url, o, err, tc.outcome, tc.want)
		}
	}
	for _, detail := range []string{closedAddr, "connect: connection refused", "127.0.0.2:8080", "hooks.invalid"} {
		if !strings.Contains(logs.String(), detail) {
			t.Errorf("the operator's log does not carry %q: %s", detail, logs.String())
		}
	}
}

// TestSignVerify: the documented algorithm, computed here by hand, is what
// Sign produces and Verify accepts; a wrong secret, a changed body and a
// stale timestamp are refused.
func TestSignVerify(t *testing.T) {
	secret := []byte("0123456789abcdef")
	body := []byte(`{"id":"t1"}`)
	at := time.Unix(1_700_000_000, 0)
	h := push.Sign(secret, at, body)
	// hex(HMAC-SHA256("0123456789abcdef", "1700000000." + body)), by `openssl dgst -sha256 -hmac`.
	want := "t=1700000000,v1=" + hmacHex(secret, "1700000000."+string(body))
	if h != want {
		t.Fatalf("Sign = %s, want %s", h, want)
	}
	if err := push.Verify(secret, h, body, at.Add(time.Minute), 0); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if err := push.Verify([]byte("another secret!!"), h, body, at, 0); !errors.Is(err, push.ErrBadSignature) {
		t.Errorf("Verify with a wrong secret = %v", err)
	}
	if err := push.Verify(secret, h, []byte(`{"id":"t2"}`), at, 0); !errors.Is(err, push.ErrBadSignature) {
		t.Errorf("Verify of another body = %v", err)
	}
	if err := push.Verify(secret, h, body, at.Add(6*time.Minute), 0); !errors.Is(err, push.ErrStale) {
		t.Errorf("Verify 6 minutes later = %v, want ErrStale", err)
	}
	for _, bad := range []string{"", "t=1", "v1=00", "t=x,v1=00", "t=1700000000,v1=zz"} {
		if err := push.Verify(secret, bad, body, at, 0); !errors.Is(err, push.ErrMalformed) {
			t.Errorf("Verify(%q) = %v, want ErrMalformed", bad, err)
		}
	}
}

func delivery(id string, attempt int32) storage.Delivery {
	return storage.Delivery{
		Task: storage.Task{Namespace: "orders", ID: id, Kind: "close", Payload: []byte("\x00hi"),
			DueTime: time.UnixMilli(1_700_000_000_123), Attempt: attempt, Generation: 2, Incarnation: 7},
		Token: storage.Token{Namespace: "orders", ID: id, Incarnation: 7, Generation: 2, Attempt: attempt, Delivery: 40 + int64(attempt)},
	}
}

// TestPushOutcomes: one request per outcome against a local receiver.
func TestPushOutcomes(t *testing.T) {
	var mu sync.Mutex
	var got []*http.Request
	var bodies [][]byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got, bodies = append(got, r), append(bodies, b)
		mu.Unlock()
		switch r.URL.Path {
		case "/ok":
			w.WriteHeader(http.StatusNoContent)
		case "/fail":
			http.Error(w, "down", http.StatusInternalServerError)
		case "/redirect":
			http.Redirect(w, r, "/ok", http.StatusFound)
		case "/slow":
			select {
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
		}
	}))
	defer srv.Close()
	c := push.NewClient(push.ClientOptions{Allow: mustAllowPorts(t, "127.0.0.1/32", loopbackPorts), UserAgent: "delayd-test"})
	defer c.Close()
	ctx := context.Background()
	secret := "0123456789abcdef"
	run := func(path string, timeout time.Duration) (storage.PushOutcome, error) {
		return c.Push(ctx, storage.PushTarget{URL: srv.URL + path, Secret: secret}, delivery("t1", 3), 10, timeout)
	}
	if o, err := run("/ok", 5*time.Second); o != storage.PushOK || err != nil {
		t.Fatalf("/ok: %v %v", o, err)
	}
	if o, err := run("/fail", 5*time.Second); o != storage.PushHTTPError || err == nil || !strings.Contains(err.Error(), "500") {
		t.Errorf("/fail: %v %v", o, err)
	}
	if o, err := run("/redirect", 5*time.Second); o != storage.PushHTTPError || err == nil || !strings.Contains(err.Error(), "302") {
		t.Errorf("/redirect: %v %v", o, err)
	}
	if o, err := run("/slow", 200*time.Millisecond); o != storage.PushTimeout || err == nil {
		t.Errorf("/slow: %v %v", o, err)
	}
	mu.Lock()
	for _, r := range got {
		if r.URL.Path == "/ok" && r.Method != http.MethodPost {
			t.Errorf("method %s", r.Method)
		}
	}
	if n := len(got); n != 4 {
		t.Errorf("receiver saw %d requests, want 4 (the redirect not followed)", n)
	}
	first, body := got[0], bodies[0]
	mu.Unlock()
	if err := push.Verify([]byte(secret), first.Header.Get(push.SignatureHeader), body, time.Now(), 0); err != nil {
		t.Errorf("signature does not verify: %v", err)
	}
	var b push.Body
	if err := json.Unmarshal(body, &b); err != nil {
		t.Fatal(err)
	}
	want := push.NewBody(delivery("t1", 3), 10)
	if b.Namespace != "orders" || b.ID != "t1" || b.Kind != "close" || string(b.Payload) != "\x00hi" || b.Attempt != 3 || b.MaxAttempts != 10 ||
		!b.DueTime.Equal(time.UnixMilli(1_700_000_000_123)) || b.IdempotencyKey != want.IdempotencyKey || b.DeliveryID != want.DeliveryID {
		t.Errorf("body %+v", b)
	}
	if !strings.Contains(string(body), `"payload":"AGhp"`) || !strings.Contains(string(body), `"due_time":"2023-11-14T22:13:20.123Z"`) {
		t.Errorf("body %s: payload not base64 or due time not RFC 3339 UTC", body)
	}
	if first.Header.Get(push.IdempotencyHeader) != want.IdempotencyKey || first.Header.Get(push.AttemptHeader) != "3" ||
		first.Header.Get("Content-Type") != "application/json" || first.Header.Get("User-Agent") != "delayd-test" {
		t.Errorf("headers %v", first.Header)
	}
	// The next attempt of the same version keeps the idempotency key and
	// changes the delivery id.
	if next := push.NewBody(delivery("t1", 4), 10); next.IdempotencyKey != want.IdempotencyKey || next.DeliveryID == want.DeliveryID {
		t.Errorf("retry body keys %+v vs %+v", next, want)
	}

	// A closed port: a connection error.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	_ = lis.Close()
	if o, err := c.Push(ctx, storage.PushTarget{URL: "http://" + addr + "/", Secret: secret}, delivery("t1", 1), 10, 5*time.Second); o != storage.PushConnectError || err == nil {
		t.Errorf("closed port: %v %v", o, err)
	}
}

// TestPushTLSRootCAs: an https target whose certificate a private CA
// signed is a connection error with the system roots, and is pushed to
// once that CA is given (--push-ca).
func TestPushTLSRootCAs(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	defer srv.Close()
	target := storage.PushTarget{URL: srv.URL, Secret: "0123456789abcdef"}
	ctx := context.Background()
	plain := push.NewClient(push.ClientOptions{Allow: mustAllowPorts(t, "127.0.0.1", loopbackPorts)})
	defer plain.Close()
	if o, err := plain.Push(ctx, target, delivery("t1", 1), 10, 5*time.Second); o != storage.PushConnectError || err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("without the CA: %v %v, want a certificate error", o, err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	trusting := push.NewClient(push.ClientOptions{Allow: mustAllowPorts(t, "127.0.0.1", loopbackPorts), RootCAs: pool})
	defer trusting.Close()
	if o, err := trusting.Push(ctx, target, delivery("t1", 1), 10, 5*time.Second); o != storage.PushOK || err != nil {
		t.Errorf("with the CA: %v %v, want ok", o, err)
	}
}

// TestDialRefusesInternalAddresses: a host allowed by name that resolves to
// a loopback address (DNS rebinding) is refused at dial time, and so is an
// address outside the prefixes; nothing reaches the receiver.
func TestDialRefusesInternalAddresses(t *testing.T) {
	srv, port, hits := countingReceiver(t)
	ctx := context.Background()
	allow := mustAllowPorts(t, "localhost,203.0.113.0/24", port)
	if err := allow.CheckURL(ctx, "http://localhost:"+port+"/"); err != nil {
		t.Fatalf("localhost is listed by name, CheckURL = %v", err)
	}
	c := push.NewClient(push.ClientOptions{Allow: allow})
	defer c.Close()
	for _, url := range []string{"http://localhost:" + port + "/", srv.URL + "/"} {
		o, err := c.Push(ctx, storage.PushTarget{URL: url, Secret: "0123456789abcdef"}, delivery("t1", 1), 10, 5*time.Second)
		if o != storage.PushRefused || err == nil || !strings.Contains(err.Error(), "address not allowed") {
			t.Errorf("%s: %v %v, want refused", url, o, err)
		}
	}
	if hits.Load() != 0 {
		t.Errorf("receiver was reached %d times", hits.Load())
	}
}

// countingReceiver is a local receiver answering 200; it returns its
// port and the count of requests it got.
func countingReceiver(t *testing.T) (*httptest.Server, string, *atomic.Int64) {
	t.Helper()
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	t.Cleanup(srv.Close)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	return srv, port, &hits
}

func hmacHex(secret []byte, msg string) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(msg))
	return hex.EncodeToString(m.Sum(nil))
}
