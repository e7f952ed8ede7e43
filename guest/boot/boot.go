// Package boot holds what every warren guest's pid 1 does first (guest/init
// for the test guests, guest/agent for microVM sandboxes): mount the
// kernel's filesystems, load the modules the initramfs carries, wait for
// devices, switch into a new root.
package boot

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/guest/initramfs"
)

// Logf writes a line to the console (pid 1's stderr).
func Logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "warren-guest: "+format+"\n", args...)
}

// Mount mounts src on dst, creating dst.
func Mount(src, dst, typ string, flags uintptr, opts string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(src, dst, typ, flags, opts); err != nil {
		return fmt.Errorf("mount %s on %s (%s): %w", src, dst, typ, err)
	}
	return nil
}

// Early mounts /dev, /proc and /sys.
func Early() error {
	for _, m := range []struct{ src, dst, typ, opts string }{
		{"devtmpfs", "/dev", "devtmpfs", "mode=0755"},
		{"proc", "/proc", "proc", ""},
		{"sysfs", "/sys", "sysfs", ""},
	} {
		if err := Mount(m.src, m.dst, m.typ, 0, m.opts); err != nil {
			return err
		}
	}
	return nil
}

// LoadModules loads the initramfs's modules in the order of their names
// and returns how many there were.
func LoadModules() (int, error) {
	dir := "/" + initramfs.ModuleDir
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	for _, n := range names {
		f, err := os.Open(filepath.Join(dir, n))
		if err != nil {
			return 0, err
		}
		err = unix.FinitModule(int(f.Fd()), "", 0)
		f.Close()
		if err != nil && err != unix.EEXIST {
			return 0, fmt.Errorf("load module %s: %w", n, err)
		}
	}
	return len(names), nil
}

// WaitFor waits until cond holds (a device's driver has probed it, say),
// up to d.
func WaitFor(what string, d time.Duration, cond func() bool) error {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not appear within %v", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// SwitchRoot makes dir the root, carrying /dev, /proc and /sys along, as
// switch_root(8) does (the initramfs itself cannot be unmounted).
func SwitchRoot(dir string) error {
	for _, m := range []string{"/dev", "/proc", "/sys"} {
		if err := unix.Mount(m, dir+m, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("move %s: %w", m, err)
		}
	}
	if err := unix.Chdir(dir); err != nil {
		return err
	}
	if err := unix.Mount(dir, "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return err
	}
	return unix.Chdir("/")
}

// LoUp brings the loopback interface up.
func LoUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo up: %w", err)
	}
	return nil
}

// PowerOff syncs and powers the machine off; it does not return.
func PowerOff() {
	unix.Sync()
	unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	for { // pid 1 must not exit
		time.Sleep(time.Hour)
	}
}

// LeaveRootfs moves pid 1 off the initramfs: the files it names (paths
// from /, such as "init") are moved into a tmpfs, which becomes the root
// (as switch_root(8) does, /dev, /proc and /sys carried along), and the
// rest of the initramfs is deleted. Mount namespaces made later can then
// pivot_root(2), which the initramfs (rootfs) cannot do.
func LeaveRootfs(keep ...string) error {
	const dir = "/.root"
	if err := Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		return err
	}
	for _, k := range keep {
		src := "/" + k
		dst := filepath.Join(dir, k)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := copyTree(src, dst); err != nil {
			return fmt.Errorf("keep %s: %w", k, err)
		}
		os.RemoveAll(src)
	}
	for _, d := range []string{"dev", "proc", "sys"} {
		os.MkdirAll(filepath.Join(dir, d), 0o755)
	}
	// The modules are loaded: their files go.
	os.RemoveAll("/lib")
	return SwitchRoot(dir)
}

func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.MkdirAll(target, fi.Mode().Perm())
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, fi.Mode().Perm())
	})
}
