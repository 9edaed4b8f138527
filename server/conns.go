package server

import (
	"cmp"
	"context"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"

	"github.com/delayd/delayd/server/guard"
)

// Connections, by peer. Each listener (gRPC and HTTP) holds at most
// Limits.MaxConnections connections; one peer — an IPv4 address, or an
// IPv6 /64, which one host gets as easily as one address — may keep only
// its share of them idle:
//
//   - a connection is idle when no call (gRPC stream, HTTP request) is in
//     progress on it, streams of the methods that need no key (health
//     Watch, reflection: keyless.go) aside; a new one is idle until its
//     first call;
//   - a peer's idle connections beyond Limits.IdlePerPeer are closed once
//     they have been idle for Limits.CrowdedIdleTimeout (10 s), the longest
//     idle first; the others keep Limits.MaxConnectionIdle (5 minutes);
//   - a connection accepted with the listener full takes the place of the
//     longest-idle connection of the peer holding the most idle ones beyond
//     its share; when no peer is over its share, or the newcomer's own peer
//     is, the newcomer is closed at once.
//
// So one address opening thousands of connections and leaving them idle
// cannot keep a caller from elsewhere out: its idle connections go first.
// Connections with calls in progress are never closed for it; a stream
// anyone may open without a key does not make its connection busy.

// connTable tracks the connections of one listener.
type connTable struct {
	max         int
	share       int
	crowdedIdle time.Duration
	reg         *connRegistry

	mu      sync.Mutex
	open    int
	peers   map[netip.Prefix]map[*limitConn]struct{}
	keyless map[netip.Prefix]int // streams that need no key, by peer (keyless.go)

	stopOnce sync.Once
	stop     chan struct{}
	done     chan struct{}
}

// connAddrs name a TCP connection.
type connAddrs struct{ local, remote netip.AddrPort }

func addrsOf(local, remote net.Addr) (connAddrs, bool) {
	l, ok1 := local.(*net.TCPAddr)
	r, ok2 := remote.(*net.TCPAddr)
	if !ok1 || !ok2 {
		return connAddrs{}, false
	}
	return connAddrs{l.AddrPort(), r.AddrPort()}, true
}

// connRegistry finds a connection of the server's listeners by its
// addresses, for the hooks that see a call begin and end (the gRPC
// interceptors, through the call's peer, and net/http's ConnState), which
// see the addresses, not the *limitConn under TLS and HTTP/2 wrappers.
type connRegistry struct {
	keyless keylessLimits // set once, before serving

	mu sync.RWMutex
	m  map[connAddrs]*limitConn
}

func (r *connRegistry) find(local, remote net.Addr) *limitConn {
	a, ok := addrsOf(local, remote)
	if !ok {
		return nil
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.m[a]
}

func (r *connRegistry) add(c *limitConn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = make(map[connAddrs]*limitConn)
	}
	r.m[c.addrs] = c
}

func (r *connRegistry) remove(c *limitConn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m[c.addrs] == c {
		delete(r.m, c.addrs)
	}
}

// limitListener admits connections through its table (see above).
type limitListener struct {
	net.Listener
	t *connTable
}

func newLimitListener(lis net.Listener, l Limits, reg *connRegistry) *limitListener {
	t := &connTable{
		max: l.MaxConnections, share: l.IdlePerPeer, crowdedIdle: l.CrowdedIdleTimeout, reg: reg,
		peers: make(map[netip.Prefix]map[*limitConn]struct{}), keyless: make(map[netip.Prefix]int),
		stop: make(chan struct{}), done: make(chan struct{}),
	}
	go t.sweep()
	return &limitListener{Listener: lis, t: t}
}

// Close closes the listener and stops its sweeper; open connections stay.
func (l *limitListener) Close() error {
	err := l.Listener.Close()
	l.t.stopOnce.Do(func() { close(l.t.stop) })
	<-l.t.done
	return err
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if lc := l.t.admit(c); lc != nil {
			return lc, nil
		}
		_ = c.Close()
	}
}

// admit returns c tracked, or nil when c must be closed.
func (t *connTable) admit(c net.Conn) *limitConn {
	lc := &limitConn{Conn: c, t: t}
	lc.addrs, lc.tracked = addrsOf(c.LocalAddr(), c.RemoteAddr())
	lc.peer = guard.PeerOfAddrPort(lc.addrs.remote)
	lc.idleSince.Store(time.Now().UnixNano())
	var victim *limitConn
	t.mu.Lock()
	if t.open >= t.max {
		victim = t.victimFor(lc.peer)
		if victim == nil {
			t.mu.Unlock()
			return nil
		}
		t.removeLocked(victim)
	}
	t.open++
	if lc.tracked {
		if t.peers[lc.peer] == nil {
			t.peers[lc.peer] = make(map[*limitConn]struct{})
		}
		t.peers[lc.peer][lc] = struct{}{}
		t.reg.add(lc)
	}
	t.mu.Unlock()
	if victim != nil {
		_ = victim.Conn.Close()
	}
	return lc
}

// idleOf returns a peer's idle connections, longest idle first.
func idleOf(conns map[*limitConn]struct{}) []*limitConn {
	var idle []*limitConn
	for c := range conns {
		if c.active.Load() == 0 {
			idle = append(idle, c)
		}
	}
	slices.SortFunc(idle, func(a, b *limitConn) int { return cmp.Compare(a.idleSince.Load(), b.idleSince.Load()) })
	return idle
}

// victimFor picks the connection a newcomer from peer replaces when the
// listener is full: the longest-idle one of the peer with the most idle
// connections beyond its share. None when peer is itself at its share, or
// no peer is over it. Callers hold t.mu.
func (t *connTable) victimFor(peer netip.Prefix) *limitConn {
	if len(idleOf(t.peers[peer])) >= t.share {
		return nil
	}
	var worst []*limitConn
	for _, conns := range t.peers {
		if len(conns) <= t.share {
			continue
		}
		if idle := idleOf(conns); len(idle) > t.share && len(idle) > len(worst) {
			worst = idle
		}
	}
	if worst == nil {
		return nil
	}
	return worst[0]
}

// removeLocked forgets c (it is being closed). Callers hold t.mu.
func (t *connTable) removeLocked(c *limitConn) {
	if c.removed {
		return
	}
	c.removed = true
	t.open--
	if !c.tracked {
		return
	}
	t.reg.remove(c)
	conns := t.peers[c.peer]
	delete(conns, c)
	if len(conns) == 0 {
		delete(t.peers, c.peer)
	}
}

// sweep closes, every quarter of crowdedIdle, the idle connections of peers
// over their share that have been idle for crowdedIdle.
func (t *connTable) sweep() {
	defer close(t.done)
	tick := time.NewTicker(max(t.crowdedIdle/4, 10*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			return
		case now := <-tick.C:
			for _, c := range t.crowded(now) {
				_ = c.Conn.Close()
			}
		}
	}
}

// crowded removes and returns the connections to close at now: of each
// peer over its share, the idle connections beyond it, longest idle
// first, that have been idle for crowdedIdle.
func (t *connTable) crowded(now time.Time) []*limitConn {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*limitConn
	for _, conns := range t.peers {
		if len(conns) <= t.share {
			continue
		}
		idle := idleOf(conns)
		for _, c := range idle[:max(len(idle)-t.share, 0)] {
			if now.UnixNano()-c.idleSince.Load() < int64(t.crowdedIdle) {
				break // the rest were idle for less time still
			}
			out = append(out, c)
		}
	}
	for _, c := range out {
		t.removeLocked(c)
	}
	return out
}

// limitConn is a connection its table tracks.
type limitConn struct {
	net.Conn
	t       *connTable
	addrs   connAddrs
	tracked bool // a TCP connection (others are only counted)
	peer    netip.Prefix

	active    atomic.Int32 // calls in progress, not counting keyless streams
	idleSince atomic.Int64 // Unix ns when active last fell to 0 (or the accept)
	removed   bool         // guarded by t.mu
	keyless   int          // streams that need no key (keyless.go); guarded by t.mu
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.t.mu.Lock()
	c.t.removeLocked(c)
	c.t.mu.Unlock()
	return err
}

// began and ended count a call in progress (gRPC: one per call).
func (c *limitConn) began() { c.active.Add(1) }

func (c *limitConn) ended() {
	if c.active.Add(-1) == 0 {
		c.idleSince.Store(time.Now().UnixNano())
	}
}

// httpConnState is the HTTP edge's ConnState hook: a connection is busy
// while net/http reports it active (HTTP/2: while a stream is open).
func (r *connRegistry) httpConnState(nc net.Conn, st http.ConnState) {
	c := r.find(nc.LocalAddr(), nc.RemoteAddr())
	if c == nil {
		return
	}
	switch st {
	case http.StateActive:
		c.active.Store(1)
	case http.StateIdle:
		c.idleSince.Store(time.Now().UnixNano())
		c.active.Store(0)
	}
}

// connOf is the connection a gRPC call came on.
func (r *connRegistry) connOf(ctx context.Context) *limitConn {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	return r.find(p.LocalAddr, p.Addr)
}

// unary and stream are the outermost interceptors: they count a call in
// progress on its connection, so it is not idle while the call runs. A
// stream of a method that needs no key is not counted: it is held to the
// bounds of keyless.go instead.
func (r *connRegistry) unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if c := r.connOf(ctx); c != nil {
		c.began()
		defer c.ended()
	}
	return handler(ctx, req)
}

func (r *connRegistry) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	c := r.connOf(ss.Context())
	if guard.OpenMethod(info.FullMethod) {
		return r.keylessStream(c, srv, ss, handler)
	}
	if c != nil {
		c.began()
		defer c.ended()
	}
	return handler(srv, ss)
}
