package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/testutil"
)

// The cases through the CLI and `warren up`: an exec longer than
// the idle timeout runs to its end; a TTL that ran out while warren was
// down ends the sandbox at restart; `sandbox rm --all` asks nothing; and
// `--stop-sandboxes` leaves nothing behind, telling the exec it cut short.
func TestUpSandboxLifecycle(t *testing.T) {
	testutil.RequireContainers(t)
	testutil.RequireBinary(t, "go")
	c := startUpWith(t, "--stop-sandboxes", "--no-fn")

	idle := strings.TrimSpace(c.MustRun("sandbox", "create", "--image", "busybox", "--idle-timeout", "2s"))
	if _, stderr, code := c.Run("exec", idle, "--", "sleep", "6"); code != 0 {
		t.Fatalf("exec sleep 6 with --idle-timeout 2s: exit %d, stderr %q; want 0", code, stderr)
	}
	if _, stderr, code := c.Run("exec", idle, "--", "true"); code != 0 {
		t.Errorf("exec right after: exit %d, %q; want the sandbox still there", code, stderr)
	}

	// A TTL that runs out while warren is down.
	short := strings.TrimSpace(c.MustRun("sandbox", "create", "--image", "busybox", "--ttl", "3s"))
	c.Kill9()
	time.Sleep(3 * time.Second)
	c.Start()
	if _, stderr, code := c.Run("sandbox", "get", short); code != 1 || !strings.Contains(stderr, "sandbox_not_found") {
		t.Errorf("sandbox whose ttl ran out while down: exit %d, %q; want sandbox_not_found", code, stderr)
	}
	if !strings.Contains(c.Log.String(), "ttl expired while the agent was down") {
		t.Errorf("the restart log does not say it ended the expired sandbox")
	}

	a := strings.TrimSpace(c.MustRun("sandbox", "create", "--image", "busybox", "--label", "job=a"))
	b := strings.TrimSpace(c.MustRun("sandbox", "create", "--image", "busybox", "--label", "job=b"))
	if out := c.MustRun("sandbox", "rm", "--all", "--label", "job=a"); out != a+"\n" {
		t.Errorf("rm --all --label job=a printed %q, want %q", out, a)
	}
	if _, _, code := c.Run("sandbox", "get", b); code != 0 {
		t.Errorf("rm --all --label job=a removed job=b too")
	}

	// --stop-sandboxes: the exec in flight hears why, nothing is left.
	res := make(chan string, 1)
	go func() {
		_, stderr, code := c.Run("exec", b, "--", "sleep", "60")
		res <- fmt.Sprintf("exit %d: %s", code, stderr)
	}()
	time.Sleep(time.Second)
	c.Stop()
	select {
	case got := <-res:
		if !strings.Contains(got, "sandbox_gone") || !strings.Contains(got, "node shutting down") {
			t.Errorf("exec cut short by the stop: %q; want sandbox_gone, node shutting down", got)
		}
	case <-time.After(20 * time.Second):
		t.Error("the exec did not end with warren")
	}
	nodeDir := filepath.Join(c.DataDir, "node")
	for _, d := range []string{"sandboxes", "runc", filepath.Join("container", "sandboxes")} {
		if entries, _ := os.ReadDir(filepath.Join(nodeDir, d)); len(entries) != 0 {
			t.Errorf("%s left after --stop-sandboxes: %d entries", d, len(entries))
		}
	}
}
