package container

import (
	"errors"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// A sandbox's /dev is one read-only template per node, in the platform
// layer (platformDir: .warren/dev), bound on /dev, rather than a tmpfs
// runc fills per create: with a user namespace runc cannot make device
// nodes and binds each from the host instead, a mount per device per
// create. The device nodes work on the read-only bind (a read-only mount
// refuses writes to files and directories, not to devices); /dev/shm,
// /dev/pts and /dev/mqueue are the sandbox's own mounts on the template's
// directories, /dev/init a bind on its empty file. Where the state
// directory's filesystem cannot hold device nodes (mounted nodev), the
// template is not made and runc's tmpfs /dev is used.

// devNodes are the template's character devices: runc's defaults.
var devNodes = []struct {
	name         string
	major, minor uint32
}{{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}}

// devLinks are the template's symbolic links.
var devLinks = map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
	"stderr": "/proc/self/fd/2", "ptmx": "pts/ptmx", "core": "/proc/kcore"}

// makeDevTemplate makes the template in the platform layer (replacing
// what an earlier agent left: a lower layer is never written to while a
// sandbox uses it, so the new one goes beside it and is renamed over).
// false if this filesystem holds no device nodes.
func (c *Container) makeDevTemplate() (bool, error) {
	dir := filepath.Join(c.platformDir(), platformSub, "dev")
	if devTemplateOK(dir) {
		return true, nil
	}
	tmp := dir + ".tmp"
	os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return false, err
	}
	for _, d := range devNodes {
		p := filepath.Join(tmp, d.name)
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(d.major, d.minor))); err != nil {
			os.RemoveAll(tmp)
			if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
				return false, nil
			}
			return false, err
		}
		if err := os.Chmod(p, 0o666); err != nil { // past the umask
			return false, err
		}
	}
	for name, target := range devLinks {
		if err := os.Symlink(target, filepath.Join(tmp, name)); err != nil {
			return false, err
		}
	}
	for _, d := range []string{"pts", "shm", "mqueue"} {
		if err := os.Mkdir(filepath.Join(tmp, d), 0o755); err != nil {
			return false, err
		}
	}
	if err := os.WriteFile(filepath.Join(tmp, "init"), nil, 0o444); err != nil {
		return false, err
	}
	// A node nodev would refuse: check that the template's null opens.
	f, err := os.OpenFile(filepath.Join(tmp, "null"), os.O_WRONLY, 0)
	if err != nil {
		os.RemoveAll(tmp)
		return false, nil
	}
	f.Close()
	os.RemoveAll(dir)
	return true, os.Rename(tmp, dir)
}

// devTemplateOK reports whether dir is a complete template.
func devTemplateOK(dir string) bool {
	for _, d := range devNodes {
		var st unix.Stat_t
		if unix.Stat(filepath.Join(dir, d.name), &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR ||
			st.Rdev != unix.Mkdev(d.major, d.minor) {
			return false
		}
	}
	for name := range devLinks {
		if _, err := os.Readlink(filepath.Join(dir, name)); err != nil {
			return false
		}
	}
	_, err := os.Stat(filepath.Join(dir, "init"))
	return err == nil
}
