package image

import (
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/warrenhq/warren/internal/errdefs"
)

// busyboxCandidates are where Debian's busybox-static installs its binary
// (with and without merged /usr).
var busyboxCandidates = []string{"/bin/busybox", "/usr/bin/busybox"}

// appletDirs are the directories `busybox --list-full` may place applets
// in that the rootfs keeps; anything else (such as /linuxrc) is left out.
var appletDirs = map[string]bool{"bin": true, "sbin": true, "usr/bin": true, "usr/sbin": true}

// findBusybox returns the host's static busybox, or ErrUnavailable.
func findBusybox() (string, error) {
	for _, p := range busyboxCandidates {
		if _, err := os.Stat(p); err == nil {
			return p, checkStatic(p)
		}
	}
	if p, err := exec.LookPath("busybox"); err == nil {
		return p, checkStatic(p)
	}
	return "", errdefs.New(errdefs.ErrUnavailable, "busybox_missing",
		"busybox not found: run scripts/setup (installs busybox-static)")
}

// checkStatic refuses a dynamically linked busybox: copied into a rootfs
// without its libraries it could not run.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return errdefs.New(errdefs.ErrUnavailable, "busybox_missing", "busybox at %s is not an ELF binary: %v", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errdefs.New(errdefs.ErrUnavailable, "busybox_missing",
				"busybox at %s is dynamically linked: run scripts/setup (installs busybox-static)", path)
		}
	}
	return nil
}

// BusyboxTimestamp returns the modification time to build a busybox image
// with (see WithTimestamp): the host busybox's own, so the image is
// reproducible for one busybox package yet carries a plausible date.
func BusyboxTimestamp() (time.Time, error) {
	p, err := findBusybox()
	if err != nil {
		return time.Time{}, err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return time.Time{}, fmt.Errorf("busybox: %w", err)
	}
	return fi.ModTime().Truncate(time.Second), nil
}

// BuildBusyboxRootfs writes a minimal root filesystem into dir, which must
// not exist or be empty: the host's static busybox as /bin/busybox, a
// relative symlink to it for every applet at its usual place (/bin/sh,
// /usr/bin/env, /sbin/ip, ...), /etc/passwd and /etc/group with root and
// nobody, /etc/hosts, an empty /etc/resolv.conf (the network policy fills
// it), /tmp (1777), /root, /usr/local/bin, and the mount points /proc,
// /sys, /dev and /run. The result depends only on the busybox binary.
// ErrUnavailable if the host has no static busybox.
func BuildBusyboxRootfs(dir string) error {
	bb, err := findBusybox()
	if err != nil {
		return err
	}
	if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		return errdefs.Invalid("busybox rootfs: %s is not empty", dir)
	}
	dirs := []struct {
		path string
		mode os.FileMode
	}{
		{".", 0o755}, {"bin", 0o755}, {"sbin", 0o755}, {"usr", 0o755}, {"usr/bin", 0o755},
		{"usr/sbin", 0o755}, {"usr/local", 0o755}, {"usr/local/bin", 0o755}, {"etc", 0o755},
		{"root", 0o700}, {"tmp", os.ModeSticky | 0o777}, {"proc", 0o555}, {"sys", 0o555}, {"dev", 0o755},
		{"run", 0o755},
		{"box", 0o755}, // FnCall's working directory: a mount point when its root is read-only
	}
	for _, d := range dirs {
		p := filepath.Join(dir, d.path)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return fmt.Errorf("busybox rootfs: %w", err)
		}
		// Chmod after Mkdir: the umask must not change the image.
		if err := os.Chmod(p, d.mode); err != nil {
			return fmt.Errorf("busybox rootfs: %w", err)
		}
	}
	if err := copyFile(bb, filepath.Join(dir, "bin/busybox"), 0o755); err != nil {
		return fmt.Errorf("busybox rootfs: %w", err)
	}
	applets, err := busyboxApplets(bb)
	if err != nil {
		return err
	}
	for _, a := range applets {
		target, _ := filepath.Rel(filepath.Dir("/"+a), "/bin/busybox")
		if err := os.Symlink(target, filepath.Join(dir, a)); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("busybox rootfs: %w", err)
		}
	}
	files := []struct {
		path, body string
		mode       os.FileMode
	}{
		{"etc/passwd", "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n", 0o644},
		{"etc/group", "root:x:0:\nnogroup:x:65534:\n", 0o644},
		{"etc/hosts", "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n", 0o644},
		{"etc/resolv.conf", "", 0o644},
	}
	for _, f := range files {
		p := filepath.Join(dir, f.path)
		if err := os.WriteFile(p, []byte(f.body), f.mode); err != nil {
			return fmt.Errorf("busybox rootfs: %w", err)
		}
		if err := os.Chmod(p, f.mode); err != nil {
			return fmt.Errorf("busybox rootfs: %w", err)
		}
	}
	return nil
}

// busyboxApplets returns the applets' paths relative to "/", e.g.
// "usr/bin/env". A busybox without --list-full gets every applet in bin/.
func busyboxApplets(bb string) ([]string, error) {
	if out, err := exec.Command(bb, "--list-full").Output(); err == nil {
		var applets []string
		for _, a := range strings.Fields(string(out)) {
			if a != "bin/busybox" && appletDirs[filepath.Dir(a)] && filepath.IsLocal(a) {
				applets = append(applets, a)
			}
		}
		return applets, nil
	}
	out, err := exec.Command(bb, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("busybox rootfs: %s --list: %w", bb, err)
	}
	var applets []string
	for _, a := range strings.Fields(string(out)) {
		if a != "busybox" && filepath.IsLocal(a) && !strings.Contains(a, "/") {
			applets = append(applets, "bin/"+a)
		}
	}
	return applets, nil
}

func copyFile(from, to string, mode os.FileMode) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Chmod(mode); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
