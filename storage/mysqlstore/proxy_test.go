package mysqlstore_test

import (
	"io"
	"net"
	"sync"
	"testing"
)

// proxy is a loopback TCP proxy in front of MySQL or Redis, so a test can
// take "the server" down for one store without touching the shared one.
type proxy struct {
	t      testing.TB
	target string
	lis    net.Listener

	mu    sync.Mutex
	down  bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// newProxy listens on a free loopback port and forwards to target
// (host:port) until the test ends.
func newProxy(t testing.TB, target string) *proxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{t: t, target: target, lis: lis, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		lis.Close()
		p.setDown(true)
		p.wg.Wait()
	})
	return p
}

// Addr is the proxy's host:port.
func (p *proxy) Addr() string { return p.lis.Addr().String() }

// setDown cuts every connection and refuses new ones (down), or lets them
// through again.
func (p *proxy) setDown(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = down
	if down {
		for c := range p.conns {
			c.Close()
		}
	}
}

func (p *proxy) accept() {
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
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns[c] = struct{}{}
		p.conns[up] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		pipe := func(dst, src net.Conn) {
			defer p.wg.Done()
			_, _ = io.Copy(dst, src)
			dst.Close()
			src.Close()
			p.mu.Lock()
			delete(p.conns, dst)
			delete(p.conns, src)
			p.mu.Unlock()
		}
		go pipe(c, up)
		go pipe(up, c)
	}
}
