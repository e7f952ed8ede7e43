package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

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
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
			unix.Unmount(mnt, unix.MNT_DETACH)
		}
	})
	return mnt
}
