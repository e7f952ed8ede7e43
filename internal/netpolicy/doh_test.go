package netpolicy

import (
	"net/netip"
	"testing"

	"github.com/warrenhq/warren/api"
)

func TestDoH(t *testing.T) {
	for name, want := range map[string]bool{
		"dns.google": true, "DNS.Google.": true, "mozilla.cloudflare-dns.com": true,
		"abc123.dns.nextdns.io": true, "google": false, "notdns.google.com.evil": false,
		"example.com": false, "cloudflare.com": false,
	} {
		if got := IsDoHName(name); got != want {
			t.Errorf("IsDoHName(%q) = %v, want %v", name, got, want)
		}
	}
	if !IsDoHAddr(netip.MustParseAddr("::ffff:1.1.1.1")) || IsDoHAddr(netip.MustParseAddr("1.2.3.4")) {
		t.Error("IsDoHAddr")
	}
	for _, a := range DoHAddrs {
		if !a.Is4() || (&Fence{}).Denies(a) {
			t.Errorf("DoHAddrs holds %s: not a public IPv4 address", a)
		}
	}

	open, _ := Parse(api.NetworkPolicy{Mode: api.NetworkOpen})
	wild, err := Parse(api.NetworkPolicy{Allow: []string{"*.cloudflare-dns.com", "*.dns.google", "*.example.com"}})
	if err != nil {
		t.Fatal(err)
	}
	exact, _ := Parse(api.NetworkPolicy{Allow: []string{"mozilla.cloudflare-dns.com:443", "*.cloudflare-dns.com"}})
	cases := []struct {
		p    *Policy
		name string
		want bool
	}{
		{open, "dns.google", false},
		{open, "example.com", true},
		{wild, "mozilla.cloudflare-dns.com", false},
		{wild, "x.dns.google", false},
		{wild, "www.example.com", true},
		{exact, "mozilla.cloudflare-dns.com", true},
		{exact, "chrome.cloudflare-dns.com", false},
	}
	for _, c := range cases {
		if ok, _, _ := c.p.NamePorts(c.name); ok != c.want {
			t.Errorf("%v.NamePorts(%q) = %v, want %v", c.p.API(), c.name, ok, c.want)
		}
	}
	if ok, any, ports := exact.NamePorts("mozilla.cloudflare-dns.com"); !ok || any || len(ports) != 1 || ports[0] != 443 {
		t.Errorf("an exactly named DoH host takes its wildcard's ports too: %v %v %v", ok, any, ports)
	}

	// Open allows every public address by itself, but not a DoH name at it.
	sb := NewSandbox("s", netip.MustParseAddr("10.213.0.2"), open, nil, nil)
	at := netip.MustParseAddrPort("203.0.113.9:443")
	if !sb.AllowsConn("example.com", at) || sb.AllowsConn("dns.google", at) || sb.AllowsConn("x.dns.nextdns.io.", at) {
		t.Error("open: a DoH name at a public address allowed, or another name refused")
	}
	sb = NewSandbox("s", netip.MustParseAddr("10.213.0.2"), exact, nil, nil)
	if !sb.Learn("mozilla.cloudflare-dns.com", netip.MustParseAddr("203.0.113.9"), 0) || !sb.AllowsConn("mozilla.cloudflare-dns.com", at) {
		t.Error("an exactly named DoH host was not learned or allowed")
	}
	if sb.Learn("chrome.cloudflare-dns.com", netip.MustParseAddr("203.0.113.9"), 0) {
		t.Error("a DoH host under a wildcard was learned")
	}
}

func TestNilPolicy(t *testing.T) {
	var p *Policy // a nil policy is none
	if got := p.API(); got.Mode != api.NetworkNone || got.Allow != nil || p.Names() != nil || p.Nets() != nil {
		t.Errorf("nil policy: API %+v, Names %v, Nets %v", got, p.Names(), p.Nets())
	}
}
