package fncall

import (
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// The /dev every container shows is one template per node: a small tmpfs
// holding the memory devices, the /proc/self/fd links and a shm/ mount
// point, made read-only once and bound on each container's /dev (with the
// container's own scratch on /dev/shm). A bind per container instead of a
// tmpfs with its nodes made each time: no filesystem to set up and tear
// down per call. The device nodes work on the read-only mount (a read-only
// filesystem refuses writes to files and directories, not to devices); no
// tty: it would reach the agent's terminal.

// devices are the template's nodes: major 1, the memory devices.
var devices = []struct {
	name  string
	minor uint32
}{{"null", 3}, {"zero", 5}, {"full", 7}, {"random", 8}, {"urandom", 9}}

// devDir is where the template is mounted.
func (s *Service) devDir() string { return filepath.Join(s.cfg.StateDir, "dev") }

// makeDev mounts the template on dir (replacing one a previous daemon may
// have left) and makes it read-only.
func makeDev(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for unix.Unmount(dir, unix.MNT_DETACH) == nil {
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=64k"); err != nil {
		return &os.PathError{Op: "mount tmpfs", Path: dir, Err: err}
	}
	err := func() error {
		for _, d := range devices {
			p := filepath.Join(dir, d.name)
			if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(1, d.minor))); err != nil {
				return &os.PathError{Op: "mknod", Path: p, Err: err}
			}
			if err := os.Chmod(p, 0o666); err != nil { // past the umask
				return err
			}
		}
		for name, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
			"stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
			if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
				return err
			}
		}
		if err := os.Mkdir(filepath.Join(dir, "shm"), 0o755); err != nil {
			return err
		}
		return unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NOEXEC, "")
	}()
	if err != nil {
		_ = unix.Unmount(dir, unix.MNT_DETACH)
		return err
	}
	return nil
}

// removeDev unmounts the template; containers still holding it keep it
// until they end.
func removeDev(dir string) {
	_ = unix.Unmount(dir, unix.MNT_DETACH)
	_ = os.Remove(dir)
}
