package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/netns"
	"github.com/warrenhq/warren/internal/netpolicy"
	"github.com/warrenhq/warren/internal/netpolicy/egress"
)

// The fake internet of the egress part: a namespace holding 203.0.113.10,
// routed from this host through a veth.
const (
	fiNS, fiIf = "wbnfi", "wbnfi0"
	sinkAddr   = "203.0.113.10:9000" // reads and discards
	acceptAddr = "203.0.113.10:9001" // accepts and closes
	// tlsAddr reads a TLS record (a ClientHello), answers one byte, then
	// reads and discards: what the Host/SNI proxy lets through to an
	// allowed name's address after checking its SNI.
	tlsAddr = "203.0.113.10:443"
)

// clientHello is a ClientHello naming pypi.org, as crypto/tls sends it.
func clientHello() ([]byte, error) {
	a, b := net.Pipe()
	go tls.Client(a, &tls.Config{ServerName: "pypi.org"}).Handshake()
	defer a.Close()
	defer b.Close()
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(b, hdr); err != nil {
		return nil, err
	}
	body := make([]byte, int(hdr[3])<<8|int(hdr[4]))
	if _, err := io.ReadFull(b, body); err != nil {
		return nil, err
	}
	return append(hdr, body...), nil
}

// helloServer serves tlsAddr's protocol on c.
func helloServer(c net.Conn) {
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(c, hdr); err != nil {
		return
	}
	if _, err := io.CopyN(io.Discard, c, int64(hdr[3])<<8|int64(hdr[4])); err != nil {
		return
	}
	c.Write([]byte("k"))
	io.Copy(io.Discard, c)
}

func ipCmd(args ...string) error {
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

func ipAll(cmds ...[]string) error {
	for _, c := range cmds {
		if err := ipCmd(c...); err != nil {
			return err
		}
	}
	return nil
}

// fakeInternet makes the namespace, its route (checked), and its two
// servers; the returned func removes it all.
func fakeInternet() (func(), error) {
	cleanup := func() {
		exec.Command("ip", "route", "del", "203.0.113.0/24", "dev", fiIf).Run()
		exec.Command("ip", "link", "del", fiIf).Run()
		exec.Command("ip", "netns", "del", fiNS).Run()
	}
	cleanup()
	if err := ipAll(
		[]string{"netns", "add", fiNS},
		[]string{"link", "add", fiIf, "type", "veth", "peer", "name", "up0", "netns", fiNS},
		[]string{"addr", "add", "192.0.0.9/30", "dev", fiIf},
		[]string{"link", "set", fiIf, "up"},
		[]string{"-n", fiNS, "addr", "add", "192.0.0.10/30", "dev", "up0"},
		[]string{"-n", fiNS, "addr", "add", "203.0.113.10/32", "dev", "lo"},
		[]string{"-n", fiNS, "link", "set", "up0", "up"},
		[]string{"-n", fiNS, "link", "set", "lo", "up"},
		[]string{"-n", fiNS, "route", "add", "default", "via", "192.0.0.9"},
		[]string{"route", "add", "203.0.113.0/24", "via", "192.0.0.10", "dev", fiIf},
	); err != nil {
		cleanup()
		return nil, err
	}
	out, err := exec.Command("ip", "route", "get", "203.0.113.10").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "dev "+fiIf+" ") {
		cleanup()
		return nil, fmt.Errorf("203.0.113.10 is not routed into the fake internet: %s %v", out, err)
	}
	ns, err := os.Open("/run/netns/" + fiNS)
	if err != nil {
		cleanup()
		return nil, err
	}
	defer ns.Close()
	var sink, acc, hello net.Listener
	if err := netns.Do(ns, func() (err error) {
		if sink, err = net.Listen("tcp4", sinkAddr); err != nil {
			return err
		}
		if hello, err = net.Listen("tcp4", tlsAddr); err != nil {
			return err
		}
		acc, err = net.Listen("tcp4", acceptAddr)
		return err
	}); err != nil {
		cleanup()
		return nil, err
	}
	go serve(sink, func(c net.Conn) { io.Copy(io.Discard, c) })
	go serve(acc, func(net.Conn) {})
	go serve(hello, helloServer)
	return func() { sink.Close(); acc.Close(); hello.Close(); cleanup() }, nil
}

func serve(ln net.Listener, f func(net.Conn)) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() { f(c); c.Close() }()
	}
}

// plainPeer is a namespace with a veth and NAT, no policy: what a
// networked container gets from a bare runtime.
func plainPeer() (*os.File, func(), error) {
	const ns, host = "wbnplain", "wbnplain0"
	cleanup := func() {
		exec.Command("ip", "link", "del", host).Run()
		exec.Command("ip", "netns", "del", ns).Run()
		exec.Command("nft", "delete", "table", "ip", "wbnplain").Run()
	}
	cleanup()
	if err := ipAll(
		[]string{"netns", "add", ns},
		[]string{"link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", ns},
		[]string{"addr", "add", "10.213.251.1/30", "dev", host},
		[]string{"link", "set", host, "up"},
		[]string{"-n", ns, "addr", "add", "10.213.251.2/30", "dev", "eth0"},
		[]string{"-n", ns, "link", "set", "eth0", "up"},
		[]string{"-n", ns, "link", "set", "lo", "up"},
		[]string{"-n", ns, "route", "add", "default", "via", "10.213.251.1"},
	); err != nil {
		cleanup()
		return nil, nil, err
	}
	nft := exec.Command("nft", "-f", "-")
	nft.Stdin = strings.NewReader("table ip wbnplain {\n chain post {\n  type nat hook postrouting priority srcnat;\n  ip saddr 10.213.251.0/30 masquerade\n }\n}\n")
	if out, err := nft.CombinedOutput(); err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("nft: %v: %s (the plain peer needs Debian's nftables)", err, out)
	}
	f, err := os.Open("/run/netns/" + ns)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	return f, func() { f.Close(); cleanup() }, nil
}

// policyPeer is a namespace given a veth and policy p by the node's
// network manager, as a sandbox is.
func policyPeer(m *egress.Manager, name string, p api.NetworkPolicy) (*os.File, func(), error) {
	f, _, stop, err := policyPeerAt(m, name, p)
	return f, stop, err
}

// policyPeerAt is policyPeer that also returns the peer's address.
func policyPeerAt(m *egress.Manager, name string, p api.NetworkPolicy) (*os.File, netip.Addr, func(), error) {
	ns := "wbn" + name
	exec.Command("ip", "netns", "del", ns).Run()
	var none netip.Addr
	if err := ipAll([]string{"netns", "add", ns}, []string{"-n", ns, "link", "set", "lo", "up"}); err != nil {
		return nil, none, nil, err
	}
	f, err := os.Open("/run/netns/" + ns)
	if err != nil {
		return nil, none, nil, err
	}
	pol, err := netpolicy.Parse(p)
	if err != nil {
		return nil, none, nil, err
	}
	addr, err := m.Attach(context.Background(), name, f, pol, netip.Addr{})
	if err != nil {
		return nil, none, nil, err
	}
	return f, addr, func() { m.Detach(name); f.Close(); exec.Command("ip", "netns", "del", ns).Run() }, nil
}

// target is what a peer talks to: the raw sink and accept servers, or
// the TLS one with a ClientHello first.
type target struct {
	sink, accept string
	hello        []byte
}

// open connects to addr and, for a TLS target, sends the ClientHello and
// waits for the server's byte.
func (tg target) open(addr string) (net.Conn, error) {
	c, err := net.DialTimeout("tcp4", addr, 5*time.Second)
	if err != nil || tg.hello == nil {
		return c, err
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(tg.hello); err != nil {
		c.Close()
		return nil, err
	}
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		c.Close()
		return nil, fmt.Errorf("%s refused the ClientHello: %w", addr, err)
	}
	c.SetDeadline(time.Time{})
	return c, nil
}

// throughput sends size bytes from inside ns to the target's sink: MB/s.
func throughput(ns *os.File, tg target, size int) (float64, error) {
	var mbps float64
	err := netns.Do(ns, func() error {
		c, err := tg.open(tg.sink)
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 256<<10)
		t0 := time.Now()
		for sent := 0; sent < size; sent += len(buf) {
			if _, err := c.Write(buf); err != nil {
				return err
			}
		}
		c.(*net.TCPConn).CloseWrite()
		io.Copy(io.Discard, c) // the sink closes after reading everything
		mbps = float64(size) / (1 << 20) / time.Since(t0).Seconds()
		return nil
	})
	return mbps, err
}

// connRate opens and closes connections to the target's accept server
// from inside ns for d: connections per second.
func connRate(ns *os.File, tg target, d time.Duration) (float64, error) {
	var rate float64
	err := netns.Do(ns, func() error {
		n, t0 := 0, time.Now()
		for time.Since(t0) < d {
			c, err := tg.open(tg.accept)
			if err != nil {
				return err
			}
			// A reset, not a FIN: no TIME_WAIT piles up in the peer's
			// port space from one round to the next.
			c.(*net.TCPConn).SetLinger(0)
			c.Close()
			n++
		}
		rate = float64(n) / time.Since(t0).Seconds()
		return nil
	})
	return rate, err
}

func runEgress(rounds int) error {
	stopFI, err := fakeInternet()
	if err != nil {
		return err
	}
	defer stopFI()
	m, err := egress.New(context.Background(), egress.Config{Name: "bench", Pool: netip.MustParsePrefix("10.213.252.0/24"), DNSUpstream: "127.0.0.1:1"})
	if err != nil {
		return err
	}
	defer m.Teardown()
	type peer struct {
		name string
		ns   *os.File
		tg   target
		mbps []float64
		cps  []float64
	}
	plain, stopPlain, err := plainPeer()
	if err != nil {
		return err
	}
	defer stopPlain()
	allow, stopAllow, err := policyPeer(m, "allow", api.NetworkPolicy{Allow: []string{"198.51.100.0/24:443", "203.0.113.0/24"}})
	if err != nil {
		return err
	}
	defer stopAllow()
	open, stopOpen, err := policyPeer(m, "open", api.NetworkPolicy{Mode: api.NetworkOpen})
	if err != nil {
		return err
	}
	defer stopOpen()
	// HTTPS to an allowed name goes through the Host/SNI proxy: a peer
	// whose policy names pypi.org, and its address as the DNS proxy would
	// have learned it.
	proxied, at, stopProxied, err := policyPeerAt(m, "sni", api.NetworkPolicy{Allow: []string{"pypi.org"}})
	if err != nil {
		return err
	}
	defer stopProxied()
	if !m.Lookup(at).Learn("pypi.org", netip.MustParseAddr("203.0.113.10"), time.Hour) {
		return fmt.Errorf("pypi.org's address not learned")
	}
	hello, err := clientHello()
	if err != nil {
		return err
	}
	raw := target{sink: sinkAddr, accept: acceptAddr}
	tlsT := target{sink: tlsAddr, accept: tlsAddr, hello: hello}
	peers := []*peer{
		{name: "veth+NAT", ns: plain, tg: raw}, {name: "allowlist", ns: allow, tg: raw}, {name: "open", ns: open, tg: raw},
		{name: "TLS, open", ns: open, tg: tlsT}, {name: "TLS, SNI proxy", ns: proxied, tg: tlsT},
	}
	const size = 512 << 20
	for _, p := range peers { // warm-up
		if _, err := throughput(p.ns, p.tg, 16<<20); err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
	}
	for r := 0; r < rounds; r++ {
		// Rotated, so that no peer always runs first or last.
		for i := range peers {
			p := peers[(i+r)%len(peers)]
			mbps, err := throughput(p.ns, p.tg, size)
			if err != nil {
				return fmt.Errorf("%s: %w", p.name, err)
			}
			cps, err := connRate(p.ns, p.tg, 2*time.Second)
			if err != nil {
				return fmt.Errorf("%s: %w", p.name, err)
			}
			p.mbps, p.cps = append(p.mbps, mbps), append(p.cps, cps)
		}
	}
	fmt.Printf("   TCP to a fake internet host: %d MiB per round, then 2s of connect+close; %d rounds, median (min-max)\n", size>>20, rounds)
	fmt.Printf("   (the TLS peers send a ClientHello and wait for one byte first; vs peer: veth+NAT, and TLS, open for the proxy)\n")
	fmt.Printf("   %-15s %22s %9s %22s %9s\n", "peer", "MB/s", "vs peer", "connections/s", "vs peer")
	for i, p := range peers {
		base := peers[0]
		if i == 4 {
			base = peers[3]
		}
		fmt.Printf("   %-15s %22s %8.2fx %22s %8.2fx\n", p.name, medianSpread(p.mbps, "%.0f"), median(p.mbps)/median(base.mbps),
			medianSpread(p.cps, "%.0f"), median(p.cps)/median(base.cps))
	}
	return nil
}
