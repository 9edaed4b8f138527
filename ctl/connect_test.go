package ctl_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"
)

// TestConnectFailuresOverRealSockets: delayctl against a port nothing
// listens on says so and names the address, without a TLS hint; against a
// host name that cannot resolve (.invalid, RFC 2606) it names the host.
// Real dials, not error strings (TestConnectionHint covers the TLS cases).
func TestConnectFailuresOverRealSockets(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	for _, tc := range []struct {
		name, addr string
		want       []string
	}{
		{"refused", closed, []string{"nothing accepts connections at " + closed, "is delayd running there?"}},
		{"unknown host", "delayd-ctl-test.invalid:7070", []string{"the host delayd-ctl-test.invalid of --addr delayd-ctl-test.invalid:7070 is not known"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			out, code := run(ctx, tc.addr, "", "ns", "list")
			if code == 0 {
				t.Fatalf("exit 0:\n%s", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("transcript does not say %q:\n%s", w, out)
				}
			}
			if strings.Contains(out, "--tls") {
				t.Errorf("a %s connection is not about TLS, but the hint names a TLS flag:\n%s", tc.name, out)
			}
		})
	}
}
