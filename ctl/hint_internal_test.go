package ctl

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestConnectionHint: a refused TLS handshake or a plaintext/TLS mismatch
// (Unavailable with a transport error) gets a hint naming the TLS flags;
// an answer of the server, even Unavailable, gets none.
func TestConnectionHint(t *testing.T) {
	refused := status.Error(codes.Unavailable, `connection error: desc = "error reading server preface: remote error: tls: certificate required"`)
	pipe := status.Error(codes.Unavailable, "write tcp 127.0.0.1:1->127.0.0.1:2: write: broken pipe")
	storeDown := status.Error(codes.Unavailable, "store unavailable, safe to retry")
	withTLS := &globals{addr: "delayd:7070", tlsCA: "ca.pem"}
	plain := &globals{addr: "delayd:7070"}
	for _, tc := range []struct {
		name string
		g    *globals
		err  error
		want string
	}{
		{"mTLS refusal", withTLS, refused, "--tls-cert and --tls-key"},
		{"mTLS refusal seen as a broken pipe", withTLS, pipe, "--tls-client-ca"},
		{"plaintext client against TLS", plain, status.Error(codes.Unavailable, `connection error: desc = "error reading server preface: EOF"`), "add --tls"},
		{"certificate of another name", withTLS, status.Error(codes.Unavailable, `connection error: desc = "transport: authentication handshake failed: tls: failed to verify certificate: x509: certificate is valid for delayd.internal, not localhost"`), "--tls-server-name"},
		{"certificate without the address", withTLS, status.Error(codes.Unavailable, `connection error: desc = "transport: authentication handshake failed: tls: failed to verify certificate: x509: cannot validate certificate for 127.0.0.1 because it doesn't contain any IP SANs"`), "--tls-server-name"},
		{"unknown CA", &globals{addr: "delayd:7070", tls: true}, status.Error(codes.Unavailable, `connection error: desc = "transport: authentication handshake failed: tls: failed to verify certificate: x509: certificate signed by unknown authority"`), "--tls-ca"},
		{"connection refused: no TLS hint", plain, status.Error(codes.Unavailable, `connection error: desc = "transport: Error while dialing: dial tcp 127.0.0.1:7070: connect: connection refused"`), "is delayd running there?"},
		{"unknown host named", &globals{addr: "delayd.nowhere:7070"}, status.Error(codes.Unavailable, `connection error: desc = "transport: Error while dialing: dial tcp: lookup delayd.nowhere on 127.0.0.53:53: no such host"`), "the host delayd.nowhere of --addr"},
		{"store down", withTLS, storeDown, ""},
		{"not Unavailable", withTLS, status.Error(codes.NotFound, "connection error"), ""},
		{"no status", withTLS, errors.New("broken pipe"), ""},
	} {
		got := tc.g.connectionHint(tc.err)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: hint %q, want one containing %q", tc.name, got, tc.want)
		}
	}
}

// TestConnectionRefusedHintNamesNoTLS: a refused connection is not about
// TLS, and the hint says so by not naming a TLS flag.
func TestConnectionRefusedHintNamesNoTLS(t *testing.T) {
	g := &globals{addr: "localhost:7070"}
	got := g.connectionHint(status.Error(codes.Unavailable, `connection error: desc = "transport: Error while dialing: dial tcp [::1]:7070: connect: connection refused"`))
	if strings.Contains(got, "--tls") {
		t.Errorf("hint for a refused connection names TLS: %q", got)
	}
}
