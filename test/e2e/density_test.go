package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/testutil"
)

// TestUpInUse: what a node reports its sandboxes using is measured, not
// asked for: a best-effort sandbox burning a core shows as best-effort
// CPU in `node ls -o json` (in_use), its class in the counts (qos), and a
// latency create is still admitted beside it.
func TestUpInUse(t *testing.T) {
	testutil.RequireContainers(t)
	c := startUp(t)
	sb := strings.TrimSpace(c.MustRun("sandbox", "create", "--image", "busybox", "--qos", "best-effort", "--cpu", "1"))
	var got api.Sandbox
	mustJSON(t, c.MustRun("sandbox", "get", sb, "-o", "json"), &got)
	if got.QoS != api.QoSBestEffort {
		t.Fatalf("sandbox qos %q", got.QoS)
	}
	c.MustRun("exec", sb, "--sh", "(while :; do :; done) > /dev/null 2>&1 &")
	// Best-effort work gets only what the rest leaves: on a host busy
	// with other tests, less than its core; any measured share will do.
	deadline := time.Now().Add(testutil.Scale(time.Minute))
	var n api.Node
	for {
		var nodes api.NodeList
		mustJSON(t, c.MustRun("node", "ls", "-o", "json"), &nodes)
		n = nodes.Nodes[0]
		if n.InUse != nil && n.InUse.CPUUnmeasured == "" && n.InUse.CPUBestEffort > 0.05 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node in use %+v: want the best-effort sandbox's busy core measured", n.InUse)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if n.QoS == nil || n.QoS.BestEffort != 1 || n.InUse.CPU > n.InUse.CPUBestEffort || n.InUse.Memory <= 0 || n.InUse.MemoryLimit <= n.InUse.Memory {
		t.Errorf("node: qos %+v, in use %+v", n.QoS, n.InUse)
	}
	c.MustRun("sandbox", "create", "--image", "busybox")
}
