package e2e

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/testutil"
)

// gVisor through `warren up` and the CLI: node ls says the node runs it,
// `sandbox create --runtime gvisor` makes a sandbox on gVisor's kernel,
// `sandbox get` says so, its forks run under gVisor too, and what it
// cannot have (a network, its ports) is refused up front.
func TestUpGVisor(t *testing.T) {
	testutil.RequireContainers(t)
	testutil.RequireBinary(t, "go")
	c := startUp(t)

	var nodes api.NodeList
	mustJSON(t, c.MustRun("node", "ls", "-o", "json"), &nodes)
	if len(nodes.Nodes) != 1 {
		t.Fatalf("node ls: %+v", nodes)
	}
	if ok, why := nodes.Nodes[0].RunsRuntime(api.BackendContainer, api.RuntimeGVisor); !ok {
		testutil.Unavailable(t, "gVisor cannot run here: %s", why)
	}
	if out := c.MustRun("node", "ls"); !strings.Contains(out, "container+gvisor") {
		t.Errorf("node ls does not show container+gvisor:\n%s", out)
	}

	id := strings.TrimSpace(c.MustRun("sandbox", "create", "--image", "busybox", "--runtime", "gvisor"))
	if out := c.MustRun("exec", id, "--", "dmesg"); !strings.Contains(out, "gVisor") {
		t.Errorf("dmesg in a gvisor sandbox: %q", out)
	}
	if out := c.MustRun("sandbox", "get", id); !strings.Contains(out, "Runtime:") || !strings.Contains(out, "gvisor") {
		t.Errorf("sandbox get:\n%s", out)
	}
	if _, stderr, code := c.Run("sandbox", "create", "--image", "busybox", "--runtime", "gvisor", "--network", "open"); code == 0 ||
		!strings.Contains(stderr, "network must be none") {
		t.Errorf("a networked gvisor create: exit %d, %q; want refused", code, stderr)
	}
	req, _ := http.NewRequest("GET", "http://"+c.Addr+"/v1/sandboxes/"+id+"/ports/80/", nil)
	req.Header.Set("Authorization", "Bearer "+c.Token())
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Errorf("a port of a gvisor sandbox: %v", err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), api.CodeNotSupported) {
			t.Errorf("a port of a gvisor sandbox: %d %s, want 400 not_supported", resp.StatusCode, b)
		}
	}

	c.MustRun("exec", id, "--sh", "echo parent > /from-parent")
	var fork api.ForkResponse
	mustJSON(t, c.MustRun("sandbox", "fork", id, "--count", "2", "-o", "json"), &fork)
	if len(fork.Sandboxes) != 2 {
		t.Fatalf("fork: %+v", fork)
	}
	for _, sb := range fork.Sandboxes {
		if sb.Runtime != api.RuntimeGVisor {
			t.Errorf("branch %s runs under %q, want gvisor", sb.ID, sb.Runtime)
		}
		if out := c.MustRun("exec", sb.ID, "--sh", "cat /from-parent; dmesg | grep -c gVisor"); !strings.HasPrefix(out, "parent\n") || out == "parent\n0\n" {
			t.Errorf("branch %s: %q, want the parent's file on gVisor", sb.ID, out)
		}
	}
}
