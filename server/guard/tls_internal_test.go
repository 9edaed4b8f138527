package guard

import (
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestHandshakeLogRateLimit: refused handshakes are logged at WARN at most
// once per refusedLogEvery, the next line counts the ones in between, and a
// peer that closes before its ClientHello (a TCP probe) is not a WARN.
func TestHandshakeLogRateLimit(t *testing.T) {
	var buf strings.Builder
	h := newHandshakeLog(slog.New(slog.NewTextHandler(&buf, nil)), nil)
	now := time.Unix(1000, 0)
	h.now = func() time.Time { return now }
	warns := func() int { return strings.Count(buf.String(), "level=WARN") }

	refusal := errors.New("tls: client didn't provide a certificate")
	h.refused("grpc", "10.0.0.7:5000", refusal)
	if warns() != 1 || !strings.Contains(buf.String(), "peer=10.0.0.7:5000") || !strings.Contains(buf.String(), "certificate") {
		t.Fatalf("first refusal: %q, want one WARN line with the peer and the reason", buf.String())
	}
	for range 50 {
		now = now.Add(100 * time.Millisecond)
		h.refused("grpc", "10.0.0.7:5001", refusal)
	}
	h.refused("grpc", "10.0.0.8:5000", io.EOF)
	if warns() != 1 {
		t.Fatalf("50 refusals within %v: %d WARN lines, want 1", refusedLogEvery, warns())
	}
	now = now.Add(refusedLogEvery)
	h.refused("http", "10.0.0.9:5000", refusal)
	if warns() != 2 || !strings.Contains(buf.String(), "refused_unlogged=50") || !strings.Contains(buf.String(), "listener=http") {
		t.Fatalf("after %v: %q, want a second WARN line counting the 50 unlogged refusals", refusedLogEvery, buf.String())
	}
}

// TestHTTPErrorLogRoutesHandshakeErrors: net/http's "TLS handshake error"
// lines reach the handshake log; other lines are logged as they are.
func TestHTTPErrorLogRoutesHandshakeErrors(t *testing.T) {
	var buf strings.Builder
	logger := slog.New(slog.NewTextHandler(&buf, nil))
	l := slog.NewLogLogger(httpErrorLog{refused: newHandshakeLog(logger, nil), logger: logger}, slog.LevelWarn)
	l.Printf("http: TLS handshake error from 192.0.2.1:4431: tls: client didn't provide a certificate")
	if !strings.Contains(buf.String(), `msg="TLS handshake refused`) || !strings.Contains(buf.String(), "peer=192.0.2.1:4431") || !strings.Contains(buf.String(), "listener=http") {
		t.Fatalf("net/http handshake error logged as %q, want the refused-handshake line", buf.String())
	}
	l.Printf("http: Accept error: too many open files")
	if !strings.Contains(buf.String(), `msg="http edge: http: Accept error: too many open files"`) {
		t.Fatalf("other net/http error logged as %q", buf.String())
	}
}
