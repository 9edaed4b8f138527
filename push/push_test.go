package push_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
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
}

// TestCheckURL: what a tenant may set as push URL under an allow list.
func TestCheckURL(t *testing.T) {
	ctx := context.Background()
	a := mustAllow(t, "hooks.example.com,*.svc.example.com,203.0.113.0/24,127.0.0.1")
	for url, wantErr := range map[string]string{
		"https://hooks.example.com/delayd":    "",
		"http://HOOKS.example.com:8080/x?y=1": "",
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
	c := push.NewClient(push.ClientOptions{Allow: mustAllow(t, "127.0.0.1/32"), UserAgent: "delayd-test"})
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
	plain := push.NewClient(push.ClientOptions{Allow: mustAllow(t, "127.0.0.1")})
	defer plain.Close()
	if o, err := plain.Push(ctx, target, delivery("t1", 1), 10, 5*time.Second); o != storage.PushConnectError || err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("without the CA: %v %v, want a certificate error", o, err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	trusting := push.NewClient(push.ClientOptions{Allow: mustAllow(t, "127.0.0.1"), RootCAs: pool})
	defer trusting.Close()
	if o, err := trusting.Push(ctx, target, delivery("t1", 1), 10, 5*time.Second); o != storage.PushOK || err != nil {
		t.Errorf("with the CA: %v %v, want ok", o, err)
	}
}

// TestDialRefusesInternalAddresses: a host allowed by name that resolves to
// a loopback address (DNS rebinding) is refused at dial time, and so is an
// address outside the prefixes; nothing reaches the receiver.
func TestDialRefusesInternalAddresses(t *testing.T) {
	hits := 0
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		hits++
		mu.Unlock()
	}))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	ctx := context.Background()
	allow := mustAllow(t, "localhost,203.0.113.0/24")
	if err := allow.CheckURL(ctx, "http://localhost:"+port+"/"); err != nil {
		t.Fatalf("localhost is listed by name, CheckURL = %v", err)
	}
	c := push.NewClient(push.ClientOptions{Allow: allow})
	defer c.Close()
	for _, url := range []string{"http://localhost:" + port + "/", srv.URL + "/"} {
		o, err := c.Push(ctx, storage.PushTarget{URL: url, Secret: "0123456789abcdef"}, delivery("t1", 1), 10, 5*time.Second)
		if o != storage.PushRefused || err == nil || !strings.Contains(err.Error(), "does not allow") {
			t.Errorf("%s: %v %v, want refused", url, o, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if hits != 0 {
		t.Errorf("receiver was reached %d times", hits)
	}
}

func hmacHex(secret []byte, msg string) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(msg))
	return hex.EncodeToString(m.Sum(nil))
}
