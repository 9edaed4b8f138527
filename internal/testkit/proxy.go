package testkit

import (
	"net"
	"sync"
	"testing"
)

// Proxy is a loopback TCP proxy in front of a server (MySQL, Redis, a
// delayd), so a test can take "the server" away from one client without
// touching the server: Cut closes every connection and refuses new ones;
// Hold keeps connections open but passes no byte (a hung server or a
// partition); Restore lets traffic through again; Retarget moves it to
// another server (a failover behind a virtual IP).
type Proxy struct {
	t      testing.TB
	target string
	lis    net.Listener

	mu    sync.Mutex
	cond  *sync.Cond
	down  bool // Cut
	held  bool // Hold
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// NewProxy listens on a free loopback port and forwards to target
// (host:port) until t ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{t: t, target: target, lis: lis, conns: map[net.Conn]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		lis.Close()
		p.Cut()
		p.wg.Wait()
	})
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.lis.Addr().String() }

// Cut closes every connection and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down, p.held = true, false
	for c := range p.conns {
		c.Close()
	}
	p.cond.Broadcast()
}

// Hold stops passing bytes either way, keeping every connection open,
// until Restore or Cut.
func (p *Proxy) Hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.held = true
}

// Restore lets connections and bytes through again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down, p.held = false, false
	p.cond.Broadcast()
}

// Retarget closes every connection and forwards new ones to target
// (host:port), as a virtual IP that moves to a promoted replica does.
func (p *Proxy) Retarget(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
	p.held = false
	for c := range p.conns {
		c.Close()
	}
	p.cond.Broadcast()
}

// SetDown is Cut (true) or Restore (false).
func (p *Proxy) SetDown(down bool) {
	if down {
		p.Cut()
	} else {
		p.Restore()
	}
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.down {
			p.mu.Unlock()
			c.Close()
			continue
		}
		target := p.target
		p.mu.Unlock()
		up, err := net.Dial("tcp", target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.down {
			p.mu.Unlock()
			c.Close()
			up.Close()
			continue
		}
		p.conns[c] = struct{}{}
		p.conns[up] = struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(c, up)
		go p.pipe(up, c)
	}
}

// pipe copies src to dst, waiting while the proxy holds, until either
// side closes.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.held && !p.down {
				p.cond.Wait()
			}
			down := p.down
			p.mu.Unlock()
			if down {
				break
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}
