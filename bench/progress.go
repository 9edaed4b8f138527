package bench

import (
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Progress prints a live status line of the running benchmark to a
// terminal (rewritten in place every 500 ms) or, when the output is not a
// terminal, a plain line every 5 s. A nil *Progress prints nothing. Its
// methods are safe for concurrent use.
type Progress struct {
	w        io.Writer
	tty      bool
	mu       sync.Mutex
	label    string
	name     string
	total    int64
	done     atomic.Int64
	sk       atomic.Pointer[runSink]
	started  time.Time
	stop     chan struct{}
	stopped  chan struct{}
	lastLine int
}

// NewProgress returns a Progress writing to w (os.Stderr when nil).
func NewProgress(w io.Writer) *Progress {
	if w == nil {
		w = os.Stderr
	}
	p := &Progress{w: w}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

// begin starts reporting on one run.
func (p *Progress) begin(label string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.label = label
	p.stop, p.stopped = make(chan struct{}), make(chan struct{})
	p.mu.Unlock()
	every := 5 * time.Second
	if p.tty {
		every = 500 * time.Millisecond
	}
	go func() {
		defer close(p.stopped)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
				p.print()
			}
		}
	}()
}

// end stops reporting on the run and clears the line.
func (p *Progress) end() {
	if p == nil || p.stop == nil {
		return
	}
	close(p.stop)
	<-p.stopped
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty && p.lastLine > 0 {
		fmt.Fprintf(p.w, "\r%*s\r", p.lastLine, "")
	}
	p.lastLine = 0
	p.sk.Store(nil)
}

// phase starts a phase of total units.
func (p *Progress) phase(name string, total int64) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.name, p.total, p.started = name, total, time.Now()
	p.mu.Unlock()
	p.done.Store(0)
}

// add counts n units of the phase done.
func (p *Progress) add(n int64) {
	if p != nil {
		p.done.Add(n)
	}
}

// track makes the line show the deliveries of sk.
func (p *Progress) track(sk *runSink) {
	if p != nil {
		p.sk.Store(sk)
	}
}

func (p *Progress) print() {
	p.mu.Lock()
	defer p.mu.Unlock()
	el := time.Since(p.started).Seconds()
	var line string
	if sk := p.sk.Load(); sk != nil {
		d := sk.tracker.Delivered()
		line = fmt.Sprintf("%s: deliver %d/%d delivered, %d acked (%.0f/s), %d early", p.label, d, p.total, sk.ackedOK.Load(), float64(d)/el, sk.early.Load())
	} else {
		d := p.done.Load()
		line = fmt.Sprintf("%s: %s %d/%d (%.0f/s)", p.label, p.name, d, p.total, float64(d)/el)
	}
	if p.tty {
		pad := max(p.lastLine-len(line), 0)
		fmt.Fprintf(p.w, "\r%s%*s", line, pad, "")
		p.lastLine = len(line)
	} else {
		fmt.Fprintln(p.w, line)
	}
}
