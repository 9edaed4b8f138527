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
	"net"
	"net/http"
	"net/netip"
	"strconv"
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
}

// Client POSTs deliveries (dispatcher.Pusher). No proxy from the
// environment is used and redirects are not followed (a 3xx is a failed
// push). Safe for concurrent use.
type Client struct {
	allow *Allow
	ua    string
	now   func() time.Time
	http  *http.Client
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
	c := &Client{allow: opts.Allow, ua: opts.UserAgent, now: opts.Now}
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

// refusedError is a dial the allow list refused.
type refusedError struct{ host, addr string }

func (e *refusedError) Error() string {
	return fmt.Sprintf("%s resolved to %s, an address the operator does not allow (--push-allow)", e.host, e.addr)
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
			if !c.allow.Enabled() || !c.allow.dialAllowed(host, ap.Addr()) {
				return &refusedError{host: host, addr: ap.Addr().Unmap().String()}
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
			return storage.PushRefused, fmt.Errorf("push: %s", refused.Error())
		case ctx.Err() == context.DeadlineExceeded:
			return storage.PushTimeout, fmt.Errorf("push: no answer within %s (the ack timeout)", timeout)
		case ctx.Err() != nil:
			return storage.PushConnectError, fmt.Errorf("push: canceled: %w", context.Cause(ctx))
		}
		return storage.PushConnectError, fmt.Errorf("push: %s", connError(err))
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

// connError is the text of a failed request without the method and URL
// net/http prefixes (the URL is the tenant's own, and long).
func connError(err error) string {
	var ue interface{ Unwrap() error }
	if errors.As(err, &ue) {
		if inner := ue.Unwrap(); inner != nil {
			return "connection failed: " + inner.Error()
		}
	}
	return "connection failed: " + err.Error()
}
