package client

import (
	"testing"
	"time"
)

func TestReconnectBackoffGrowsWithinBounds(t *testing.T) {
	b := reconnectBackoff{min: 100 * time.Millisecond, max: 2 * time.Second}
	var ceilings []time.Duration
	for n := range 12 {
		ceil := min(b.min<<n, b.max)
		ceilings = append(ceilings, ceil)
		for range 50 {
			bb := reconnectBackoff{min: b.min, max: b.max, n: n}
			d := bb.next()
			if d < b.min || d > ceil {
				t.Fatalf("attempt %d waited %v, want within [%v, %v]", n, d, b.min, ceil)
			}
		}
	}
	if ceilings[len(ceilings)-1] != b.max {
		t.Errorf("ceiling never reached max: %v", ceilings)
	}
	b.n = 9
	b.reset()
	if d := b.next(); d > 2*b.min {
		t.Errorf("after reset the first wait is %v, want at most %v", d, 2*b.min)
	}
}

func TestReasonIsCutOnARuneBoundary(t *testing.T) {
	long := string(make([]byte, 1023)) + "é" // 1,025 bytes, é straddles the limit
	got := reason(errString(long))
	if len(got) != 1023 {
		t.Errorf("cut to %d bytes, want 1023 (before the 2-byte rune)", len(got))
	}
}

type errString string

func (e errString) Error() string { return string(e) }
