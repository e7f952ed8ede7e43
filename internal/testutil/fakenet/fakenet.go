// Package fakenet is a fake internet for tests that cross a network: a
// network namespace the test makes, holding hosts on 203.0.113.0/24
// (TEST-NET-3) and whatever else the test routes into it, with this
// host's routes checked before the first packet, and a resolver.
package fakenet

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/netns"
	"github.com/warrenhq/warren/internal/testutil"
)

// InternetPrefix is the fake internet's address range: TEST-NET-3, never
// routed on the real internet.
var InternetPrefix = netip.MustParsePrefix("203.0.113.0/24")

// Internet is a network namespace the test made, holding hosts on
// InternetPrefix, with this host's route to InternetPrefix pointing into
// it (checked before NewFakeInternet returns): traffic to those addresses
// never leaves the machine. One exists on the host at a time (tests in
// other packages wait for the lock): the route is host-wide.
type Internet struct {
	t      testing.TB
	Name   string // the namespace's name (ip netns)
	hostIf string
	ns     *os.File
}

// New makes the namespace and the route; cleanup removes both.
func New(t testing.TB) *Internet {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequireBinary(t, "ip")
	lock, err := os.OpenFile("/run/warren-test-fakeinternet.lock", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lock.Close() })

	b := make([]byte, 3)
	rand.Read(b)
	tag := hex.EncodeToString(b)
	fi := &Internet{t: t, Name: "wfi" + tag, hostIf: "wfi" + tag}
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	// A stale route from a test killed mid-way would send our packets to
	// a namespace that no longer exists: replace it.
	exec.Command("ip", "route", "del", InternetPrefix.String()).Run()
	ip("netns", "add", fi.Name)
	t.Cleanup(func() {
		exec.Command("ip", "route", "del", InternetPrefix.String(), "dev", fi.hostIf).Run()
		exec.Command("ip", "link", "del", fi.hostIf).Run()
		exec.Command("ip", "netns", "del", fi.Name).Run()
	})
	ip("link", "add", fi.hostIf, "type", "veth", "peer", "name", "up0", "netns", fi.Name)
	ip("addr", "add", "192.0.0.9/30", "dev", fi.hostIf)
	ip("link", "set", fi.hostIf, "up")
	ip("-n", fi.Name, "addr", "add", "192.0.0.10/30", "dev", "up0")
	ip("-n", fi.Name, "link", "set", "up0", "up")
	ip("-n", fi.Name, "link", "set", "lo", "up")
	ip("-n", fi.Name, "route", "add", "default", "via", "192.0.0.9")
	ip("route", "add", InternetPrefix.String(), "via", "192.0.0.10", "dev", fi.hostIf)
	// The check before the first packet: the host routes the whole range
	// into the namespace, nowhere else.
	for _, probe := range []string{"203.0.113.1", "203.0.113.254"} {
		out, err := exec.Command("ip", "route", "get", probe).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "dev "+fi.hostIf+" ") {
			t.Fatalf("the route to %s does not go into the fake internet (dev %s): %s %v", probe, fi.hostIf, out, err)
		}
	}
	fi.ns, err = os.Open("/run/netns/" + fi.Name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fi.ns.Close() })
	return fi
}

// Host gives the fake internet the address a (in InternetPrefix).
func (fi *Internet) Host(a string) netip.Addr {
	fi.t.Helper()
	addr := netip.MustParseAddr(a)
	if !InternetPrefix.Contains(addr) {
		fi.t.Fatalf("%s is not in the fake internet %s", a, InternetPrefix)
	}
	out, err := exec.Command("ip", "-n", fi.Name, "addr", "add", addr.String()+"/32", "dev", "lo").CombinedOutput()
	if err != nil && !strings.Contains(string(out), "File exists") && !strings.Contains(string(out), "already assigned") {
		fi.t.Fatalf("ip addr add %s: %v: %s", a, err, out)
	}
	return addr
}

// Route sends this host's traffic for prefix p (outside InternetPrefix:
// a private or link-local range, to test that sandboxes cannot reach it)
// into the fake internet too, checked like the main route; its first
// address becomes a host there.
func (fi *Internet) Route(p string) netip.Addr {
	fi.t.Helper()
	pfx := netip.MustParsePrefix(p)
	out, err := exec.Command("ip", "route", "add", pfx.String(), "via", "192.0.0.10", "dev", fi.hostIf).CombinedOutput()
	if err != nil {
		fi.t.Fatalf("ip route add %s: %v: %s", p, err, out)
	}
	fi.t.Cleanup(func() { exec.Command("ip", "route", "del", pfx.String(), "dev", fi.hostIf).Run() })
	a := pfx.Addr()
	if out, err := exec.Command("ip", "route", "get", a.String()).CombinedOutput(); err != nil || !strings.Contains(string(out), "dev "+fi.hostIf+" ") {
		fi.t.Fatalf("the route to %s does not go into the fake internet: %s %v", a, out, err)
	}
	if out, err := exec.Command("ip", "-n", fi.Name, "addr", "add", a.String()+"/32", "dev", "lo").CombinedOutput(); err != nil {
		fi.t.Fatalf("ip addr add %s: %v: %s", a, err, out)
	}
	return a
}

// Listen opens a TCP listener inside the fake internet at addr
// ("203.0.113.10:80"), giving the namespace the address first.
func (fi *Internet) Listen(addr string) net.Listener {
	fi.t.Helper()
	ap := netip.MustParseAddrPort(addr)
	if InternetPrefix.Contains(ap.Addr()) {
		fi.Host(ap.Addr().String())
	}
	var ln net.Listener
	fi.in(func() (err error) { ln, err = net.Listen("tcp4", addr); return })
	fi.t.Cleanup(func() { ln.Close() })
	return ln
}

// ListenPacket opens a UDP socket inside the fake internet at addr.
func (fi *Internet) ListenPacket(addr string) net.PacketConn {
	fi.t.Helper()
	ap := netip.MustParseAddrPort(addr)
	fi.Host(ap.Addr().String())
	var pc net.PacketConn
	fi.in(func() (err error) { pc, err = net.ListenPacket("udp4", addr); return })
	fi.t.Cleanup(func() { pc.Close() })
	return pc
}

func (fi *Internet) in(fn func() error) {
	fi.t.Helper()
	if err := netns.Do(fi.ns, fn); err != nil {
		fi.t.Fatal(err)
	}
}

// DNS is an authoritative resolver on the fake internet: it answers A
// queries for the names it was given and NXDOMAIN for the rest, and
// remembers every name it was asked.
type DNS struct {
	Addr string // host:port, for --dns-upstream
	mu   sync.Mutex
	seen []string
}

// DNS starts a resolver on UDP and TCP at addr ("203.0.113.53:53") with
// records name -> IPv4 address.
func (fi *Internet) DNS(addr string, records map[string]string) *DNS {
	fi.t.Helper()
	d := &DNS{Addr: addr}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		r := new(dns.Msg)
		r.SetReply(q)
		r.Authoritative = true
		for _, qq := range q.Question {
			name := strings.TrimSuffix(strings.ToLower(qq.Name), ".")
			d.mu.Lock()
			d.seen = append(d.seen, name)
			d.mu.Unlock()
			ip, ok := records[name]
			if !ok {
				r.Rcode = dns.RcodeNameError
				continue
			}
			if qq.Qtype == dns.TypeA {
				r.Answer = append(r.Answer, &dns.A{Hdr: dns.RR_Header{Name: qq.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30}, A: net.ParseIP(ip)})
			}
		}
		w.WriteMsg(r)
	})
	pc := fi.ListenPacket(addr)
	ln := fi.Listen(addr)
	udp, tcp := &dns.Server{PacketConn: pc, Handler: h}, &dns.Server{Listener: ln, Handler: h}
	go udp.ActivateAndServe()
	go tcp.ActivateAndServe()
	fi.t.Cleanup(func() { udp.Shutdown(); tcp.Shutdown() })
	return d
}

// Asked reports whether any query named name.
func (d *DNS) Asked(name string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Contains(d.seen, name)
}
