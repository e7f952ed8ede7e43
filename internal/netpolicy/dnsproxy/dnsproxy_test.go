package dnsproxy

import (
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/netpolicy"
)

// fakeUpstream is a resolver on 127.0.0.1 (UDP and TCP on one port) with
// a few fixed names; it records what it was asked.
type fakeUpstream struct {
	addr  string
	mu    sync.Mutex
	asked []string // "name type net"
	drops atomic.Int32
}

func rr(t testing.TB, s string) dns.RR {
	t.Helper()
	r, err := dns.NewRR(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// udpAndTCP listens on one loopback port for UDP and TCP both, trying
// again while the TCP port is taken (by another package's test: UDP's
// free port says nothing of TCP's).
func udpAndTCP(t *testing.T) (net.PacketConn, net.Listener) {
	t.Helper()
	for range 20 {
		pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		if ln, err := net.Listen("tcp4", pc.LocalAddr().String()); err == nil {
			return pc, ln
		}
		pc.Close()
	}
	t.Fatal("no port free for UDP and TCP at once")
	return nil, nil
}

func startUpstream(t *testing.T) *fakeUpstream {
	t.Helper()
	u := &fakeUpstream{}
	pc, ln := udpAndTCP(t)
	u.addr = pc.LocalAddr().String()
	h := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) { u.serve(t, w, q) })
	s1 := &dns.Server{PacketConn: pc, Handler: h}
	s2 := &dns.Server{Listener: ln, Handler: h}
	go s1.ActivateAndServe()
	go s2.ActivateAndServe()
	t.Cleanup(func() { s1.Shutdown(); s2.Shutdown() })
	return u
}

func (u *fakeUpstream) askedFor(name string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for _, a := range u.asked {
		if strings.HasPrefix(a, strings.ToLower(name)+" ") {
			n++
		}
	}
	return n
}

func (u *fakeUpstream) serve(t *testing.T, w dns.ResponseWriter, q *dns.Msg) {
	qs := q.Question[0]
	proto := w.RemoteAddr().Network()
	u.mu.Lock()
	u.asked = append(u.asked, strings.ToLower(qs.Name)+" "+dns.TypeToString[qs.Qtype]+" "+proto)
	u.mu.Unlock()
	r := new(dns.Msg)
	r.SetReply(q)
	add := func(s ...string) {
		for _, x := range s {
			r.Answer = append(r.Answer, rr(t, x))
		}
	}
	switch name := strings.ToLower(qs.Name); {
	case qs.Qtype == dns.TypeTXT && name == "txt.allowed.example.":
		add(qs.Name + " 300 IN TXT \"hello\"")
		r.Extra = append(r.Extra, rr(t, "ns.allowed.example. 300 IN A 203.0.113.50"))
	case name == "allowed.example.":
		add(qs.Name + " 300 IN A 203.0.113.10")
	case name == "www.allowed.example.":
		add(qs.Name+" 30 IN CNAME edge.cdn.test.", "edge.cdn.test. 600 IN A 203.0.113.11",
			"stray.test. 600 IN A 203.0.113.99")
		r.Extra = append(r.Extra, rr(t, "glue.test. 600 IN A 203.0.113.98"))
	case name == "rebind.allowed.example.":
		add(qs.Name+" 300 IN A 10.0.0.5", qs.Name+" 300 IN A 127.0.0.1",
			qs.Name+" 300 IN A 203.0.113.12", qs.Name+" 300 IN A 169.254.169.254")
	case name == "big.allowed.example." || name == "tc.allowed.example.":
		for i := range 60 {
			add(qs.Name + " 300 IN A 203.0.113." + itoa(i+100))
		}
		if name == "tc.allowed.example." && proto == "udp" {
			r.Answer, r.Truncated = nil, true
		}
	case name == "drop.allowed.example.":
		if u.drops.Add(1) == 1 {
			return // the first attempt gets no answer
		}
		add(qs.Name + " 300 IN A 203.0.113.13")
	case name == "nx.allowed.example.":
		r.Rcode = dns.RcodeNameError
		r.Ns = append(r.Ns, rr(t, "allowed.example. 300 IN SOA ns.allowed.example. h.allowed.example. 1 2 3 4 60"))
	case name == "mozilla.cloudflare-dns.com." || name == "open.example.":
		add(qs.Name + " 300 IN A 203.0.113.20")
	case name == "ttl0.allowed.example.":
		add(qs.Name + " 0 IN A 203.0.113.21")
	default:
		r.Rcode = dns.RcodeNameError
	}
	w.WriteMsg(r)
}

func itoa(i int) string { return strconv.Itoa(i) }

// proxyEnv is a proxy on 127.0.0.1 whose sandbox is 127.0.0.1 itself
// (the tests' source address); 127.0.0.2 is no sandbox's.
type proxyEnv struct {
	up   *fakeUpstream
	p    *Proxy
	sb   *netpolicy.Sandbox
	tb   *netpolicy.Table
	addr string
}

func policy(t testing.TB, p api.NetworkPolicy) *netpolicy.Policy {
	t.Helper()
	pol, err := netpolicy.Parse(p)
	if err != nil {
		t.Fatal(err)
	}
	return pol
}

var allowlist = api.NetworkPolicy{Allow: []string{"allowed.example", "*.allowed.example", "mozilla.cloudflare-dns.com:443"}}

func newEnv(t *testing.T, cfg Config) *proxyEnv {
	t.Helper()
	e := &proxyEnv{up: startUpstream(t)}
	e.sb = netpolicy.NewSandbox("sb1", netip.MustParseAddr("127.0.0.1"), policy(t, allowlist), nil, nil)
	e.tb = &netpolicy.Table{}
	e.tb.Add(e.sb)
	if cfg.Upstream == "" {
		cfg.Upstream = e.up.addr
	}
	cfg.Lookup = e.tb.Lookup
	if cfg.Timeout == 0 {
		cfg.Timeout = 300 * time.Millisecond
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.p = p
	pc, ln := udpAndTCP(t)
	e.addr = pc.LocalAddr().String()
	go p.ServeUDP(pc)
	go p.ServeTCP(ln)
	t.Cleanup(func() { p.Close() })
	return e
}

func query(name string, qtype uint16, edns bool) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	if edns {
		m.SetEdns0(1232, false)
	}
	return m
}

func (e *proxyEnv) ask(t *testing.T, m *dns.Msg, network string) *dns.Msg {
	t.Helper()
	c := &dns.Client{Net: network, Timeout: 3 * time.Second}
	r, _, err := c.Exchange(m, e.addr)
	if err != nil {
		t.Fatalf("%s %s: %v", m.Question[0].Name, network, err)
	}
	if r.Id != m.Id {
		t.Fatalf("reply ID %d, want the query's %d", r.Id, m.Id)
	}
	return r
}

func addrs(r *dns.Msg) []string {
	var out []string
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok {
			out = append(out, a.A.String())
		}
	}
	return out
}

func ede(r *dns.Msg) *dns.EDNS0_EDE {
	if opt := r.IsEdns0(); opt != nil {
		for _, o := range opt.Option {
			if e, ok := o.(*dns.EDNS0_EDE); ok {
				return e
			}
		}
	}
	return nil
}

func TestAllowedName(t *testing.T) {
	e := newEnv(t, Config{})
	r := e.ask(t, query("AlLoWeD.eXaMpLe.", dns.TypeA, false), "udp")
	if r.Rcode != dns.RcodeSuccess || len(addrs(r)) != 1 || addrs(r)[0] != "203.0.113.10" {
		t.Fatalf("answer %v", r)
	}
	if r.Question[0].Name != "AlLoWeD.eXaMpLe." || r.Answer[0].Header().Name != "AlLoWeD.eXaMpLe." {
		t.Errorf("0x20 case lost: question %q, owner %q", r.Question[0].Name, r.Answer[0].Header().Name)
	}
	at := netip.MustParseAddrPort("203.0.113.10:443")
	if !e.sb.Resolved("allowed.example", at.Addr()) || !e.sb.AllowsConn("allowed.example", at) {
		t.Error("the answer was not learned")
	}
	if e.sb.AllowsConn("evil.example", at) {
		t.Error("another name at the learned address allowed")
	}
}

func TestCNAMEChain(t *testing.T) {
	e := newEnv(t, Config{})
	r := e.ask(t, query("www.allowed.example.", dns.TypeA, true), "udp")
	if got := addrs(r); len(got) != 1 || got[0] != "203.0.113.11" || len(r.Answer) != 2 {
		t.Fatalf("answer %v: want the CNAME and edge's address only, no stray record", r)
	}
	for _, rr := range r.Answer {
		if rr.Header().Ttl != 30 {
			t.Errorf("%v: TTL %d, want the chain's smallest, 30", rr, rr.Header().Ttl)
		}
	}
	if len(r.Extra) != 1 { // the OPT only
		t.Errorf("additional section %v, want none but OPT", r.Extra)
	}
	if !e.sb.Resolved("www.allowed.example", netip.MustParseAddr("203.0.113.11")) {
		t.Error("edge's address not learned under the queried name")
	}
	if e.sb.Resolved("www.allowed.example", netip.MustParseAddr("203.0.113.99")) ||
		e.sb.Resolved("stray.test", netip.MustParseAddr("203.0.113.99")) {
		t.Error("a stray record off the chain was learned")
	}
	l := e.sb.Learned()
	if len(l) != 1 || time.Until(l[0].Expires) < netpolicy.MinLearnTTL-time.Second {
		t.Errorf("learned %+v, want one address for at least MinLearnTTL", l)
	}
}

func TestRebindingStripped(t *testing.T) {
	e := newEnv(t, Config{})
	r := e.ask(t, query("rebind.allowed.example.", dns.TypeA, false), "udp")
	if got := addrs(r); len(got) != 1 || got[0] != "203.0.113.12" {
		t.Fatalf("addresses %v, want only the public one", got)
	}
	for _, l := range e.sb.Learned() {
		if l.Addr != netip.MustParseAddr("203.0.113.12") {
			t.Errorf("learned %s", l.Addr)
		}
	}
}

func TestRefusedNeverUpstream(t *testing.T) {
	e := newEnv(t, Config{})
	for _, name := range []string{"c2VjcmV0.attacker.example.", "allowed.example.evil.", "xallowed.example.", "example."} {
		r := e.ask(t, query(name, dns.TypeA, true), "udp")
		if r.Rcode != dns.RcodeRefused {
			t.Errorf("%s: rcode %s, want REFUSED", name, dns.RcodeToString[r.Rcode])
		}
		x := ede(r)
		if x == nil || x.InfoCode != dns.ExtendedErrorCodeBlocked || !strings.Contains(x.ExtraText, "network policy") {
			t.Errorf("%s: extended error %v, want Blocked, not in the policy", name, x)
		}
		if e.up.askedFor(name) != 0 {
			t.Errorf("%s was sent upstream", name)
		}
	}
	// Without EDNS, no OPT (and so no EDE) in the answer.
	r := e.ask(t, query("evil.example.", dns.TypeTXT, false), "tcp")
	if r.Rcode != dns.RcodeRefused || r.IsEdns0() != nil {
		t.Errorf("no EDNS: %v", r)
	}
	if _, q := e.sb.Denied(); q != 5 {
		t.Errorf("denied queries %d, want 5", q)
	}
}

func TestDoH(t *testing.T) {
	e := newEnv(t, Config{})
	r := e.ask(t, query("mozilla.cloudflare-dns.com.", dns.TypeA, false), "udp")
	if len(addrs(r)) != 1 {
		t.Fatalf("an exactly allowed DoH host: %v", r)
	}
	if !e.sb.AllowsConn("mozilla.cloudflare-dns.com", netip.MustParseAddrPort("203.0.113.20:443")) {
		t.Error("its address not learned for 443")
	}
	e.sb.SetPolicy(policy(t, api.NetworkPolicy{Mode: api.NetworkOpen}))
	for _, name := range []string{"dns.google.", "mozilla.cloudflare-dns.com.", "abc.dns.nextdns.io."} {
		if r := e.ask(t, query(name, dns.TypeA, false), "udp"); r.Rcode != dns.RcodeRefused {
			t.Errorf("open: %s answered %v", name, r)
		}
	}
	if e.up.askedFor("dns.google.") != 0 || e.up.askedFor("mozilla.cloudflare-dns.com.") != 1 {
		t.Error("a DoH name went upstream in mode open")
	}
	if r := e.ask(t, query("open.example.", dns.TypeA, false), "udp"); len(addrs(r)) != 1 {
		t.Errorf("open: another name refused: %v", r)
	}
}

func TestTypes(t *testing.T) {
	e := newEnv(t, Config{})
	for _, qt := range []uint16{dns.TypeAAAA, dns.TypeHTTPS, dns.TypeSVCB} {
		r := e.ask(t, query("allowed.example.", qt, false), "udp")
		if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 0 {
			t.Errorf("%s: %v, want an empty NOERROR", dns.TypeToString[qt], r)
		}
	}
	for _, qt := range []uint16{dns.TypeANY, dns.TypeAXFR} {
		if r := e.ask(t, query("allowed.example.", qt, false), "tcp"); r.Rcode != dns.RcodeNotImplemented {
			t.Errorf("%s: %v, want NOTIMP", dns.TypeToString[qt], r)
		}
	}
	if n := e.up.askedFor("allowed.example."); n != 0 {
		t.Errorf("asked upstream %d times for AAAA/HTTPS/SVCB/ANY", n)
	}
	r := e.ask(t, query("txt.allowed.example.", dns.TypeTXT, false), "udp")
	if len(r.Answer) != 1 || r.Answer[0].(*dns.TXT).Txt[0] != "hello" || len(r.Extra) != 0 {
		t.Errorf("TXT: %v, want the record and no additional address", r)
	}
	if len(e.sb.Learned()) != 0 {
		t.Errorf("learned %v from a TXT answer", e.sb.Learned())
	}
	r = e.ask(t, query("nx.allowed.example.", dns.TypeA, false), "udp")
	if r.Rcode != dns.RcodeNameError || len(r.Ns) != 1 {
		t.Errorf("NXDOMAIN: %v, want the SOA kept", r)
	}
	m := query("allowed.example.", dns.TypeA, false)
	m.Question[0].Qclass = dns.ClassCHAOS
	if r := e.ask(t, m, "udp"); r.Rcode != dns.RcodeRefused {
		t.Errorf("class CH: %v", r)
	}
}

func TestUnknownSource(t *testing.T) {
	e := newEnv(t, Config{})
	c := &dns.Client{Net: "udp", Timeout: 3 * time.Second,
		Dialer: &net.Dialer{LocalAddr: &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2)}}}
	r, _, err := c.Exchange(query("allowed.example.", dns.TypeA, true), e.addr)
	if err != nil {
		t.Fatal(err)
	}
	if r.Rcode != dns.RcodeRefused || ede(r) == nil || ede(r).InfoCode != dns.ExtendedErrorCodeProhibited {
		t.Errorf("unknown source: %v", r)
	}
	if e.up.askedFor("allowed.example.") != 0 {
		t.Error("an unknown source's query went upstream")
	}
}

func TestRateLimit(t *testing.T) {
	e := newEnv(t, Config{QueryRate: 0.001, QueryBurst: 3})
	var refused int
	for range 6 {
		if r := e.ask(t, query("allowed.example.", dns.TypeAAAA, false), "udp"); r.Rcode == dns.RcodeRefused {
			refused++
		}
	}
	if _, q := e.sb.Denied(); refused != 3 || q != 3 {
		t.Errorf("refused %d, counted %d: want 3 over a burst of 3", refused, q)
	}
}

func TestTruncation(t *testing.T) {
	e := newEnv(t, Config{})
	// Upstream truncates over UDP: the proxy asks again over TCP. Its own
	// answer to a plain UDP query (512 bytes) is truncated in turn, and
	// complete over TCP.
	r := e.ask(t, query("tc.allowed.example.", dns.TypeA, false), "udp")
	if !r.Truncated || len(addrs(r)) >= 60 {
		t.Errorf("UDP without EDNS: TC %v, %d addresses", r.Truncated, len(addrs(r)))
	}
	if r := e.ask(t, query("tc.allowed.example.", dns.TypeA, false), "tcp"); r.Truncated || len(addrs(r)) != 60 {
		t.Errorf("TCP: TC %v, %d addresses, want 60", r.Truncated, len(addrs(r)))
	}
	if r := e.ask(t, query("big.allowed.example.", dns.TypeA, true), "udp"); r.Truncated || len(addrs(r)) != 60 {
		t.Errorf("UDP with EDNS 1232: TC %v, %d addresses, want 60", r.Truncated, len(addrs(r)))
	}
	e.up.mu.Lock()
	asked := strings.Join(e.up.asked, ",")
	e.up.mu.Unlock()
	if !strings.Contains(asked, "tc.allowed.example. A tcp") {
		t.Errorf("upstream never asked over TCP: %s", asked)
	}
}

func TestRetry(t *testing.T) {
	e := newEnv(t, Config{Timeout: 200 * time.Millisecond})
	r := e.ask(t, query("drop.allowed.example.", dns.TypeA, false), "udp")
	if len(addrs(r)) != 1 || e.up.askedFor("drop.allowed.example.") != 2 {
		t.Errorf("after a lost attempt: %v, asked %d times", r, e.up.askedFor("drop.allowed.example."))
	}
}

func TestUpstreamDown(t *testing.T) {
	dead, err := net.ListenPacket("udp4", "127.0.0.1:0") // answers nothing
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	e := newEnv(t, Config{Timeout: 100 * time.Millisecond, Upstream: dead.LocalAddr().String()})
	r := e.ask(t, query("allowed.example.", dns.TypeA, true), "udp")
	if r.Rcode != dns.RcodeServerFailure || ede(r) == nil || ede(r).InfoCode != dns.ExtendedErrorCodeNetworkError {
		t.Errorf("upstream down: %v, want SERVFAIL, Network Error", r)
	}
}

func TestCache(t *testing.T) {
	e := newEnv(t, Config{})
	e.ask(t, query("allowed.example.", dns.TypeA, false), "udp")
	other := netpolicy.NewSandbox("sb2", netip.MustParseAddr("127.0.0.1"), policy(t, allowlist), nil, nil)
	e.tb.Add(other)
	r := e.ask(t, query("ALLOWED.example.", dns.TypeA, false), "udp")
	if n := e.up.askedFor("allowed.example."); n != 1 {
		t.Errorf("upstream asked %d times, want 1 (the second from the cache)", n)
	}
	if r.Answer[0].Header().Name != "ALLOWED.example." || r.Question[0].Name != "ALLOWED.example." {
		t.Errorf("a cached answer lost the query's case: %v", r)
	}
	if !other.Resolved("allowed.example", netip.MustParseAddr("203.0.113.10")) {
		t.Error("a cached answer was not learned by the sandbox that got it")
	}
	e.ask(t, query("ttl0.allowed.example.", dns.TypeA, false), "udp")
	e.ask(t, query("ttl0.allowed.example.", dns.TypeA, false), "udp")
	if n := e.up.askedFor("ttl0.allowed.example."); n != 2 {
		t.Errorf("a TTL 0 answer was cached (asked %d times)", n)
	}
	e.ask(t, query("nx.allowed.example.", dns.TypeA, false), "udp")
	e.ask(t, query("nx.allowed.example.", dns.TypeA, false), "udp")
	if n := e.up.askedFor("nx.allowed.example."); n != 1 {
		t.Errorf("a name error was not cached for its SOA's TTL (asked %d times)", n)
	}

	c := newCache(4)
	resp := &dns.Msg{Answer: []dns.RR{rr(t, "a.test. 100 IN A 203.0.113.1")}}
	now := time.Now()
	c.put(cacheKey{"a.test", dns.TypeA}, resp, now)
	if m := c.get(cacheKey{"a.test", dns.TypeA}, now.Add(40*time.Second)); m == nil || m.Answer[0].Header().Ttl != 60 {
		t.Errorf("after 40s of 100: %v, want TTL 60", m)
	}
	if m := c.get(cacheKey{"a.test", dns.TypeA}, now.Add(100*time.Second)); m != nil {
		t.Errorf("expired entry returned: %v", m)
	}
	for i := range 10 {
		c.put(cacheKey{itoa(i), dns.TypeA}, resp, now)
	}
	if len(c.m) > 4 {
		t.Errorf("cache of 4 holds %d", len(c.m))
	}
}

func TestMalformed(t *testing.T) {
	e := newEnv(t, Config{})
	src := netip.MustParseAddr("127.0.0.1")
	ctx := context.Background()
	good, _ := query("allowed.example.", dns.TypeA, false).Pack()
	resp := append([]byte(nil), good...)
	resp[2] |= 0x80
	two := query("allowed.example.", dns.TypeA, false)
	two.Question = append(two.Question, two.Question[0])
	twoB, _ := two.Pack()
	upd := query("allowed.example.", dns.TypeA, false)
	upd.Opcode = dns.OpcodeUpdate
	updB, _ := upd.Pack()
	v1 := query("allowed.example.", dns.TypeA, true)
	v1.IsEdns0().SetVersion(1)
	v1B, _ := v1.Pack()
	cases := []struct {
		name  string
		raw   []byte
		rcode int // -1: no answer
	}{
		{"short", good[:11], -1},
		{"a response", resp, -1},
		{"too long", append(good, make([]byte, MaxQuery)...), -1},
		{"garbage after the header", append(good[:12:12], 0xff, 0xff, 0xff), dns.RcodeFormatError},
		{"two questions", twoB, dns.RcodeFormatError},
		{"opcode update", updB, dns.RcodeNotImplemented},
		{"EDNS version 1", v1B, dns.RcodeBadVers},
	}
	for _, c := range cases {
		out := e.p.answer(ctx, src, c.raw, false)
		if c.rcode < 0 {
			if out != nil {
				t.Errorf("%s: answered", c.name)
			}
			continue
		}
		r := new(dns.Msg)
		if err := r.Unpack(out); err != nil {
			t.Errorf("%s: answer does not parse: %v", c.name, err)
			continue
		}
		if r.Id != uint16(c.raw[0])<<8|uint16(c.raw[1]) || r.Rcode != c.rcode {
			t.Errorf("%s: ID %d rcode %s, want %s", c.name, r.Id, dns.RcodeToString[r.Rcode], dns.RcodeToString[c.rcode])
		}
	}
	if n := len(e.up.asked); n != 0 {
		t.Errorf("malformed queries went upstream: %v", e.up.asked)
	}
}

func TestPolicyNone(t *testing.T) {
	e := newEnv(t, Config{})
	e.sb.SetPolicy(netpolicy.None)
	if r := e.ask(t, query("allowed.example.", dns.TypeA, false), "udp"); r.Rcode != dns.RcodeRefused {
		t.Errorf("mode none: %v", r)
	}
}

func TestClose(t *testing.T) {
	e := newEnv(t, Config{})
	done := make(chan error, 1)
	pc, _ := net.ListenPacket("udp4", "127.0.0.1:0")
	go func() { done <- e.p.ServeUDP(pc) }()
	time.Sleep(10 * time.Millisecond)
	e.p.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("ServeUDP after Close: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("ServeUDP still running after Close")
	}
	if err := e.p.ServeUDP(pc); err != ErrClosed {
		t.Errorf("ServeUDP on a closed proxy: %v", err)
	}
}

func TestSystemUpstream(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) string {
		p := filepath.Join(dir, "resolv.conf")
		os.WriteFile(p, []byte(s), 0o644)
		return p
	}
	got, err := systemUpstream(write("# x\nsearch example\nnameserver bogus\nnameserver 192.0.2.53\nnameserver 192.0.2.54\n"))
	if err != nil || got != "192.0.2.53:53" {
		t.Errorf("got %q, %v", got, err)
	}
	if got, _ := systemUpstream(write("nameserver fe80::1%eth0\n")); got != "[fe80::1%eth0]:53" {
		t.Errorf("IPv6: %q", got)
	}
	if _, err := systemUpstream(write("search x\n")); err == nil {
		t.Error("no nameserver: no error")
	}
}
