package daemon

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/server"
)

// Loopback addresses the tests connect from: Linux routes all of
// 127.0.0.0/8 to lo, so each is a peer of its own to the server.
var (
	floodPeer  = net.IPv4(127, 0, 0, 2)
	politePeer = net.IPv4(127, 0, 0, 3)
	callerPeer = net.IPv4(127, 0, 0, 1)
)

func dialFrom(ctx context.Context, from net.IP, addr string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: from}, Timeout: 10 * time.Second}
	return d.DialContext(ctx, "tcp", addr)
}

// rawIdle opens n TCP connections to addr from ip that never send a byte.
func rawIdle(t *testing.T, from net.IP, addr string, n int) []net.Conn {
	t.Helper()
	var out []net.Conn
	for range n {
		c, err := dialFrom(t.Context(), from, addr)
		if err != nil {
			t.Fatalf("dial %s from %s: %v", addr, from, err)
		}
		t.Cleanup(func() { _ = c.Close() })
		out = append(out, c)
	}
	return out
}

// closedByServer reports whether the server closed c, reading (and
// dropping what the server sent, such as HTTP/2 settings) for up to wait.
func closedByServer(c net.Conn, wait time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(wait))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// openCount is how many of cs the server has not closed, each checked for
// up to wait.
func openCount(cs []net.Conn, wait time.Duration) int {
	n := 0
	for _, c := range cs {
		if !closedByServer(c, wait) {
			n++
		}
	}
	return n
}

// grpcFrom is a gRPC client whose connection comes from ip.
func grpcFrom(t *testing.T, from net.IP, addr string) (*grpc.ClientConn, delaydv1.NamespaceServiceClient) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return dialFrom(ctx, from, a) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn, delaydv1.NewNamespaceServiceClient(conn)
}

// httpWhoAmI calls WhoAmI on the HTTP edge with client and reports
// whether the call reused a kept-alive connection.
func httpWhoAmI(ctx context.Context, client *http.Client, base, key string) (reused bool, err error) {
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/delayd.v1.NamespaceService/WhoAmI", bytes.NewReader([]byte("{}")))
	if err != nil {
		return false, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := client.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return reused, fmt.Errorf("HTTP %d %s", resp.StatusCode, body)
	}
	return reused, nil
}

func httpClientFrom(t *testing.T, from net.IP) *http.Client {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, a string) (net.Conn, error) { return dialFrom(ctx, from, a) }}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

func needLoopbackPeers(t *testing.T) {
	t.Helper()
	c, err := dialFrom(t.Context(), floodPeer, "127.0.0.1:1")
	if err == nil {
		_ = c.Close()
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("this machine cannot dial from 127.0.0.2 (the test needs the whole 127.0.0.0/8 on lo): %v", err)
	}
}

// TestIdleFloodCannotCrowdOutACaller (issue 32 item 6): one address that
// fills --max-connections with idle connections cannot keep
// a caller from another address out, on the gRPC and the HTTP listener:
// the newcomer takes the place of the flooder's longest-idle connection,
// and the flooder's own next connection is closed at once. Before, every
// connection over the cap was closed, the caller's too, for as long as the
// flood's connections lived (up to the 5-minute idle timeout).
func TestIdleFloodCannotCrowdOutACaller(t *testing.T) {
	t.Parallel()
	needLoopbackPeers(t)
	const capConns = 40
	s := start(t, Config{RedisURL: testRedisURL(), AdminKey: guardAdminKey, LogLevel: "error", HTTPListen: "127.0.0.1:0",
		Limits: server.Limits{MaxConnections: capConns, CrowdedIdleTimeout: time.Minute}})
	ctx, cancel := context.WithTimeout(asKey(context.Background(), guardAdminKey), 30*time.Second)
	defer cancel()

	for _, l := range []struct {
		name   string
		addr   string
		isGRPC bool
	}{{"grpc", s.d.Addr(), true}, {"http", s.d.HTTPAddr(), false}} {
		flood := establishedIdle(t, floodPeer, l.addr, l.isGRPC, capConns)
		// The listener is full: the flooder's next connection is closed.
		over := rawIdle(t, floodPeer, l.addr, 1)[0]
		if !closedByServer(over, 10*time.Second) {
			t.Errorf("%s: a connection from the flooding address over the cap was kept", l.name)
		}
		if l.name == "grpc" {
			_, ns := grpcFrom(t, callerPeer, l.addr)
			if _, err := ns.WhoAmI(ctx, &delaydv1.WhoAmIRequest{}); err != nil {
				t.Errorf("grpc: a caller from another address with the listener full of idle connections: %v", err)
			}
		} else if _, err := httpWhoAmI(ctx, httpClientFrom(t, callerPeer), "http://"+l.addr, guardAdminKey); err != nil {
			t.Errorf("http: a caller from another address with the listener full of idle connections: %v", err)
		}
		// The caller took one flood connection's place; the rest stay
		// (their peer keeps its share and more until the crowded timeout).
		if n := openCount(flood, 200*time.Millisecond); n != capConns-1 {
			t.Errorf("%s: %d of the flood's %d connections open after one caller came in; want %d", l.name, n, capConns, capConns-1)
		}
	}
}

// establishedIdle opens n connections to addr from ip that finish their
// handshake (gRPC: the HTTP/2 preface and settings; HTTP: one request
// answered with keep-alive) and then stay idle: only the idle timeouts,
// not the handshake or header timeouts, may close them.
func establishedIdle(t *testing.T, from net.IP, addr string, grpcListener bool, n int) []net.Conn {
	t.Helper()
	cs := rawIdle(t, from, addr, n)
	for _, c := range cs {
		if grpcListener {
			if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
				t.Fatal(err)
			}
			if err := http2.NewFramer(c, c).WriteSettings(); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if _, err := fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", addr); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.Close {
			t.Fatalf("GET / on the HTTP edge (HTTP %d) closes the connection; the test needs one kept alive", resp.StatusCode)
		}
	}
	return cs
}

// TestCrowdedIdleConnectionsCloseSooner (issue 32 item 6): a peer's idle
// connections beyond its share (Limits.IdlePerPeer) are closed after the
// crowded idle timeout, on both listeners, while a peer within its share
// keeps its idle connections (for Limits.MaxConnectionIdle, 5 minutes).
func TestCrowdedIdleConnectionsCloseSooner(t *testing.T) {
	t.Parallel()
	needLoopbackPeers(t)
	const share, flooded = 4, 20
	s := start(t, Config{RedisURL: testRedisURL(), AdminKey: guardAdminKey, LogLevel: "error", HTTPListen: "127.0.0.1:0",
		Limits: server.Limits{IdlePerPeer: share, CrowdedIdleTimeout: 300 * time.Millisecond}})
	ctx, cancel := context.WithTimeout(asKey(context.Background(), guardAdminKey), 60*time.Second)
	defer cancel()

	// A polite peer makes a call on each listener and keeps the connection.
	politeConn, politeNS := grpcFrom(t, politePeer, s.d.Addr())
	if _, err := politeNS.WhoAmI(ctx, &delaydv1.WhoAmIRequest{}); err != nil {
		t.Fatal(err)
	}
	politeHTTP := httpClientFrom(t, politePeer)
	base := "http://" + s.d.HTTPAddr()
	if _, err := httpWhoAmI(ctx, politeHTTP, base, guardAdminKey); err != nil {
		t.Fatal(err)
	}

	// The flooding peer also holds a connection with a stream open: a
	// connection with a call in progress is never closed for being crowded.
	// (A stream anyone may open without a key, such as a health Watch,
	// would not do: it leaves its connection idle, TestKeylessWatchesDoNot
	// LockOutOtherAddresses.)
	e := newGuardEnv(t, s, "crowded-")
	busyConn, _ := grpcFrom(t, floodPeer, s.d.Addr())
	sub, err := delaydv1.NewDeliveryServiceClient(busyConn).Subscribe(ctx, &delaydv1.SubscribeRequest{Namespace: e.ns})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sub.Header(); err != nil {
		t.Fatal(err)
	}

	for _, l := range []struct {
		name   string
		addr   string
		isGRPC bool
	}{{"grpc", s.d.Addr(), true}, {"http", s.d.HTTPAddr(), false}} {
		flood := establishedIdle(t, floodPeer, l.addr, l.isGRPC, flooded)
		// Wait for the crowded ones to be closed; without the rule they
		// would stay for the 5-minute idle timeout.
		open := flooded
		for deadline := time.Now().Add(30 * time.Second); open > share && time.Now().Before(deadline); {
			open = openCount(flood, 20*time.Millisecond)
		}
		if open != share {
			t.Errorf("%s: %d of one peer's %d idle connections open after the crowded timeout; want its share, %d", l.name, open, flooded, share)
		}
		// Its share stays through more sweeps.
		if n := openCount(flood, 100*time.Millisecond); n != share {
			t.Errorf("%s: %d of the peer's connections open after more sweeps; want its share, %d, kept", l.name, n, share)
		}
	}

	if st := busyConn.GetState(); st != connectivity.Ready {
		t.Errorf("grpc: the flooding peer's connection with a stream open is %v; want it kept (READY)", st)
	}
	// The polite peer, idle all this time within its share, kept both.
	if st := politeConn.GetState(); st != connectivity.Ready {
		t.Errorf("grpc: the polite peer's idle connection is %v; want it kept (READY)", st)
	}
	reused, err := httpWhoAmI(ctx, politeHTTP, base, guardAdminKey)
	if err != nil {
		t.Fatal(err)
	}
	if !reused {
		t.Errorf("http: the polite peer's idle connection was closed; want it kept")
	}
}
