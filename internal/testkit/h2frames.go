package testkit

import (
	"context"
	"net"
	"sync"
)

// HTTP/2 frame types H2Frames counts by (RFC 9113, section 6).
const (
	H2Data         byte = 0x0
	H2Settings     byte = 0x4
	H2Ping         byte = 0x6
	H2WindowUpdate byte = 0x8
)

// h2Preface is what an HTTP/2 client writes before its first frame.
const h2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// H2Frames counts the HTTP/2 frames on the connections a gRPC client dials
// through Dial (grpc.WithContextDialer), each way, by type and, for PING
// and SETTINGS, whether the frame is an acknowledgement: what a test needs
// to show which frames a gRPC peer sends beside the messages (BDP pings,
// window updates). Plain TCP only (no TLS). Safe for concurrent use.
type H2Frames struct {
	mu       sync.Mutex
	sent     map[h2Key]int // client to server
	received map[h2Key]int // server to client
}

type h2Key struct {
	typ byte
	ack bool
}

// NewH2Frames returns a counter with nothing counted.
func NewH2Frames() *H2Frames {
	return &H2Frames{sent: map[h2Key]int{}, received: map[h2Key]int{}}
}

// Dial dials addr over TCP and counts the frames of the connection.
func (f *H2Frames) Dial(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &h2Conn{Conn: c, f: f, out: h2Parser{skip: len(h2Preface)}}, nil
}

// Sent is how many frames of type typ the client sent; ack selects PING
// or SETTINGS acknowledgements (false for other types).
func (f *H2Frames) Sent(typ byte, ack bool) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sent[h2Key{typ, ack}]
}

// Received is how many frames of type typ the server sent; ack as for Sent.
func (f *H2Frames) Received(typ byte, ack bool) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.received[h2Key{typ, ack}]
}

// h2Conn parses the bytes each way as they pass.
type h2Conn struct {
	net.Conn
	f       *H2Frames
	in, out h2Parser // each used by one goroutine at a time, as Read and Write are
}

func (c *h2Conn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.in.feed(p[:n], c.f, c.f.received)
	return n, err
}

func (c *h2Conn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.out.feed(p[:n], c.f, c.f.sent)
	return n, err
}

// h2Parser walks one direction's byte stream frame by frame.
type h2Parser struct {
	skip int    // bytes to pass over (the preface, a frame's payload)
	head []byte // a frame header read in part
}

func (p *h2Parser) feed(b []byte, f *H2Frames, into map[h2Key]int) {
	for len(b) > 0 {
		if p.skip > 0 {
			n := min(p.skip, len(b))
			p.skip -= n
			b = b[n:]
			continue
		}
		n := min(9-len(p.head), len(b))
		p.head = append(p.head, b[:n]...)
		b = b[n:]
		if len(p.head) < 9 {
			return
		}
		h := p.head
		p.head = p.head[:0]
		p.skip = int(h[0])<<16 | int(h[1])<<8 | int(h[2])
		k := h2Key{typ: h[3]}
		if k.typ == H2Ping || k.typ == H2Settings {
			k.ack = h[4]&0x1 != 0
		}
		f.mu.Lock()
		into[k]++
		f.mu.Unlock()
	}
}
