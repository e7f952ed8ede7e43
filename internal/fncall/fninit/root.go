package fninit

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/fncall/proto"
)

// devices are bind-mounted from the host's /dev into the container's tmpfs
// /dev. No tty: a bind of /dev/tty would reach the agent's terminal.
var devices = []string{"null", "zero", "full", "random", "urandom"}

// buildRoot makes the container's root filesystem in fninit's own mount
// namespace and moves into it:
//
//	tmpfs on Scratch                    (every write of the container)
//	  overlay lower=Lower upper=tmpfs → Scratch/root
//	    /proc   fresh, subset=pid, hidepid=invisible: only the container's
//	            own processes, and none of another uid's (fninit's)
//	    /dev    tmpfs with null zero full random urandom, /dev/shm
//	    /tmp    mode 1777;  Workdir owned by UID:GID
//
// then pivot_root into it and detaches the host's tree. Nothing of the host
// stays reachable: no /sys, no host /proc, no host /dev nodes but the five.
func buildRoot(s *proto.Setup) error {
	if len(s.Lower) == 0 || s.Scratch == "" || !filepath.IsAbs(s.Workdir) {
		return fmt.Errorf("setup: lower, scratch and an absolute workdir are required")
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	size := ""
	if s.ScratchBytes > 0 {
		size = fmt.Sprintf(",size=%d", s.ScratchBytes)
	}
	if err := unix.Mount("tmpfs", s.Scratch, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"+size); err != nil {
		return fmt.Errorf("mount scratch tmpfs: %w", err)
	}
	upper, work, root := filepath.Join(s.Scratch, "upper"), filepath.Join(s.Scratch, "work"), filepath.Join(s.Scratch, "root")
	for _, d := range []string{upper, work, root} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", strings.Join(s.Lower, ":"), upper, work)
	if err := unix.Mount("overlay", root, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount overlay: %w", err)
	}
	if err := populate(root, s); err != nil {
		return err
	}
	return pivot(root)
}

// populate mounts /proc and /dev and makes /tmp and the workdir inside root.
func populate(root string, s *proto.Setup) error {
	in := func(p string) string { return filepath.Join(root, p) }
	for _, d := range []string{"proc", "dev", "tmp"} {
		if err := os.MkdirAll(in(d), 0o755); err != nil {
			return err
		}
	}
	if err := os.Chmod(in("tmp"), 0o777|os.ModeSticky); err != nil {
		return err
	}
	const nsd = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	if err := unix.Mount("proc", in("proc"), "proc", nsd, "subset=pid,hidepid=invisible"); err != nil {
		return fmt.Errorf("mount proc: %w", err)
	}
	if err := unix.Mount("tmpfs", in("dev"), "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=64k"); err != nil {
		return fmt.Errorf("mount /dev: %w", err)
	}
	for _, d := range devices {
		target := in("dev/" + d)
		if err := os.WriteFile(target, nil, 0o666); err != nil {
			return err
		}
		if err := unix.Mount("/dev/"+d, target, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind /dev/%s: %w", d, err)
		}
	}
	for name, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		if err := os.Symlink(target, in("dev/"+name)); err != nil {
			return err
		}
	}
	if err := os.Mkdir(in("dev/shm"), 0o755); err != nil {
		return err
	}
	if err := unix.Mount("shm", in("dev/shm"), "tmpfs", nsd, "mode=1777,size=64m"); err != nil {
		return fmt.Errorf("mount /dev/shm: %w", err)
	}
	wd := in(s.Workdir)
	if err := os.MkdirAll(wd, 0o755); err != nil {
		return err
	}
	return os.Chown(wd, s.UID, s.GID)
}

// pivot makes root the root of this mount namespace and drops the old one.
func pivot(root string) error {
	if err := unix.Chdir(root); err != nil {
		return err
	}
	// pivot_root(".", ".") stacks the old root under the new one; the
	// detach below then removes it, without needing a directory for it.
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Mount("", ".", "", unix.MS_SLAVE|unix.MS_REC, ""); err != nil {
		return err
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach old root: %w", err)
	}
	return unix.Chdir("/")
}
