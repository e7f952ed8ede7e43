package egress

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/netns"
	"github.com/warrenhq/warren/internal/netpolicy"
	"github.com/warrenhq/warren/internal/testutil"
	"github.com/warrenhq/warren/internal/testutil/fakenet"
)

// newManager makes a Manager with a name and pool of its own, so that
// tests in other packages (and a warren agent) on the host are left alone.
func newManager(t *testing.T, fence netpolicy.Fence, mod ...func(*Config)) *Manager {
	t.Helper()
	testutil.RequireRoot(t)
	for range 20 {
		n, _ := rand.Int(rand.Reader, big.NewInt(150))
		b := make([]byte, 2)
		rand.Read(b)
		cfg := Config{
			Name:  "t" + hex.EncodeToString(b),
			Pool:  netip.MustParsePrefix(fmt.Sprintf("10.213.%d.0/24", 100+n.Int64())),
			Fence: fence,
			// Never the host's resolver: tests resolve on their fake
			// internet only.
			DNSUpstream: "127.0.0.1:1",
		}
		for _, f := range mod {
			f(&cfg)
		}
		m, err := New(context.Background(), cfg)
		if err != nil && strings.Contains(err.Error(), "in use") {
			continue
		}
		if err != nil {
			testutil.Unavailable(t, "network: %v", err)
		}
		t.Cleanup(func() { m.Teardown() })
		return m
	}
	t.Fatal("no free test pool")
	return nil
}

// sandboxNS makes a network namespace standing in for a sandbox's (what
// runc makes: loopback only).
func sandboxNS(t *testing.T) *os.File {
	t.Helper()
	b := make([]byte, 3)
	rand.Read(b)
	name := "wsb" + hex.EncodeToString(b)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	exec.Command("ip", "-n", name, "link", "set", "lo", "up").Run()
	f, err := os.Open("/run/netns/" + name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func policy(t *testing.T, p api.NetworkPolicy) *netpolicy.Policy {
	t.Helper()
	pol, err := netpolicy.Parse(p)
	if err != nil {
		t.Fatal(err)
	}
	return pol
}

// dial connects from inside ns.
func dial(ns *os.File, addr string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := netns.Do(ns, func() (err error) {
		c, err = net.DialTimeout("tcp4", addr, timeout)
		return
	})
	return c, err
}

// echo serves ln: every connection gets back what it sends.
func echo(ln net.Listener) {
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
}

func mustReach(t *testing.T, ns *os.File, addr string) net.Conn {
	t.Helper()
	c, err := dial(ns, addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v, want it allowed", addr, err)
	}
	roundTrip(t, c)
	return c
}

func roundTrip(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatalf("write to %s: %v", c.RemoteAddr(), err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo from %s: %q, %v", c.RemoteAddr(), buf, err)
	}
}

// mustNotReach checks a connection is refused at once (a reset from the
// firewall), not left hanging.
func mustNotReach(t *testing.T, ns *os.File, addr string) {
	t.Helper()
	start := time.Now()
	c, err := dial(ns, addr, 3*time.Second)
	if err == nil {
		c.Close()
		t.Fatalf("dial %s: connected, want refused", addr)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.EHOSTUNREACH) {
		t.Fatalf("dial %s: %v (after %v), want refused at once", addr, err, time.Since(start))
	}
}

func TestEgress(t *testing.T) {
	m := newManager(t, netpolicy.Fence{})
	fi := fakenet.New(t)
	for _, a := range []string{"203.0.113.10:80", "203.0.113.10:81", "203.0.113.11:80"} {
		echo(fi.Listen(a))
	}
	private := fi.Route("10.99.0.5/32")
	echo(fi.Listen(private.String() + ":80"))
	metadata := fi.Route("169.254.169.254/32")
	echo(fi.Listen(metadata.String() + ":80"))

	ns := sandboxNS(t)
	ctx := context.Background()
	addr, err := m.Attach(ctx, "sbx-a", ns, policy(t, api.NetworkPolicy{Allow: []string{"203.0.113.10:80"}}), netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	if !m.cfg.Pool.Contains(addr) {
		t.Fatalf("address %s outside the pool %s", addr, m.cfg.Pool)
	}

	t.Run("allowlist", func(t *testing.T) {
		mustReach(t, ns, "203.0.113.10:80").Close()
		mustNotReach(t, ns, "203.0.113.10:81")
		mustNotReach(t, ns, "203.0.113.11:80")
	})
	var held net.Conn
	t.Run("open", func(t *testing.T) {
		if err := m.Update("sbx-a", policy(t, api.NetworkPolicy{Mode: "open"})); err != nil {
			t.Fatal(err)
		}
		mustReach(t, ns, "203.0.113.11:80").Close()
		held = mustReach(t, ns, "203.0.113.10:81")
		for _, a := range []string{private.String() + ":80", metadata.String() + ":80", "192.0.0.10:80"} {
			mustNotReach(t, ns, a)
		}
	})
	t.Run("a policy change cuts open connections it refuses", func(t *testing.T) {
		if held == nil {
			t.Skip("no connection from the open policy")
		}
		defer held.Close()
		if err := m.Update("sbx-a", policy(t, api.NetworkPolicy{Allow: []string{"203.0.113.10:80"}})); err != nil {
			t.Fatal(err)
		}
		held.SetDeadline(time.Now().Add(5 * time.Second))
		held.Write([]byte("ping"))
		buf := make([]byte, 4)
		if _, err := io.ReadFull(held, buf); err == nil {
			t.Fatal("a connection the new policy refuses still carries data")
		}
	})
	t.Run("counted", func(t *testing.T) {
		_, conns, _ := m.Status("sbx-a")
		if conns < 6 {
			t.Errorf("denied connections = %d, want at least 6", conns)
		}
	})
	t.Run("spoofed source", func(t *testing.T) {
		// The test's stand-in holds CAP_NET_ADMIN (a sandbox does not):
		// even so, a second address gets nothing out.
		spoof := m.addr(200)
		nsName := strings.TrimPrefix(ns.Name(), "/run/netns/")
		if out, err := exec.Command("ip", "-n", nsName, "addr", "add", spoof.String()+"/32", "dev", sandboxIf).CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		var err error
		netns.Do(ns, func() error {
			d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: spoof.AsSlice()}}
			var c net.Conn
			if c, err = d.Dial("tcp4", "203.0.113.10:80"); err == nil {
				c.Close()
			}
			return nil
		})
		if err == nil {
			t.Fatal("a connection from a spoofed source address got out")
		}
	})
	t.Run("other sandboxes and the host", func(t *testing.T) {
		ns2 := sandboxNS(t)
		addr2, err := m.Attach(ctx, "sbx-b", ns2, policy(t, api.NetworkPolicy{Mode: "open"}), netip.Addr{})
		if err != nil {
			t.Fatal(err)
		}
		var ln net.Listener
		netns.Do(ns2, func() (err error) { ln, err = net.Listen("tcp4", ":7000"); return })
		defer ln.Close()
		echo(ln)
		mustNotReach(t, ns, addr2.String()+":7000")
		// The host itself, at the gateway address, on a port no proxy has.
		host, err := net.Listen("tcp4", "0.0.0.0:0")
		if err != nil {
			t.Fatal(err)
		}
		defer host.Close()
		echo(host)
		port := host.Addr().(*net.TCPAddr).Port
		if c, err := dial(ns2, fmt.Sprintf("%s:%d", Gateway, port), time.Second); err == nil {
			c.Close()
			t.Fatal("a sandbox reached a host port on the gateway")
		}
		if err := m.Detach("sbx-b"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("detach", func(t *testing.T) {
		if err := m.Detach("sbx-a"); err != nil {
			t.Fatal(err)
		}
		if c, err := dial(ns, "203.0.113.10:80", time.Second); err == nil {
			c.Close()
			t.Fatal("reached the internet after detach")
		}
		if ends, _ := hostEnds(m.ifPrefix()); len(ends) != 0 {
			t.Errorf("veths left after detach: %v", ends)
		}
	})
}

func TestNameAndPoolLocked(t *testing.T) {
	m := newManager(t, netpolicy.Fence{})
	_, err := New(context.Background(), Config{Name: m.cfg.Name, Pool: netip.MustParsePrefix("10.213.99.0/24")})
	if err == nil || !strings.Contains(err.Error(), "in use") {
		t.Errorf("second manager with the same name: %v, want in use", err)
	}
	_, err = New(context.Background(), Config{Name: "other1", Pool: m.cfg.Pool})
	if err == nil || !strings.Contains(err.Error(), "in use") {
		t.Errorf("second manager with the same pool: %v, want in use", err)
	}
}

// TestFenceExempt checks the operator's exemption reaches a private host,
// and so that the denials above are the fence's, not a missing route.
func TestFenceExempt(t *testing.T) {
	m := newManager(t, netpolicy.Fence{
		Exempt: []netip.Prefix{netip.MustParsePrefix("10.99.0.0/16")},
		Extra:  []netip.Prefix{netip.MustParsePrefix("203.0.113.12/32")},
	})
	fi := fakenet.New(t)
	private := fi.Route("10.99.0.5/32")
	echo(fi.Listen(private.String() + ":80"))
	echo(fi.Listen("203.0.113.12:80"))
	ns := sandboxNS(t)
	if _, err := m.Attach(context.Background(), "sbx-x", ns, policy(t, api.NetworkPolicy{Mode: "open"}), netip.Addr{}); err != nil {
		t.Fatal(err)
	}
	mustReach(t, ns, private.String()+":80").Close()
	mustNotReach(t, ns, "203.0.113.12:80")
}

// dialUDP sends a datagram from inside ns to addr and waits for an echo.
func udpEcho(ns *os.File, addr string) error {
	return netns.Do(ns, func() error {
		c, err := net.Dial("udp4", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Write([]byte("ping")); err != nil {
			return err
		}
		buf := make([]byte, 16)
		_, err = c.Read(buf)
		return err
	})
}

func udpEchoServer(pc net.PacketConn) {
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:n], from)
		}
	}()
}

// TestEgressResolversAndLearned: DNS, DoT and DoH go nowhere but the
// node's proxy whatever the policy; addresses an allowed name resolved to
// are reachable on every port but QUIC (which the Host/SNI proxy cannot
// check).
func TestEgressResolversAndLearned(t *testing.T) {
	m := newManager(t, netpolicy.Fence{}, func(c *Config) { c.DoH = []netip.Addr{netip.MustParseAddr("203.0.113.20")} })
	fi := fakenet.New(t)
	udpEchoServer(fi.ListenPacket("203.0.113.53:53"))
	echo(fi.Listen("203.0.113.53:53"))
	echo(fi.Listen("203.0.113.53:853"))
	echo(fi.Listen("203.0.113.20:443"))
	echo(fi.Listen("203.0.113.20:80"))
	udpEchoServer(fi.ListenPacket("203.0.113.30:443"))
	udpEchoServer(fi.ListenPacket("203.0.113.30:5000"))
	echo(fi.Listen("203.0.113.30:22"))

	ns := sandboxNS(t)
	ctx := context.Background()
	addr, err := m.Attach(ctx, "sbx-r", ns, policy(t, api.NetworkPolicy{Mode: "open"}), netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	if err := udpEcho(ns, "203.0.113.53:53"); err == nil {
		t.Error("DNS over UDP to another resolver answered")
	}
	mustNotReach(t, ns, "203.0.113.53:53")
	mustNotReach(t, ns, "203.0.113.53:853")
	mustNotReach(t, ns, "203.0.113.20:443")
	mustReach(t, ns, "203.0.113.20:80").Close()

	if err := m.Update("sbx-r", policy(t, api.NetworkPolicy{Allow: []string{"pypi.org"}})); err != nil {
		t.Fatal(err)
	}
	mustNotReach(t, ns, "203.0.113.30:22")
	sb := m.Lookup(addr)
	if sb == nil {
		t.Fatal("the sandbox is not found by its address")
	}
	if !sb.Learn("pypi.org", netip.MustParseAddr("203.0.113.30"), time.Minute) {
		t.Fatal("not learned")
	}
	mustReach(t, ns, "203.0.113.30:22").Close()
	if err := udpEcho(ns, "203.0.113.30:5000"); err != nil {
		t.Errorf("UDP to a learned address: %v", err)
	}
	if err := udpEcho(ns, "203.0.113.30:443"); err == nil {
		t.Error("QUIC to a learned address answered")
	}
	// A policy that drops the name forgets its addresses.
	if err := m.Update("sbx-r", policy(t, api.NetworkPolicy{Allow: []string{"github.com"}})); err != nil {
		t.Fatal(err)
	}
	mustNotReach(t, ns, "203.0.113.30:22")
}

// TestAnswersSurviveRestart: a restarted agent keeps letting a sandbox
// reach what its names resolved to, also on connections already open.
func TestAnswersSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	m := newManager(t, netpolicy.Fence{}, func(c *Config) { c.StateDir = dir })
	fi := fakenet.New(t)
	echo(fi.Listen("203.0.113.30:22"))
	ns := sandboxNS(t)
	ctx := context.Background()
	pol := policy(t, api.NetworkPolicy{Allow: []string{"pypi.org"}})
	addr, err := m.Attach(ctx, "sbx-s", ns, pol, netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	m.Lookup(addr).Learn("pypi.org", netip.MustParseAddr("203.0.113.30"), time.Hour)
	held := mustReach(t, ns, "203.0.113.30:22")
	defer held.Close()
	echo(fi.Listen("203.0.113.31:22"))
	private := fi.Route("10.99.0.5/32")
	echo(fi.Listen(private.String() + ":22"))

	cfg := m.Config()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	// No agent: the sandbox keeps its policy, not an open door.
	roundTrip(t, held)
	mustNotReach(t, ns, "203.0.113.31:22")
	mustNotReach(t, ns, private.String()+":22")
	m2, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Teardown()
	if _, err := m2.Adopt(ctx, "sbx-s", func() (*os.File, error) { return nil, errors.New("the veth should still be there") }, pol, addr); err != nil {
		t.Fatal(err)
	}
	roundTrip(t, held)
	mustReach(t, ns, "203.0.113.30:22").Close()
	if !m2.Lookup(addr).Resolved("pypi.org", netip.MustParseAddr("203.0.113.30")) {
		t.Error("the restarted manager forgot what pypi.org resolved to (the SNI proxy would refuse it)")
	}
}
