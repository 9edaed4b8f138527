package push

import (
	"net/netip"
	"testing"
)

// TestSpecialRangesAreNotPublic (issue 32 item 5): the special-purpose
// ranges the security re-test found counted as public — NAT64 (an address
// standing for any IPv4 one, private included), 6to4, benchmarking and
// reserved — and the others of IANA's registries are refused; ordinary
// public addresses are not.
func TestSpecialRangesAreNotPublic(t *testing.T) {
	for _, c := range []struct {
		ip     string
		public bool
	}{
		{"64:ff9b::7f00:1", false},     // NAT64 of 127.0.0.1
		{"64:ff9b::a00:1", false},      // NAT64 of 10.0.0.1
		{"64:ff9b:1::a00:1", false},    // local-use NAT64
		{"2002:7f00:1::1", false},      // 6to4 of 127.0.0.1
		{"2001:0:4136:e378::1", false}, // Teredo
		{"2001:db8::1", false},
		{"198.18.0.1", false},
		{"198.19.255.254", false},
		{"240.0.0.1", false},
		{"255.255.255.255", false},
		{"192.0.0.8", false},
		{"192.0.2.1", false},
		{"203.0.113.9", false},
		{"100.64.0.1", false},
		{"127.0.0.1", false},
		{"::ffff:10.0.0.1", false},
		{"fd00::1", false},
		{"8.8.8.8", true},
		{"198.20.0.1", true},
		{"2606:4700::1111", true},
	} {
		if got := public(netip.MustParseAddr(c.ip)); got != c.public {
			t.Errorf("public(%s) = %v, want %v", c.ip, got, c.public)
		}
	}
}
