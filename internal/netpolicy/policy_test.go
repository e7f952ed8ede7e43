package netpolicy

import (
	"errors"
	"net/netip"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in      api.NetworkPolicy
		want    api.NetworkPolicy
		wantErr string
	}{
		{in: api.NetworkPolicy{}, want: api.NetworkPolicy{Mode: "none"}},
		{in: api.NetworkPolicy{Mode: "open"}, want: api.NetworkPolicy{Mode: "open"}},
		{in: api.NetworkPolicy{Allow: []string{"PyPI.org.", "*.pythonhosted.org", "198.51.100.9/24:443", "203.0.113.5", "github.com:22", "pypi.org"}},
			want: api.NetworkPolicy{Mode: "allowlist", Allow: []string{"pypi.org", "*.pythonhosted.org", "github.com:22", "198.51.100.0/24:443", "203.0.113.5"}}},
		{in: api.NetworkPolicy{Mode: "allowlist"}, want: api.NetworkPolicy{Mode: "allowlist"}},
		{in: api.NetworkPolicy{Mode: "open", Allow: []string{"a.com"}}, wantErr: "takes no allow entries"},
		{in: api.NetworkPolicy{Mode: "closed"}, wantErr: "unknown mode"},
		{in: api.NetworkPolicy{Allow: []string{"2001:db8::/32"}}, wantErr: "IPv6"},
		{in: api.NetworkPolicy{Allow: []string{"[2001:db8::1]:443"}}, wantErr: "IPv6"},
		{in: api.NetworkPolicy{Allow: []string{"a.com:0"}}, wantErr: "port must be"},
		{in: api.NetworkPolicy{Allow: []string{"a.com:70000"}}, wantErr: "port must be"},
		{in: api.NetworkPolicy{Allow: []string{"*.com"}}, wantErr: "at least two labels"},
		{in: api.NetworkPolicy{Allow: []string{"localhost"}}, wantErr: "at least two labels"},
		{in: api.NetworkPolicy{Allow: []string{"a..com"}}, wantErr: "1-63 bytes"},
		{in: api.NetworkPolicy{Allow: []string{"-a.com"}}, wantErr: "only letters"},
		{in: api.NetworkPolicy{Allow: []string{"a b.com"}}, wantErr: "only letters"},
		{in: api.NetworkPolicy{Allow: []string{"1.2.3"}}, wantErr: "not a domain"},
		{in: api.NetworkPolicy{Allow: []string{"10.0.0.0/33"}}, wantErr: "bad CIDR"},
		{in: api.NetworkPolicy{Allow: []string{strings.Repeat("a", 300) + ".com"}}, wantErr: "too long"},
	} {
		p, err := Parse(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("Parse(%v): err %v, want ErrInvalid with %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("Parse(%v): %v", tc.in, err)
			continue
		}
		if got := p.API(); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Parse(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestParseLimits(t *testing.T) {
	var names, nets []string
	for i := 0; i <= api.MaxAllowDomains; i++ {
		names = append(names, "h"+strings.Repeat("x", i%5)+string(rune('a'+i%26))+".n"+itoa(i)+".org")
	}
	for i := 0; i <= api.MaxAllowCIDRs; i++ {
		nets = append(nets, "203.0.113."+itoa(i))
	}
	if _, err := Parse(api.NetworkPolicy{Allow: names}); err == nil || !strings.Contains(err.Error(), "at most") {
		t.Errorf("%d domains: err %v", len(names), err)
	}
	if _, err := Parse(api.NetworkPolicy{Allow: nets}); err == nil || !strings.Contains(err.Error(), "at most") {
		t.Errorf("%d CIDRs: err %v", len(nets), err)
	}
	if _, err := Parse(api.NetworkPolicy{Allow: names[:api.MaxAllowDomains]}); err != nil {
		t.Errorf("%d domains: %v", api.MaxAllowDomains, err)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

func TestMatch(t *testing.T) {
	p, err := Parse(api.NetworkPolicy{Allow: []string{"pypi.org", "*.pythonhosted.org", "github.com:22", "github.com:443", "198.51.100.0/24:443"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		port uint16
		want bool
	}{
		{"pypi.org", 1234, true},
		{"PYPI.ORG.", 443, true},
		{"www.pypi.org", 443, false},
		{"evilpypi.org", 443, false},
		{"files.pythonhosted.org", 443, true},
		{"a.b.pythonhosted.org", 80, true},
		{"pythonhosted.org", 443, false},
		{"xpythonhosted.org", 443, false},
		{"github.com", 22, true},
		{"github.com", 443, true},
		{"github.com", 80, false},
		{"example.com", 443, false},
	} {
		if got := p.AllowsName(tc.name, tc.port); got != tc.want {
			t.Errorf("AllowsName(%s, %d) = %v, want %v", tc.name, tc.port, got, tc.want)
		}
	}
	for _, tc := range []struct {
		addr string
		port uint16
		want bool
	}{
		{"198.51.100.7", 443, true},
		{"198.51.100.7", 80, false},
		{"198.51.101.7", 443, false},
	} {
		if got := p.AllowsAddr(nil, netip.MustParseAddr(tc.addr), tc.port); got != tc.want {
			t.Errorf("AllowsAddr(%s, %d) = %v, want %v", tc.addr, tc.port, got, tc.want)
		}
	}
	open, _ := Parse(api.NetworkPolicy{Mode: "open"})
	for addr, want := range map[string]bool{
		"203.0.113.1": true, "8.8.8.8": true, "10.1.2.3": false, "169.254.169.254": false,
		"127.0.0.1": false, "192.168.1.1": false, "172.20.0.1": false, "100.100.100.200": false, "224.0.0.1": false,
	} {
		if got := open.AllowsAddr(nil, netip.MustParseAddr(addr), 80); got != want {
			t.Errorf("open.AllowsAddr(%s) = %v, want %v", addr, got, want)
		}
	}
	fence := &Fence{Exempt: []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")}, Extra: []netip.Prefix{netip.MustParsePrefix("203.0.113.200/32")}}
	if !open.AllowsAddr(fence, netip.MustParseAddr("10.9.1.1"), 80) || open.AllowsAddr(fence, netip.MustParseAddr("203.0.113.200"), 80) {
		t.Error("fence Exempt/Extra not applied")
	}
}

func TestUpdate(t *testing.T) {
	cur, _ := Parse(api.NetworkPolicy{Allow: []string{"pypi.org", "*.pythonhosted.org"}})
	none, open, allow := api.NetworkNone, api.NetworkOpen, api.NetworkAllowlist
	gh := []string{"github.com"}
	var empty []string
	for _, tc := range []struct {
		u    api.NetworkUpdate
		want api.NetworkPolicy
	}{
		{api.NetworkUpdate{Mode: &none}, api.NetworkPolicy{Mode: none}},
		{api.NetworkUpdate{Mode: &open}, api.NetworkPolicy{Mode: open}},
		{api.NetworkUpdate{Allow: &gh}, api.NetworkPolicy{Mode: allow, Allow: gh}},
		{api.NetworkUpdate{Mode: &allow, Allow: &empty}, api.NetworkPolicy{Mode: allow}},
		{api.NetworkUpdate{Add: gh}, api.NetworkPolicy{Mode: allow, Allow: []string{"pypi.org", "*.pythonhosted.org", "github.com"}}},
		{api.NetworkUpdate{Remove: []string{"PyPI.org."}}, api.NetworkPolicy{Mode: allow, Allow: []string{"*.pythonhosted.org"}}},
		{api.NetworkUpdate{Mode: &none, Add: gh}, api.NetworkPolicy{Mode: allow, Allow: gh}},
	} {
		p, err := Update(cur, tc.u)
		if err != nil {
			t.Errorf("Update(%+v): %v", tc.u, err)
			continue
		}
		if got := p.API(); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Update(%+v) = %v, want %v", tc.u, got, tc.want)
		}
	}
	if _, err := Update(cur, api.NetworkUpdate{Mode: &open, Add: gh}); err == nil {
		t.Error("open with additions: no error")
	}
}

type fwRecorder struct{ addrs []netip.Addr }

func (f *fwRecorder) Learn(_ *Sandbox, a netip.Addr, _ bool, _ []uint16, _ time.Duration) {
	f.addrs = append(f.addrs, a)
}

type closer struct{ closed bool }

func (c *closer) Close() error { c.closed = true; return nil }

func TestSandboxLearnAndFronting(t *testing.T) {
	p, _ := Parse(api.NetworkPolicy{Allow: []string{"pypi.org", "*.pythonhosted.org", "198.51.100.0/24:443"}})
	fw := &fwRecorder{}
	sb := NewSandbox("s1", netip.MustParseAddr("10.213.0.2"), p, nil, fw)
	cdn := netip.MustParseAddr("203.0.113.10")
	if !sb.Learn("PyPI.org.", cdn, time.Second) {
		t.Fatal("allowed name not learned")
	}
	if sb.Learn("evil.com", netip.MustParseAddr("203.0.113.11"), time.Minute) {
		t.Error("a name outside the policy was learned")
	}
	if sb.Learn("files.pythonhosted.org", netip.MustParseAddr("10.0.0.5"), time.Minute) {
		t.Error("a private answer (DNS rebinding) was learned")
	}
	if len(fw.addrs) != 1 || fw.addrs[0] != cdn {
		t.Errorf("firewall told %v, want [%v]", fw.addrs, cdn)
	}
	at := netip.AddrPortFrom(cdn, 443)
	if !sb.AllowsConn("pypi.org", at) {
		t.Error("pypi.org at its own address refused")
	}
	if sb.AllowsConn("evil.com", at) || sb.AllowsConn("", at) {
		t.Error("a fronted request (another name at pypi.org's address) allowed")
	}
	if sb.AllowsConn("files.pythonhosted.org", at) {
		t.Error("an allowed name at an address it never resolved to allowed")
	}
	if !sb.AllowsConn("anything.example", netip.MustParseAddrPort("198.51.100.3:443")) {
		t.Error("a CIDR-allowed address refused")
	}
	if l := sb.Learned(); len(l) != 1 || !l[0].AnyPort || time.Until(l[0].Expires) < MinLearnTTL-time.Second {
		t.Errorf("Learned = %+v, want one any-port address for at least MinLearnTTL", l)
	}

	c := &closer{}
	untrack := sb.Track(c, "pypi.org", at)
	defer untrack()
	keep := &closer{}
	defer sb.Track(keep, "x.example", netip.MustParseAddrPort("198.51.100.3:443"))()
	p2, _ := Parse(api.NetworkPolicy{Allow: []string{"*.pythonhosted.org", "198.51.100.0/24:443"}})
	sb.SetPolicy(p2)
	if !c.closed {
		t.Error("a connection the new policy refuses was left open")
	}
	if keep.closed {
		t.Error("a connection the new policy allows was closed")
	}
	if sb.Resolved("pypi.org", cdn) || len(sb.Learned()) != 0 {
		t.Error("a name the new policy refuses is still learned")
	}
}

func TestTable(t *testing.T) {
	var tb Table
	a := netip.MustParseAddr("10.213.0.2")
	s1 := NewSandbox("s1", a, nil, nil, nil)
	s2 := NewSandbox("s2", a, nil, nil, nil)
	tb.Add(s1)
	tb.Add(s2)
	tb.Remove(s1)
	if tb.Lookup(netip.MustParseAddr("::ffff:10.213.0.2")) != s2 {
		t.Error("removing an earlier holder removed the later one")
	}
	tb.Remove(s2)
	if tb.Lookup(a) != nil {
		t.Error("still there after Remove")
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"pypi.org", "*.pythonhosted.org", "198.51.100.0/24:443", "203.0.113.5", "a.com:22", "[::1]:1", "*.", ":", "1.2.3.4/0"} {
		f.Add("allowlist", s)
	}
	f.Add("open", "")
	f.Fuzz(func(t *testing.T, mode, entry string) {
		in := api.NetworkPolicy{Mode: mode}
		if entry != "" {
			in.Allow = strings.Split(entry, ",")
		}
		p, err := Parse(in)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("Parse(%v): error not ErrInvalid: %v", in, err)
			}
			return
		}
		// The canonical form parses to itself.
		again, err := Parse(p.API())
		if err != nil {
			t.Fatalf("canonical form %v of %v does not parse: %v", p.API(), in, err)
		}
		if !reflect.DeepEqual(again.API(), p.API()) {
			t.Fatalf("canonical form not stable: %v -> %v", p.API(), again.API())
		}
		for _, r := range p.Nets() {
			if !r.Prefix.Addr().Is4() {
				t.Fatalf("IPv6 rule %v accepted", r)
			}
		}
	})
}
