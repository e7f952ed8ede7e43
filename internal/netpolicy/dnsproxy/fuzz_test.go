package dnsproxy

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/miekg/dns"

	"github.com/warrenhq/warren/internal/netpolicy"
)

// wireLabels is name's labels as sent on the wire, lower case: the
// oracle the fuzz target checks forwarded names against, independent of
// the presentation form the proxy matches policies on.
func wireLabels(name string) ([]string, bool) {
	buf := make([]byte, 256)
	n, err := dns.PackDomainName(dns.Fqdn(name), buf, 0, nil, false)
	if err != nil {
		return nil, false
	}
	var out []string
	for i := 0; i < n && buf[i] != 0; i += int(buf[i]) + 1 {
		out = append(out, string(bytes.ToLower(buf[i+1:i+1+int(buf[i])])))
	}
	return out, true
}

// allowedOnWire says whether the fuzz policy (allowed.example,
// *.allowed.example, mozilla.cloudflare-dns.com) lets name be resolved.
func allowedOnWire(name string) bool {
	l, ok := wireLabels(name)
	if !ok {
		return false
	}
	s := strings.Join(l, ".")
	for _, x := range l {
		if strings.ContainsAny(x, ".") {
			return false
		}
	}
	return s == "allowed.example" || strings.HasSuffix(s, ".allowed.example") || s == "mozilla.cloudflare-dns.com"
}

// FuzzAnswer feeds raw bytes to the request path as a query from a
// sandbox, with a fake upstream that answers with the second input (or
// fails if it does not parse) and records what it was asked. The answer,
// if any, carries the query's ID; no name the policy does not allow ever
// reaches the upstream; no always-denied address is learned or answered.
// Each query is asked twice, the second time from the cache.
func FuzzAnswer(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s.query, s.upstream, s.tcp)
	}
	src := netip.MustParseAddr("10.213.0.2")
	pol := policy(f, allowlist)
	f.Fuzz(func(t *testing.T, query, upstream []byte, tcp bool) {
		sb := netpolicy.NewSandbox("fuzz", src, pol, nil, nil)
		var asked []string
		p, err := New(Config{Upstream: "127.0.0.1:1", Lookup: func(a netip.Addr) *netpolicy.Sandbox {
			if a == src {
				return sb
			}
			return nil
		}})
		if err != nil {
			t.Fatal(err)
		}
		p.exchange = func(ctx context.Context, q *dns.Msg) (*dns.Msg, error) {
			asked = append(asked, q.Question[0].Name)
			r := new(dns.Msg)
			if err := r.Unpack(upstream); err != nil {
				return nil, err
			}
			return r, nil
		}
		for range 2 {
			out := p.answer(context.Background(), src, query, tcp)
			if out == nil {
				continue
			}
			if len(out) < 2 || len(query) < 2 || out[0] != query[0] || out[1] != query[1] {
				t.Fatalf("answer's ID %x, query's %x", out[:min(2, len(out))], query[:2])
			}
			if !tcp && len(out) > maxUDPReply {
				t.Fatalf("UDP answer of %d bytes", len(out))
			}
			r := new(dns.Msg)
			if err := r.Unpack(out); err != nil {
				t.Fatalf("answer does not parse: %v", err)
			}
			for _, rr := range append(append(r.Answer, r.Ns...), r.Extra...) {
				switch rr := rr.(type) {
				case *dns.A:
					a, _ := netip.AddrFromSlice(rr.A)
					if (&netpolicy.Fence{}).Denies(a) {
						t.Fatalf("answered an always-denied address %s", a)
					}
				case *dns.AAAA, *dns.HTTPS, *dns.SVCB:
					t.Fatalf("answered %v", rr)
				}
			}
		}
		for _, name := range asked {
			if !allowedOnWire(name) {
				t.Fatalf("%q went upstream", name)
			}
		}
		for _, l := range sb.Learned() {
			if (&netpolicy.Fence{}).Denies(l.Addr) {
				t.Fatalf("learned an always-denied address %s", l.Addr)
			}
		}
		if _, q := p.cfg.Lookup(src).Denied(); q > 2 {
			t.Fatalf("%d queries counted denied of 2", q)
		}
	})
}

type fuzzSeed struct {
	query, upstream []byte
	tcp             bool
}

// fuzzSeeds are queries and upstream answers of every kind the proxy
// tells apart. The same seeds are in testdata/fuzz/FuzzAnswer.
func fuzzSeeds(t testing.TB) []fuzzSeed {
	pack := func(m *dns.Msg) []byte {
		b, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	answer := func(q *dns.Msg, rrs ...string) []byte {
		r := new(dns.Msg)
		r.SetReply(q)
		for _, s := range rrs {
			r.Answer = append(r.Answer, rr(t, s))
		}
		return pack(r)
	}
	var out []fuzzSeed
	add := func(q *dns.Msg, up []byte, tcp bool) { out = append(out, fuzzSeed{pack(q), up, tcp}) }
	id := uint16(0x1000)
	query := func(name string, qtype uint16, edns bool) *dns.Msg { // with IDs that do not change
		m := query(name, qtype, edns)
		id += 0x111
		m.Id = id
		return m
	}
	a := query("Www.Allowed.Example.", dns.TypeA, true)
	add(a, answer(a, "www.allowed.example. 30 IN CNAME edge.cdn.test.", "edge.cdn.test. 300 IN A 203.0.113.7",
		"edge.cdn.test. 300 IN A 10.0.0.1", "stray.test. 300 IN A 203.0.113.8"), false)
	b := query("allowed.example.", dns.TypeA, false)
	add(b, answer(b, "allowed.example. 300 IN A 127.0.0.1", "allowed.example. 300 IN A 203.0.113.9"), true)
	c := query("secret.attacker.example.", dns.TypeA, true)
	add(c, answer(c, "secret.attacker.example. 300 IN A 203.0.113.10"), false)
	d := query("x\\.allowed.example.", dns.TypeA, false)
	add(d, answer(d, "x\\.allowed.example. 300 IN A 203.0.113.11"), false)
	e := query("txt.allowed.example.", dns.TypeTXT, false)
	add(e, answer(e, "txt.allowed.example. 300 IN TXT \"x\"", "txt.allowed.example. 300 IN A 203.0.113.12"), false)
	g := query("allowed.example.", dns.TypeHTTPS, true)
	add(g, answer(g, "allowed.example. 300 IN HTTPS 1 . ipv4hint=10.0.0.1"), false)
	h := query("dns.google.", dns.TypeA, false)
	add(h, answer(h, "dns.google. 300 IN A 8.8.8.8"), false)
	m := query("mozilla.cloudflare-dns.com.", dns.TypeA, false)
	add(m, answer(m, "mozilla.cloudflare-dns.com. 300 IN A 203.0.113.13"), false)
	n := query("nx.allowed.example.", dns.TypeMX, true)
	nx := new(dns.Msg)
	nx.SetRcode(n, dns.RcodeNameError)
	nx.Ns = []dns.RR{rr(t, "allowed.example. 300 IN SOA ns. h. 1 2 3 4 60")}
	add(n, pack(nx), false)
	two := query("allowed.example.", dns.TypeA, false)
	two.Question = append(two.Question, dns.Question{Name: "evil.example.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
	add(two, nil, false)
	big := query("big.allowed.example.", dns.TypeA, false)
	var rrs []string
	for i := range 80 {
		rrs = append(rrs, "big.allowed.example. 300 IN A 203.0.113."+itoa(i+1))
	}
	add(big, answer(big, rrs...), false)
	out = append(out, fuzzSeed{[]byte{0x12, 0x34}, nil, false}, fuzzSeed{pack(a)[:20], nil, true})
	return out
}

var updateSeeds = flag.Bool("update-seeds", false, "rewrite testdata/fuzz/FuzzAnswer from fuzzSeeds")

// TestFuzzSeeds keeps testdata/fuzz/FuzzAnswer in step with fuzzSeeds
// (go test -run TestFuzzSeeds -update-seeds rewrites it).
func TestFuzzSeeds(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzAnswer")
	for i, s := range fuzzSeeds(t) {
		body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n[]byte(%q)\nbool(%v)\n", s.query, s.upstream, s.tcp)
		path := filepath.Join(dir, fmt.Sprintf("seed-%02d", i))
		if *updateSeeds {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != body {
			t.Errorf("%s is not fuzzSeeds[%d] (go test -run TestFuzzSeeds -update-seeds): %v", path, i, err)
		}
	}
}
