package netpolicy

import "net/netip"

// Denied are the IPv4 ranges no policy lets a sandbox reach, not even
// open: the node's operator may allow some of them explicitly (egress
// Config.AllowPrivate). They cover this host and its LAN, the platform's
// own addresses, other sandboxes (the node's pool is private), cloud
// metadata (169.254.169.254 and friends are link-local) and addresses
// that are not unicast on the internet. The documentation ranges
// (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24) are not denied: they are
// never routed on the internet, and tests build fake internets on them.
var Denied = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),      // "this network"
	netip.MustParsePrefix("10.0.0.0/8"),     // private
	netip.MustParsePrefix("100.64.0.0/10"),  // carrier-grade NAT, also Alibaba's metadata 100.100.100.200
	netip.MustParsePrefix("127.0.0.0/8"),    // loopback
	netip.MustParsePrefix("169.254.0.0/16"), // link-local: cloud metadata, the sandbox gateway
	netip.MustParsePrefix("172.16.0.0/12"),  // private
	netip.MustParsePrefix("192.0.0.0/24"),   // IETF protocol assignments
	netip.MustParsePrefix("192.168.0.0/16"), // private
	netip.MustParsePrefix("198.18.0.0/15"),  // benchmarking
	netip.MustParsePrefix("224.0.0.0/4"),    // multicast
	netip.MustParsePrefix("240.0.0.0/4"),    // reserved, and broadcast
}

// Fence is a node's always-denied set: Denied plus the platform's own
// public addresses (Extra: apiservers, blob store), minus what the
// operator allows explicitly (Exempt, e.g. a package mirror on the LAN).
// The zero Fence is Denied.
type Fence struct {
	Extra  []netip.Prefix
	Exempt []netip.Prefix
}

// Denies reports whether no policy may reach addr: not IPv4, or in Denied
// or Extra and not Exempt.
func (f *Fence) Denies(addr netip.Addr) bool {
	addr = addr.Unmap()
	if !addr.Is4() {
		return true
	}
	var exempt []netip.Prefix
	if f != nil {
		exempt = f.Exempt
		if containsAddr(f.Extra, addr) {
			return true
		}
	}
	return containsAddr(Denied, addr) && !containsAddr(exempt, addr)
}

func containsAddr(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
