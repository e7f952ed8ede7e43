package hostproxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/netpolicy"
	"github.com/warrenhq/warren/internal/testutil"
)

// netns is a named network namespace the test made (ip netns add).
type netns string

func newNetns(t *testing.T, name string) netns {
	t.Helper()
	run(t, "ip", "netns", "add", name)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	return netns(name)
}

func run(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func (n netns) run(t *testing.T, args ...string) string {
	t.Helper()
	return run(t, append([]string{"ip", "netns", "exec", string(n)}, args...)...)
}

// do runs fn on a thread in the namespace: the sockets fn makes live
// there.
func (n netns) do(fn func() error) error {
	runtime.LockOSThread()
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer self.Close()
	f, err := os.Open("/run/netns/" + string(n))
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer f.Close()
	if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	ferr := fn()
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		return err // the thread stays locked, and dies with its goroutine
	}
	runtime.UnlockOSThread()
	return ferr
}

// TestOrigDstRedirect runs the default OrigDst on connections a real
// nftables redirect sent to the proxy: a "node" namespace holds the
// proxy (on 169.254.1.1, the gateway) and a fake internet server on
// 203.0.113.10; a "sandbox" namespace at 10.213.0.2 reaches the node over
// a veth. Every address lives in those two namespaces.
func TestOrigDstRedirect(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireBinary(t, "ip", "nft")
	tag := fmt.Sprintf("%d", os.Getpid()%100000)
	node := newNetns(t, "wpx-node-"+tag)
	sbx := newNetns(t, "wpx-sbx-"+tag)
	run(t, "ip", "link", "add", "wvt"+tag, "netns", string(node), "type", "veth", "peer", "name", "eth0", "netns", string(sbx))
	node.run(t, "ip", "link", "set", "lo", "up")
	node.run(t, "ip", "link", "set", "wvt"+tag, "up")
	node.run(t, "ip", "addr", "add", "169.254.1.1/32", "dev", "wvt"+tag)
	node.run(t, "ip", "addr", "add", "203.0.113.10/32", "dev", "lo")
	node.run(t, "ip", "route", "add", "10.213.0.2/32", "dev", "wvt"+tag)
	sbx.run(t, "ip", "link", "set", "lo", "up")
	sbx.run(t, "ip", "link", "set", "eth0", "up")
	sbx.run(t, "ip", "addr", "add", "10.213.0.2/32", "dev", "eth0")
	sbx.run(t, "ip", "route", "add", "169.254.1.1/32", "dev", "eth0")
	sbx.run(t, "ip", "route", "add", "default", "via", "169.254.1.1", "dev", "eth0", "onlink")
	// The route the first packet takes stays inside the namespaces.
	if r := sbx.run(t, "ip", "route", "get", "203.0.113.10"); !strings.Contains(r, "dev eth0") || !strings.Contains(r, "via 169.254.1.1") {
		t.Fatalf("route to the fake internet: %s", r)
	}

	// In the node: the proxy's listener, the server, the redirect.
	var ln, srvLn net.Listener
	if err := node.do(func() (err error) {
		lc := net.ListenConfig{}
		if ln, err = lc.Listen(context.Background(), "tcp4", "169.254.1.1:0"); err != nil {
			return err
		}
		srvLn, err = lc.Listen(context.Background(), "tcp4", "203.0.113.10:80")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "host=%s from=%s", r.Host, r.RemoteAddr)
	})}
	go srv.Serve(srvLn)
	defer srv.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	rules := fmt.Sprintf(`table ip wpx {
	chain pre {
		type nat hook prerouting priority dstnat;
		iifname "wvt%s" ip daddr 203.0.113.10 tcp dport 80 redirect to :%d
	}
}`, tag, port)
	cmd := exec.Command("ip", "netns", "exec", string(node), "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v: %s", err, out)
	}

	sb := netpolicy.NewSandbox("sb", netip.MustParseAddr("10.213.0.2"), policy(t, allowlist), nil, nil)
	sb.Learn("allowed.example", netip.MustParseAddr("203.0.113.10"), time.Hour)
	var tb netpolicy.Table
	tb.Add(sb)
	got := make(chan netip.AddrPort, 4)
	p, err := New(Config{
		Lookup: tb.Lookup,
		OrigDst: func(c net.Conn) (netip.AddrPort, error) {
			dst, err := OrigDst(c) // the default, recorded
			got <- dst
			return dst, err
		},
		Dial: func(ctx context.Context, network, addr string) (c net.Conn, err error) {
			err = node.do(func() error {
				var d net.Dialer
				c, err = d.DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	go p.ServeHTTP(ln)

	ask := func(host string) (string, error) {
		var c net.Conn
		if err := sbx.do(func() (err error) {
			c, err = net.DialTimeout("tcp4", "203.0.113.10:80", 5*time.Second)
			return err
		}); err != nil {
			return "", err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return fmt.Sprintf("%d %s", resp.StatusCode, b), nil
	}
	out, err := ask("allowed.example")
	if err != nil || !strings.HasPrefix(out, "200 host=allowed.example from=") {
		t.Fatalf("through the redirect: %q, %v", out, err)
	}
	if dst := <-got; dst != netip.MustParseAddrPort("203.0.113.10:80") {
		t.Errorf("SO_ORIGINAL_DST = %s, want 203.0.113.10:80", dst)
	}
	if out, err := ask("evil.example"); err != nil || !strings.HasPrefix(out, "403 ") {
		t.Errorf("fronted through the redirect: %q, %v", out, err)
	}
	<-got

	// A connection that was not redirected has no original destination.
	var direct net.Conn
	if err := sbx.do(func() (err error) {
		direct, err = net.DialTimeout("tcp4", ln.Addr().String(), 5*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	direct.SetDeadline(time.Now().Add(5 * time.Second))
	if b, _ := io.ReadAll(direct); len(b) != 0 {
		t.Errorf("a connection straight to the proxy got %q", b)
	}
	if dst := <-got; dst.IsValid() && dst != netip.MustParseAddrPort(ln.Addr().String()) {
		t.Errorf("not redirected: original destination %s, want none or the proxy's own", dst)
	}
	if c, _ := sb.Denied(); c != 2 {
		t.Errorf("denied %d, want 2 (the fronted request, the direct connection)", c)
	}
}
