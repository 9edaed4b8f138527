package push

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Allow is the operator's list of push destinations (--push-allow): host
// names and CIDR prefixes. A nil or empty Allow allows nothing: push is
// disabled. It is immutable and safe for concurrent use.
//
// What it admits:
//
//   - A URL whose host is an IP address: when the address is in one of the
//     prefixes.
//   - A URL whose host is a name listed ("hooks.example.com"), or under a
//     listed wildcard ("*.example.com" admits a.example.com and
//     b.a.example.com, not example.com): always; its connections go to the
//     addresses it resolves to when they are public (not loopback, private,
//     link-local, unique-local, shared (CGNAT), multicast or unspecified)
//     or in one of the prefixes. So a tenant who controls the DNS of an
//     allowed name cannot point it at an internal address (DNS rebinding)
//     unless the operator allowed that address.
//   - Any other host name: when every address it resolves to is in one of
//     the prefixes (checked when the URL is set, and again at every
//     connection).
//
// And on any host, only the allowed ports (--push-allow-ports): 80 and 443
// unless the operator widens them (WithPorts), so a tenant allowed an
// address cannot reach another service listening on it (a Redis, a
// database, an admin port). A URL without a port names its scheme's: 80
// for http, 443 for https.
//
// Every connection is checked after resolution, on the address and port
// actually dialed (net.Dialer's Control hook), so what was allowed when
// the URL was set is allowed again only if it still resolves to allowed
// addresses.
type Allow struct {
	hosts     []string       // exact names, lower case, no trailing dot
	suffixes  []string       // ".example.com" for "*.example.com"
	prefixes  []netip.Prefix // CIDRs (a bare address is a /32 or /128)
	entries   []string       // as given, for messages
	ports     []portRange
	portsText string // as given (normalized), for messages
	resolver  *net.Resolver
}

// DefaultPorts are the ports push URLs may name unless the operator
// widens them (--push-allow-ports).
const DefaultPorts = "80,443"

// portRange is lo through hi, inclusive.
type portRange struct{ lo, hi uint16 }

// ParseAllow parses a comma- or space-separated list of host names
// ("hooks.example.com", "*.example.com"), CIDR prefixes ("203.0.113.0/24",
// "2001:db8::/32") and addresses ("203.0.113.7"). An empty list returns an
// Allow that allows nothing. The ports allowed are DefaultPorts; WithPorts
// changes them.
func ParseAllow(list string) (*Allow, error) {
	a := &Allow{resolver: net.DefaultResolver}
	for _, e := range splitList(list) {
		if err := a.add(e); err != nil {
			return nil, err
		}
		a.entries = append(a.entries, e)
	}
	return a.WithPorts(DefaultPorts)
}

func splitList(list string) []string {
	return strings.FieldsFunc(list, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\n' })
}

// WithPorts returns a copy of a that allows the ports listed instead:
// comma- or space-separated ports ("443") and ranges ("8000-8999"), 1 to
// 65535. An empty list means DefaultPorts.
func (a *Allow) WithPorts(list string) (*Allow, error) {
	if strings.TrimSpace(list) == "" {
		list = DefaultPorts
	}
	b := *a
	b.ports = nil
	entries := splitList(list)
	for _, e := range entries {
		lo, hi, isRange := strings.Cut(e, "-")
		if !isRange {
			hi = lo
		}
		l, err1 := strconv.ParseUint(lo, 10, 16)
		h, err2 := strconv.ParseUint(hi, 10, 16)
		if err1 != nil || err2 != nil || l == 0 || h < l {
			return nil, fmt.Errorf("push allowed ports: %q is neither a port (1-65535) nor a range of them (8000-8999)", e)
		}
		b.ports = append(b.ports, portRange{uint16(l), uint16(h)})
	}
	b.portsText = strings.Join(entries, ",")
	return &b, nil
}

// Ports is the list of allowed ports, comma-separated ("80,443").
func (a *Allow) Ports() string { return a.portsText }

func (a *Allow) portAllowed(p uint16) bool {
	for _, r := range a.ports {
		if p >= r.lo && p <= r.hi {
			return true
		}
	}
	return false
}

func (a *Allow) add(e string) error {
	if p, err := netip.ParsePrefix(e); err == nil {
		a.prefixes = append(a.prefixes, p.Masked())
		return nil
	}
	if ip, err := netip.ParseAddr(e); err == nil {
		a.prefixes = append(a.prefixes, netip.PrefixFrom(ip.Unmap(), ip.Unmap().BitLen()))
		return nil
	}
	host := strings.TrimSuffix(strings.ToLower(e), ".")
	wild := false
	if rest, ok := strings.CutPrefix(host, "*."); ok {
		host, wild = rest, true
	}
	if !validHostName(host) {
		return fmt.Errorf("push allow list: %q is neither a host name (optionally *.name), an IP address nor a CIDR prefix", e)
	}
	if wild {
		a.suffixes = append(a.suffixes, "."+host)
	} else {
		a.hosts = append(a.hosts, host)
	}
	return nil
}

func validHostName(h string) bool {
	if h == "" || len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return false
			}
		}
	}
	return true
}

// Enabled reports whether anything is allowed (push is on).
func (a *Allow) Enabled() bool {
	return a != nil && len(a.entries) > 0
}

// String is the list as given, comma-separated ("" when empty).
func (a *Allow) String() string {
	if a == nil {
		return ""
	}
	return strings.Join(a.entries, ",")
}

// ErrDisabled is CheckURL's error when the allow list is empty.
var ErrDisabled = errors.New("push is disabled on this server: the operator allows no push destination (--push-allow / DELAYD_PUSH_ALLOW is empty)")

// MaxURLBytes is the longest push URL accepted.
const MaxURLBytes = 2048

// checkResolveTimeout bounds the DNS lookup CheckURL makes for a host name
// that only a prefix can admit.
const checkResolveTimeout = 3 * time.Second

// CheckURL reports whether raw may be a push target: an absolute http or
// https URL, without credentials or fragment, whose host this list admits
// (see Allow). The error is written for the tenant who set the URL: it
// says what is allowed.
func (a *Allow) CheckURL(ctx context.Context, raw string) error {
	if !a.Enabled() {
		return ErrDisabled
	}
	if len(raw) > MaxURLBytes {
		return fmt.Errorf("is %d bytes; allowed: at most %d", len(raw), MaxURLBytes)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("is not a URL: %v", err.(*url.Error).Err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("has scheme %q; allowed: http, https", u.Scheme)
	}
	if u.User != nil {
		return errors.New("carries credentials; allowed: none (requests are authenticated by the Delayd-Signature header)")
	}
	if u.Fragment != "" || strings.Contains(raw, "#") {
		return errors.New("has a fragment; allowed: none")
	}
	host := u.Hostname()
	if host == "" {
		return errors.New("has no host")
	}
	port := uint16(80)
	if u.Scheme == "https" {
		port = 443
	}
	if p := u.Port(); p != "" {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil || n == 0 {
			return fmt.Errorf("has port %q; allowed: 1-65535", p)
		}
		port = uint16(n)
	}
	if !a.portAllowed(port) {
		return fmt.Errorf("has port %d, which the operator does not allow push to; allowed: ports %s (--push-allow-ports)", port, a.portsText)
	}
	if a.nameListed(host) {
		return nil
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if a.inPrefixes(ip) {
			return nil
		}
		return fmt.Errorf("has host %s, which the operator does not allow; allowed: %s", host, a.describe())
	}
	if len(a.prefixes) == 0 {
		return fmt.Errorf("has host %s, which the operator does not allow; allowed: %s", host, a.describe())
	}
	ctx, cancel := context.WithTimeout(ctx, checkResolveTimeout)
	defer cancel()
	addrs, err := a.resolver.LookupNetIP(ctx, "ip", host)
	if err != nil || len(addrs) == 0 {
		return fmt.Errorf("has host %s, which the operator does not allow: it is not listed by name and could not be resolved to check its addresses against the allowed prefixes; allowed: %s", host, a.describe())
	}
	for _, ip := range addrs {
		if !a.inPrefixes(ip) {
			return fmt.Errorf("has host %s, which the operator does not allow: it resolves to %s, outside the allowed prefixes; allowed: %s", host, ip.Unmap(), a.describe())
		}
	}
	return nil
}

// describe says what is allowed, for error messages.
func (a *Allow) describe() string {
	return "hosts and prefixes " + strings.Join(a.entries, ", ") + " (--push-allow)"
}

// nameListed reports whether host (a name, not an address) is listed by
// name or wildcard.
func (a *Allow) nameListed(host string) bool {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if slices.Contains(a.hosts, host) {
		return true
	}
	for _, s := range a.suffixes {
		if strings.HasSuffix(host, s) {
			return true
		}
	}
	return false
}

func (a *Allow) inPrefixes(ip netip.Addr) bool {
	ip = ip.Unmap()
	for _, p := range a.prefixes {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// dialAllowed reports whether a connection to ap may be made for a URL
// whose host was named host: an allowed port, and an address in a prefix,
// or public when host is listed by name.
func (a *Allow) dialAllowed(host string, ap netip.AddrPort) bool {
	if !a.portAllowed(ap.Port()) {
		return false
	}
	ip := ap.Addr()
	if a.inPrefixes(ip) {
		return true
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return false // an address host is admitted by the prefixes only
	}
	return a.nameListed(host) && public(ip)
}

// notPublic are the special-purpose ranges (IANA's IPv4 and IPv6
// Special-Purpose Address Registries) that netip.Addr.IsPrivate and
// IsGlobalUnicast miss: besides addresses that reach no public host, the
// translation and tunnelling prefixes (NAT64, 6to4, Teredo), whose
// addresses stand for an IPv4 address behind them — a private one as well.
var notPublic = func() []netip.Prefix {
	var out []netip.Prefix
	for _, p := range []string{
		"0.0.0.0/8",       // "this network" (RFC 791)
		"100.64.0.0/10",   // shared address space, carrier-grade NAT (RFC 6598)
		"192.0.0.0/24",    // IETF protocol assignments (RFC 6890)
		"192.0.2.0/24",    // documentation, TEST-NET-1 (RFC 5737)
		"192.88.99.0/24",  // 6to4 relay anycast (RFC 7526)
		"198.18.0.0/15",   // benchmarking (RFC 2544)
		"198.51.100.0/24", // documentation, TEST-NET-2 (RFC 5737)
		"203.0.113.0/24",  // documentation, TEST-NET-3 (RFC 5737)
		"240.0.0.0/4",     // reserved (RFC 1112), and broadcast
		"64:ff9b::/96",    // NAT64 well-known prefix (RFC 6052)
		"64:ff9b:1::/48",  // local-use NAT64 (RFC 8215)
		"100::/64",        // discard-only (RFC 6666)
		"2001::/23",       // IETF protocol assignments, Teredo included (RFC 2928, 4380)
		"2001:db8::/32",   // documentation (RFC 3849)
		"2002::/16",       // 6to4 (RFC 3056)
		"3fff::/20",       // documentation (RFC 9637)
		"5f00::/16",       // segment routing SIDs (RFC 9602)
	} {
		out = append(out, netip.MustParsePrefix(p))
	}
	return out
}()

// public reports whether ip is a global unicast address outside the
// private, shared and unique-local ranges.
func public(ip netip.Addr) bool {
	ip = ip.Unmap()
	if !ip.IsGlobalUnicast() || ip.IsPrivate() {
		return false
	}
	for _, p := range notPublic {
		if p.Contains(ip) {
			return false
		}
	}
	return true
}
