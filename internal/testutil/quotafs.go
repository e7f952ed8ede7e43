package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BtrfsDir mounts a fresh btrfs filesystem of size bytes (at least 128 MiB
// are needed by mkfs.btrfs) from a loop image under t.TempDir and returns
// its mount point; cleanup unmounts it. It needs root and mkfs.btrfs
// (btrfs-progs, which scripts/setup installs).
func BtrfsDir(t testing.TB, size int64) string {
	t.Helper()
	RequireRoot(t)
	RequireBinary(t, "mkfs.btrfs", "mount")
	RequireKernelFeature(t, "btrfs")
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "btrfs.img"), filepath.Join(dir, "mnt")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.btrfs", "-q", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.btrfs: %v: %s", err, out)
	}
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount btrfs image: %v: %s", err, out)
	}
	t.Cleanup(func() { unmountTree(t, mnt) })
	return mnt
}

// unmountTree unmounts mnt after whatever is still mounted below it (a
// node's shared layer mounts outlive its sandboxes), retrying for a few
// seconds while a process that held it open (a warren just stopped) ends.
func unmountTree(t testing.TB, mnt string) {
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		subs := mountsBelow(mnt)
		for i := len(subs) - 1; i >= 0; i-- {
			unix.Unmount(subs[i], unix.MNT_DETACH)
		}
		if err = unix.Unmount(mnt, 0); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Errorf("unmount %s: %v", mnt, err)
		unix.Unmount(mnt, unix.MNT_DETACH)
	}
}

// mountsBelow lists the mount points strictly below dir, in mount order.
func mountsBelow(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			out = append(out, f[4])
		}
	}
	return out
}

// ProjectQuotaDir mounts a fresh xfs or ext4 filesystem (fstype) of size
// bytes with project quotas on (mount -o loop,prjquota) and returns its
// mount point; cleanup unmounts it. Where the kernel cannot (no XFS quota,
// no ext4 quota format: these development and CI machines), it skips
// saying exactly why, even under WARREN_TEST_STRICT: that is a fact of the
// host's kernel, not a missing install step.
func ProjectQuotaDir(t testing.TB, fstype string, size int64) string {
	t.Helper()
	RequireRoot(t)
	mkfs := map[string][]string{
		"xfs":  {"mkfs.xfs", "-q", "-f"},
		"ext4": {"mkfs.ext4", "-q", "-F", "-O", "quota,project", "-I", "256"},
	}[fstype]
	if mkfs == nil {
		t.Fatalf("ProjectQuotaDir: fstype %q: want xfs or ext4", fstype)
	}
	RequireBinary(t, mkfs[0], "mount")
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, fstype+".img"), filepath.Join(dir, "mnt")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(mkfs[0], append(mkfs[1:], img)...).CombinedOutput(); err != nil {
		t.Skipf("%s cannot make a %s image with project quotas here: %v: %s", mkfs[0], fstype, err, out)
	}
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-o", "loop,prjquota", img, mnt).CombinedOutput(); err != nil {
		t.Skipf("this kernel cannot mount %s with project quotas (mount -o loop,prjquota: %v: %s); the %s quota path runs where it can",
			fstype, err, strings.TrimSpace(string(out)), fstype)
	}
	t.Cleanup(func() { unmountTree(t, mnt) })
	return mnt
}
