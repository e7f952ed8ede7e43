package e2e

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/testutil"
)

// ddInside writes up to 200 MiB to path in sandbox id and returns the
// size written and dd's output.
func ddInside(c *cluster, id, path string) (int64, string) {
	c.T.Helper()
	out, _, _ := c.Run("exec", id, "--sh", "dd if=/dev/zero of="+path+" bs=1M count=200 2>&1; sync; wc -c < "+path)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	n, err := strconv.ParseInt(strings.TrimSpace(lines[len(lines)-1]), 10, 64)
	if err != nil {
		c.T.Fatalf("dd in %s: %q", id, out)
	}
	return n, out
}

// A data dir on btrfs: `warren up` limits each sandbox's writable layer.
func TestUpDiskLimit(t *testing.T) {
	testutil.RequireContainers(t)
	testutil.RequireBinary(t, "go", "btrfs")
	mnt := testutil.BtrfsDir(t, 2<<30)
	c := &cluster{T: t, Bin: warrenBin(t), DataDir: filepath.Join(mnt, "warren"), Addr: freeAddr(t)}
	c.StartWith("--default-disk", "64Mi")
	t.Cleanup(c.CleanupSandboxes)

	var nodes api.NodeList
	if err := json.Unmarshal([]byte(c.MustRun("node", "ls", "-o", "json")), &nodes); err != nil || len(nodes.Nodes) != 1 || nodes.Nodes[0].DiskQuota != api.DiskQuotaBtrfs {
		t.Fatalf("node ls -o json: %+v, %v; want disk_quota btrfs", nodes, err)
	}
	if table := c.MustRun("node", "ls"); !strings.Contains(table, "DISK-QUOTA") || !strings.Contains(table, "btrfs") {
		t.Errorf("node ls:\n%s", table)
	}

	limited := strings.TrimSpace(c.MustRun("sandbox", "create", "--image", "busybox", "--disk", "50Mi"))
	var dflt api.Sandbox
	if err := json.Unmarshal([]byte(c.MustRun("sandbox", "create", "--image", "busybox", "-o", "json")), &dflt); err != nil || dflt.Resources.Disk != 64<<20 {
		t.Fatalf("create without --disk: %+v, %v; want the node's default 64Mi", dflt.Resources, err)
	}
	n, out := ddInside(c, limited, "/root/big")
	if !strings.Contains(out, "Disk quota exceeded") || n < 40<<20 || n > 50<<20 {
		t.Fatalf("dd of 200 MiB with --disk 50Mi: %d bytes:\n%s", n, out)
	}
	if n, out := ddInside(c, dflt.ID, "/root/big"); n < 54<<20 || n > 64<<20 {
		t.Errorf("dd under the 64Mi default: %d bytes:\n%s", n, out)
	}
	if out, err := exec.Command("dd", "if=/dev/zero", "of="+filepath.Join(mnt, "host-file"), "bs=1M", "count=100", "conv=fsync").CombinedOutput(); err != nil {
		t.Errorf("the host cannot write next to full sandboxes: %v: %s", err, out)
	}
	if _, stderr, code := c.Run("sandbox", "create", "--image", "busybox", "--disk", "50Mi", "--disk-inodes", "100"); code != 1 || !strings.Contains(stderr, api.CodeDiskQuotaUnsupported) {
		t.Errorf("--disk-inodes on btrfs: code %d, %q; want %s", code, stderr, api.CodeDiskQuotaUnsupported)
	}
	// The root project shows what its sandboxes' disk limits add up to.
	if out := c.MustRun("project", "ls", "/"); !strings.Contains(out, "114Mi") {
		t.Errorf("project ls / does not show 50Mi+64Mi of disk:\n%s", out)
	}

	// kill -9 and restart: the limit stays with the re-adopted sandbox.
	c.Kill9()
	c.StartWith("--default-disk", "64Mi")
	c.MustRun("exec", limited, "--sh", "rm /root/big")
	if n, out := ddInside(c, limited, "/root/again"); !strings.Contains(out, "Disk quota exceeded") || n < 40<<20 || n > 50<<20 {
		t.Errorf("after a restart: %d bytes:\n%s", n, out)
	}

	c.MustRun("sandbox", "rm", limited, dflt.ID)
	for _, id := range []string{limited, dflt.ID} {
		assertNoTrace(t, c.DataDir, id)
	}
	if out, err := exec.Command("btrfs", "subvolume", "list", mnt).CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("subvolumes left after rm: %v: %s", err, out)
	}
}

// A data dir whose filesystem has no quota: the node says so, and a disk
// limit is refused instead of ignored.
func TestUpDiskUnsupported(t *testing.T) {
	testutil.RequireContainers(t)
	testutil.RequireBinary(t, "go")
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=512m", "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", mnt).Run() })
	bin := warrenBin(t)

	// A default disk limit the node cannot enforce stops `warren up`.
	bad := exec.Command(bin, "up", "--data-dir", filepath.Join(mnt, "bad"), "--listen", freeAddr(t), "--default-disk", "1Gi")
	out, err := bad.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "default disk") || !strings.Contains(string(out), "tmpfs") {
		t.Errorf("up --default-disk on tmpfs: %v:\n%s", err, out)
	}

	c := &cluster{T: t, Bin: bin, DataDir: filepath.Join(mnt, "warren"), Addr: freeAddr(t)}
	c.StartWith()
	t.Cleanup(c.CleanupSandboxes)
	if !strings.Contains(c.Log.String(), "disk limits unavailable") {
		t.Errorf("startup log does not say disk limits are unavailable:\n%s", c.Log)
	}
	var nodes api.NodeList
	if err := json.Unmarshal([]byte(c.MustRun("node", "ls", "-o", "json")), &nodes); err != nil || len(nodes.Nodes) != 1 ||
		nodes.Nodes[0].DiskQuota != api.DiskQuotaNone || !strings.Contains(strings.Join(nodes.Nodes[0].Problems, ";"), "tmpfs") {
		t.Fatalf("node ls -o json: %+v, %v; want disk_quota none and a problem naming tmpfs", nodes, err)
	}
	_, stderr, code := c.Run("sandbox", "create", "--image", "busybox", "--disk", "50Mi")
	if code != 1 || !strings.Contains(stderr, api.CodeDiskQuotaUnsupported) || !strings.Contains(stderr, "tmpfs") {
		t.Errorf("create --disk on tmpfs: code %d, %q; want %s saying why", code, stderr, api.CodeDiskQuotaUnsupported)
	}
	if ids := c.MustRun("sandbox", "ls", "-o", "id"); strings.TrimSpace(ids) != "" {
		t.Errorf("a refused create left sandboxes: %s", ids)
	}
	c.MustRun("sandbox", "create", "--image", "busybox") // no disk: fine
}
