package image_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/store"
	"github.com/warrenhq/warren/internal/testutil"
)

func requireBusybox(t *testing.T) {
	t.Helper()
	testutil.RequireBinary(t, "busybox", "mkfs.erofs")
}

func TestBuildBusyboxRootfs(t *testing.T) {
	requireBusybox(t)
	root := filepath.Join(t.TempDir(), "rootfs")
	must(t, image.BuildBusyboxRootfs(root))

	links := map[string]string{
		"bin/sh":        "busybox",
		"usr/bin/env":   "../../bin/busybox",
		"sbin/ifconfig": "../bin/busybox",
	}
	for link, want := range links {
		if got, err := os.Readlink(filepath.Join(root, link)); err != nil || got != want {
			t.Errorf("%s: got link %q, %v; want %q", link, got, err, want)
		}
	}
	if fi, err := os.Stat(filepath.Join(root, "tmp")); err != nil || fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Errorf("tmp: got %v, %v; want drwxrwxrwt", fi.Mode(), err)
	}
	for _, d := range []string{"proc", "sys", "dev", "root", "usr/local/bin", "run"} {
		if fi, err := os.Stat(filepath.Join(root, d)); err != nil || !fi.IsDir() {
			t.Errorf("%s: want a directory (%v)", d, err)
		}
	}
	passwd, _ := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if !strings.HasPrefix(string(passwd), "root:x:0:0:root:/root:/bin/sh\n") || !strings.Contains(string(passwd), "nobody:x:65534:65534:") {
		t.Errorf("etc/passwd: got %q", passwd)
	}
	if _, err := os.Stat(filepath.Join(root, "linuxrc")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("linuxrc: got %v, want no such file", err)
	}

	if err := image.BuildBusyboxRootfs(root); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("BuildBusyboxRootfs on a non-empty dir: got %v, want ErrInvalid", err)
	}
}

// TestBusyboxRootfsRuns chroots into the rootfs to check that the shell
// and applets at their usual paths work.
func TestBusyboxRootfsRuns(t *testing.T) {
	requireBusybox(t)
	testutil.RequireRoot(t)
	root := filepath.Join(t.TempDir(), "rootfs")
	must(t, image.BuildBusyboxRootfs(root))
	cmd := exec.Command("/bin/sh", "-c", "/usr/bin/env echo ok && id -un && test -w /tmp")
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/bin:/sbin:/usr/bin:/usr/sbin"}
	out, err := cmd.CombinedOutput()
	if err != nil || string(out) != "ok\nroot\n" {
		t.Fatalf("in chroot: got %q, %v; want ok and root", out, err)
	}
}

func TestBusyboxImageReproducible(t *testing.T) {
	requireBusybox(t)
	ts, err := image.BusyboxTimestamp()
	must(t, err)
	var sums [2][sha256.Size]byte
	for i := range sums {
		dir := t.TempDir()
		root := filepath.Join(dir, "rootfs")
		must(t, image.BuildBusyboxRootfs(root))
		img := filepath.Join(dir, "busybox.erofs")
		must(t, image.BuildEROFS(context.Background(), root, img, image.WithTimestamp(ts), image.WithAllRoot()))
		b, err := os.ReadFile(img)
		must(t, err)
		sums[i] = sha256.Sum256(b)
	}
	if sums[0] != sums[1] {
		t.Fatalf("two busybox images differ: %x vs %x", sums[0], sums[1])
	}
}

// TestBusyboxImageMounts mounts the registered busybox layer and checks
// what a sandbox will see.
func TestBusyboxImageMounts(t *testing.T) {
	requireBusybox(t)
	testutil.RequireRoot(t)
	ctx := context.Background()
	bs := newBlobs(t)
	img, err := image.NewRegistry(store.Memory(), bs).EnsureBusybox(ctx, t.TempDir())
	must(t, err)
	layer, err := image.NewCache(t.TempDir(), bs).Fetch(ctx, img.Layers[0])
	must(t, err)
	mnt := mountEROFS(t, layer.Path)

	if got, err := os.Readlink(filepath.Join(mnt, "bin/sh")); err != nil || got != "busybox" {
		t.Errorf("bin/sh: got %q, %v", got, err)
	}
	fi, err := os.Stat(filepath.Join(mnt, "tmp"))
	if err != nil || fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Errorf("tmp: got %v, %v; want drwxrwxrwt", fi.Mode(), err)
	}
	fi, err = os.Stat(filepath.Join(mnt, "bin/busybox"))
	if err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("bin/busybox: %v, %v", fi.Mode(), err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 0 || st.Gid != 0 {
		t.Errorf("bin/busybox owner: got %d:%d, want 0:0", st.Uid, st.Gid)
	}
	cmd := exec.Command("/bin/sh", "-c", "echo hi | wc -c")
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: mnt}
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/bin:/usr/bin"}
	if out, err := cmd.CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "3" {
		t.Errorf("sh in the mounted image: got %q, %v", out, err)
	}
}
