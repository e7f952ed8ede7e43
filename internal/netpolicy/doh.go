package netpolicy

import (
	"net/netip"
	"strings"
)

// DoHNames are well-known DNS-over-HTTPS and DNS-over-TLS endpoints. A
// sandbox that reached one could resolve any name past the node's DNS
// proxy (and exfiltrate data through the queries), so no policy resolves
// or connects to these names, or to names under them, unless its
// allowlist names that exact host: not open, not a wildcard.
var DoHNames = []string{
	// Google
	"dns.google", "dns.google.com", "8888.google", "dns64.dns.google",
	// Cloudflare: every name under cloudflare-dns.com (mozilla., chrome.,
	// security., family., 1dot1dot1dot1.) and the gateway's team names
	"cloudflare-dns.com", "one.one.one.one", "cloudflare-gateway.com",
	// Quad9
	"dns.quad9.net", "dns9.quad9.net", "dns10.quad9.net", "dns11.quad9.net", "dns12.quad9.net",
	// Cisco OpenDNS
	"doh.opendns.com", "doh.familyshield.opendns.com", "doh.sandbox.opendns.com", "dns.opendns.com",
	// AdGuard
	"dns.adguard.com", "dns-family.adguard.com", "dns-unfiltered.adguard.com",
	"dns.adguard-dns.com", "unfiltered.adguard-dns.com", "family.adguard-dns.com",
	// NextDNS: configurations are names under dns.nextdns.io
	"dns.nextdns.io", "dns1.nextdns.io", "dns2.nextdns.io",
	// CleanBrowsing
	"doh.cleanbrowsing.org",
	// Control D
	"dns.controld.com", "freedns.controld.com",
	// Mullvad
	"dns.mullvad.net", "doh.mullvad.net", "adblock.dns.mullvad.net", "base.dns.mullvad.net",
	// DNS.SB, dns0.eu, LibreDNS, Digitale Gesellschaft, SWITCH, CZ.NIC
	"doh.dns.sb", "dns.sb", "dns0.eu", "doh.libredns.gr",
	"dns.digitale-gesellschaft.ch", "dns.switch.ch", "odvr.nic.cz",
	// Alibaba, DNSPod, 360, TWNIC
	"dns.alidns.com", "doh.pub", "dot.pub", "doh.360.cn", "dns.twnic.tw",
	// Hurricane Electric, Comcast, Applied Privacy
	"ordns.he.net", "doh.xfinity.com", "doh.applied-privacy.net",
}

// DoHAddrs are the anycast IPv4 addresses of the public resolvers behind
// DoHNames (and their DNS-over-TLS service). The node's firewall refuses
// TCP and UDP 443 and 853 to them, whatever the policy.
var DoHAddrs = []netip.Addr{
	// Cloudflare (1.1.1.1, malware- and family-filtering variants)
	addr("1.1.1.1"), addr("1.0.0.1"), addr("1.1.1.2"), addr("1.0.0.2"), addr("1.1.1.3"), addr("1.0.0.3"),
	// Google
	addr("8.8.8.8"), addr("8.8.4.4"),
	// Quad9
	addr("9.9.9.9"), addr("149.112.112.112"), addr("9.9.9.10"), addr("149.112.112.10"),
	addr("9.9.9.11"), addr("149.112.112.11"),
	// Cisco OpenDNS
	addr("208.67.222.222"), addr("208.67.220.220"), addr("208.67.222.123"), addr("208.67.220.123"),
	// AdGuard
	addr("94.140.14.14"), addr("94.140.15.15"), addr("94.140.14.15"), addr("94.140.15.16"),
	addr("94.140.14.140"), addr("94.140.14.141"),
	// NextDNS
	addr("45.90.28.0"), addr("45.90.30.0"),
	// CleanBrowsing
	addr("185.228.168.9"), addr("185.228.169.9"), addr("185.228.168.168"), addr("185.228.169.168"),
	addr("185.228.168.10"), addr("185.228.169.11"),
	// Control D
	addr("76.76.2.0"), addr("76.76.10.0"), addr("76.76.2.11"),
	// Mullvad, DNS.SB, dns0.eu
	addr("194.242.2.2"), addr("185.222.222.222"), addr("45.11.45.11"), addr("193.110.81.0"), addr("185.253.5.0"),
	// Alibaba, DNSPod, TWNIC
	addr("223.5.5.5"), addr("223.6.6.6"), addr("1.12.12.12"), addr("120.53.53.53"), addr("101.101.101.101"),
}

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

var dohNames = func() map[string]bool {
	m := make(map[string]bool, len(DoHNames))
	for _, n := range DoHNames {
		m[n] = true
	}
	return m
}()

// IsDoHName reports whether name (case-insensitive, trailing dot allowed)
// is one of DoHNames or a name under one.
func IsDoHName(name string) bool {
	name = canonName(name)
	for {
		if dohNames[name] {
			return true
		}
		i := strings.IndexByte(name, '.')
		if i < 0 {
			return false
		}
		name = name[i+1:]
	}
}

// IsDoHAddr reports whether addr is one of DoHAddrs.
func IsDoHAddr(a netip.Addr) bool {
	a = a.Unmap()
	for _, d := range DoHAddrs {
		if d == a {
			return true
		}
	}
	return false
}
