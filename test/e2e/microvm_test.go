package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend/microvm"
	"github.com/warrenhq/warren/internal/testutil"
)

// TestUpMicroVM drives microVM sandboxes through `warren up` and the CLI:
// node ls names the accelerator; create, exec, cp, pause and a resume by
// exec; and snapshots that cross backends: a microVM's snapshot starts a
// container and a container's starts a microVM.
func TestUpMicroVM(t *testing.T) {
	testutil.RequireContainers(t)
	testutil.RequireQEMU(t)
	if k := os.Getenv(testutil.GuestKernelEnv); k == "" {
		if _, err := os.Stat(microvm.DefaultKernel()); err != nil {
			testutil.Unavailable(t, "needs a guest kernel (scripts/fetch-guest-kernel): %v", err)
		}
	}
	c := startUp(t)
	var nodes api.NodeList
	mustJSON(t, c.MustRun("node", "ls", "-o", "json"), &nodes)
	n := nodes.Nodes[0]
	var accel string
	for _, m := range n.Machines {
		if m.Backend == "microvm" {
			accel = m.Accel
		}
	}
	if accel != "kvm" && accel != "tcg" {
		t.Fatalf("node ls: backends %v, machines %+v, problems %v", n.Backends, n.Machines, n.Problems)
	}
	if out := c.MustRun("node", "ls"); !strings.Contains(out, "microvm("+accel+")") {
		t.Errorf("node ls does not name the accelerator:\n%s", out)
	}

	vm := strings.TrimSpace(c.MustRun("sandbox", "create", "--backend", "microvm", "--image", "busybox", "--cpu", "1", "--memory", "256Mi"))
	if out := c.MustRun("exec", vm, "--", "uname", "-r"); strings.TrimSpace(out) == "" || strings.Contains(out, hostRelease(t)) {
		t.Errorf("uname -r in a microVM: %q, want the guest's kernel, not the host's %s", out, hostRelease(t))
	}
	src := filepath.Join(t.TempDir(), "in.txt")
	os.WriteFile(src, []byte("copied in\n"), 0o644)
	c.MustRun("cp", src, vm+":/work/in.txt")
	if out := c.MustRun("exec", vm, "--sh", "cat /work/in.txt && echo from-vm > /work/made"); out != "copied in\n" {
		t.Errorf("cp into a microVM: %q", out)
	}

	// Pause: the machine is saved and gone; an exec resumes it.
	if out := c.MustRun("sandbox", "pause", vm); !strings.Contains(out, "QEMU ended") {
		t.Errorf("sandbox pause: %q", out)
	}
	if out := c.MustRun("exec", vm, "--sh", "cat /work/made"); out != "from-vm\n" {
		t.Errorf("exec after pause: %q", out)
	}

	// A microVM's snapshot, as a container.
	c.MustRun("sandbox", "snapshot", vm, "--name", "vm-built", "--version", "1")
	ctr := strings.TrimSpace(c.MustRun("sandbox", "create", "--image", "vm-built@1"))
	if out := c.MustRun("exec", ctr, "--sh", "cat /work/made /work/in.txt"); out != "from-vm\ncopied in\n" {
		t.Errorf("a container from a microVM's snapshot sees %q", out)
	}
	// A container's snapshot, as a microVM.
	c.MustRun("exec", ctr, "--sh", "echo from-container > /work/made2")
	c.MustRun("sandbox", "snapshot", ctr, "--name", "ctr-built", "--version", "1")
	vm2 := strings.TrimSpace(c.MustRun("sandbox", "create", "--backend", "microvm", "--image", "ctr-built@1"))
	if out := c.MustRun("exec", vm2, "--sh", "cat /work/made /work/made2"); out != "from-vm\nfrom-container\n" {
		t.Errorf("a microVM from a container's snapshot sees %q", out)
	}
	c.MustRun("sandbox", "rm", vm, vm2, ctr)
}

func hostRelease(t *testing.T) string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}
