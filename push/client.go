// Package push sends due tasks to HTTP endpoints: the request body and its
// signature (Sign, Verify), the operator's allow list of destinations
// (Allow), and the HTTP client that enforces it on every connection
// (Client, which the dispatcher's push loops call). It knows nothing of
// how tasks are popped or acked; see package dispatcher (push.go) and
// docs/push.md.
package push

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/delayd/delayd/storage"
)

// Body is the JSON document POSTed for one delivery.
type Body struct {
	// Namespace and ID name the task.
	Namespace string `json:"namespace"`
	ID        string `json:"id"`
	// Kind is the task's kind; omitted when empty.
	Kind string `json:"kind,omitempty"`
	// Payload is the task's payload, standard base64 (encoding/json's
	// []byte form).
	Payload []byte `json:"payload"`
	// DueTime is when the task fell due (or its retry did), RFC 3339 UTC.
	DueTime time.Time `json:"due_time"`
	// Attempt counts the deliveries of the task, this one included (1 on
	// the first); MaxAttempts is the namespace's limit: a request with
	// Attempt == MaxAttempts that fails makes the task a dead letter.
	Attempt     int32 `json:"attempt"`
	MaxAttempts int32 `json:"max_attempts"`
	// IdempotencyKey is the same for every delivery of one version of the
	// task (it changes when the task is upserted again): a receiver that
	// keeps the keys it has processed can drop a redelivery.
	IdempotencyKey string `json:"idempotency_key"`
	// DeliveryID names this one delivery (it differs on every retry).
	DeliveryID string `json:"delivery_id"`
}

// Request headers besides SignatureHeader.
const (
	// IdempotencyHeader repeats Body.IdempotencyKey.
	IdempotencyHeader = "Idempotency-Key"
	// DeliveryHeader repeats Body.DeliveryID.
	DeliveryHeader = "Delayd-Delivery-Id"
	// AttemptHeader repeats Body.Attempt.
	AttemptHeader = "Delayd-Attempt"
)

// NewBody returns the body for del.
func NewBody(del storage.Delivery, maxAttempts int32) Body {
	t := del.Task
	key := IdempotencyKey(del.Token)
	return Body{
		Namespace: t.Namespace, ID: t.ID, Kind: t.Kind, Payload: t.Payload,
		DueTime: t.DueTime.UTC(), Attempt: t.Attempt, MaxAttempts: maxAttempts,
		IdempotencyKey: key,
		DeliveryID:     key + "." + strconv.FormatInt(del.Token.Delivery, 10),
	}
}

// IdempotencyKey is Body.IdempotencyKey for a delivery token: 32 hex
// digits derived from the namespace, the task id, its incarnation and its
// generation (so ids of any form fit in a header).
func IdempotencyKey(t storage.Token) string {
	h := sha256.New()
	h.Write([]byte(t.Namespace))
	h.Write([]byte{0})
	h.Write([]byte(t.ID))
	h.Write([]byte{0})
	h.Write([]byte(strconv.FormatInt(t.Incarnation, 10) + "." + strconv.FormatInt(t.Generation, 10)))
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// ClientOptions configures a Client.
type ClientOptions struct {
	// Allow is the operator's allow list; every connection is checked
	// against it. Required (an empty one refuses every request).
	Allow *Allow
	// UserAgent is sent with every request. If empty, "delayd".
	UserAgent string
	// MaxConnsPerHost bounds the connections to one host (keep it at the
	// per-namespace push concurrency). If zero, 16.
	MaxConnsPerHost int
	// Now reads the clock for the signature's timestamp. If nil, time.Now.
	Now func() time.Time
	// RootCAs are the certificate authorities https targets are verified
	// against. If nil, the system's.
	RootCAs *x509.CertPool
	// Logger gets the whole error of a push that could not connect (the
	// addresses dialed, the resolver's and the network's own words), which
	// the task's last error, seen by the tenant, does not carry. If nil,
	// slog.Default().
	Logger *slog.Logger
}

// Client POSTs deliveries (dispatcher.Pusher). No proxy from the
// environment is used and redirects are not followed (a 3xx is a failed
// push). Safe for concurrent use.
type Client struct {
	allow *Allow
	ua    string
	now   func() time.Time
	http  *http.Client
	log   *failLog
}

// NewClient returns a Client.
func NewClient(opts ClientOptions) *Client {
	if opts.UserAgent == "" {
		opts.UserAgent = "delayd"
	}
	if opts.MaxConnsPerHost <= 0 {
		opts.MaxConnsPerHost = 16
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	c := &Client{allow: opts.Allow, ua: opts.UserAgent, now: opts.Now, log: newFailLog(opts.Logger, opts.Now)}
	tr := &http.Transport{
		Proxy:                 nil, // never a proxy from the environment: it would be dialed instead of the target
		DialContext:           c.dial,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   opts.MaxConnsPerHost,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		TLSClientConfig:       &tls.Config{RootCAs: opts.RootCAs, MinVersion: tls.VersionTLS12},
	}
	c.http = &http.Client{
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return c
}

// Close closes idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

// refusedError is a dial the allow list refused. Its text is for the
// operator's log: it names the address dialed.
type refusedError struct{ host, addr string }

func (e *refusedError) Error() string {
	return fmt.Sprintf("%s resolved to %s, an address or port the operator does not allow (--push-allow, --push-allow-ports)", e.host, e.addr)
}

// dial connects to addr ("host:port" from the URL), checking every
// address the host resolves to, as dialed, against the allow list.
func (c *Client) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	d := net.Dialer{
		Timeout:   30 * time.Second,
		KeepAlive: 30 * time.Second,
		Control: func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return &refusedError{host: host, addr: address}
			}
			if !c.allow.Enabled() || !c.allow.dialAllowed(host, ap) {
				return &refusedError{host: host, addr: netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()).String()}
			}
			return nil
		},
	}
	return d.DialContext(ctx, network, addr)
}

// maxResponseRead is how much of a response body is read (and dropped) so
// the connection can be reused.
const maxResponseRead = 64 << 10

// Push POSTs del to target, signed, within timeout, and says how it ended;
// the error (nil for PushOK) says why, for the task's last error.
func (c *Client) Push(ctx context.Context, target storage.PushTarget, del storage.Delivery, maxAttempts int32, timeout time.Duration) (storage.PushOutcome, error) {
	b := NewBody(del, maxAttempts)
	body, err := json.Marshal(b)
	if err != nil {
		return storage.PushHTTPError, fmt.Errorf("push: encoding the request: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target.URL, bytes.NewReader(body))
	if err != nil {
		return storage.PushRefused, fmt.Errorf("push: bad URL: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", c.ua)
	req.Header.Set(SignatureHeader, Sign([]byte(target.Secret), c.now(), body))
	req.Header.Set(IdempotencyHeader, b.IdempotencyKey)
	req.Header.Set(DeliveryHeader, b.DeliveryID)
	req.Header.Set(AttemptHeader, strconv.Itoa(int(del.Task.Attempt)))
	resp, err := c.http.Do(req)
	if err != nil {
		var refused *refusedError
		switch {
		case errors.As(err, &refused):
			c.log.failed(del.Task.Namespace, req.URL.Host, err)
			return storage.PushRefused, errors.New("push: address not allowed (the operator's --push-allow and --push-allow-ports)")
		case ctx.Err() == context.DeadlineExceeded:
			return storage.PushTimeout, fmt.Errorf("push: no answer within %s (the ack timeout)", timeout)
		case ctx.Err() != nil:
			return storage.PushConnectError, fmt.Errorf("push: canceled: %w", context.Cause(ctx))
		}
		c.log.failed(del.Task.Namespace, req.URL.Host, err)
		return storage.PushConnectError, errors.New("push: " + connError(err))
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxResponseRead))
	_ = resp.Body.Close()
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return storage.PushOK, nil
	}
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		return storage.PushHTTPError, fmt.Errorf("push: HTTP %s (redirects are not followed)", resp.Status)
	}
	return storage.PushHTTPError, fmt.Errorf("push: HTTP %s", resp.Status)
}

// connError says why a request could not be made, in a few stable words
// that name no address, port or resolver answer and quote no error text of
// Go's network stack: the task's last error is the tenant's to read, and
// the words it gets must not map the operator's network (which addresses
// answer, which ports are open behind an allowed host). The whole error
// goes to the operator's log (failLog).
func connError(err error) string {
	var (
		dnsErr    *net.DNSError
		unknownCA x509.UnknownAuthorityError
		badHost   x509.HostnameError
		invalid   x509.CertificateInvalidError
		verify    *tls.CertificateVerificationError
		recErr    tls.RecordHeaderError
		alert     tls.AlertError
	)
	switch {
	case errors.As(err, &dnsErr):
		return "the target's host name could not be resolved"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused by target"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.EPIPE),
		// net/http's unexported errServerClosedIdle, for a connection
		// closed before the answer (on a new connection too).
		strings.Contains(err.Error(), "server closed idle connection"):
		return "target closed the connection"
	case errors.Is(err, syscall.ENETUNREACH), errors.Is(err, syscall.EHOSTUNREACH):
		return "target unreachable"
	case errors.As(err, &unknownCA):
		return "TLS: the target's certificate is not signed by a trusted authority (the operator may add one with --push-ca)"
	case errors.As(err, &badHost):
		return "TLS: the target's certificate does not name its host"
	case errors.As(err, &invalid), errors.As(err, &verify):
		return "TLS: the target's certificate is not valid"
	case errors.As(err, &recErr):
		return "TLS: the target does not speak TLS (an http:// URL may be meant)"
	case errors.As(err, &alert):
		return "TLS: the target refused the handshake"
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "connection to target timed out"
	}
	return "connection to target failed"
}

// failLogEvery is the shortest time between two log lines about one
// namespace's failed pushes.
const failLogEvery = 10 * time.Second

// failLog writes the whole error of failed connections to the operator's
// log at WARN, at most one line per namespace every failLogEvery, with the
// count of failures since its last line.
type failLog struct {
	logger *slog.Logger
	now    func() time.Time
	mu     sync.Mutex
	last   map[string]failSeen
}

type failSeen struct {
	at     time.Time
	missed int
}

func newFailLog(logger *slog.Logger, now func() time.Time) *failLog {
	return &failLog{logger: logger, now: now, last: make(map[string]failSeen)}
}

func (l *failLog) failed(ns, host string, err error) {
	now := l.now()
	l.mu.Lock()
	seen := l.last[ns]
	if !seen.at.IsZero() && now.Sub(seen.at) < failLogEvery {
		seen.missed++
		l.last[ns] = seen
		l.mu.Unlock()
		return
	}
	l.last[ns] = failSeen{at: now}
	if len(l.last) > 10_000 { // forget old namespaces rather than grow
		for k, v := range l.last {
			if now.Sub(v.at) >= failLogEvery {
				delete(l.last, k)
			}
		}
	}
	l.mu.Unlock()
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err // without the method and the whole URL
	}
	l.logger.Warn("push: connection failed", "namespace", ns, "host", host, "error", err.Error(),
		"failures_not_logged", seen.missed)
}
