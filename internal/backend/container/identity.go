package container

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/mountns"
	"github.com/warrenhq/warren/internal/rootfs"
)

// Every sandbox is a machine of its own to what runs in it, forks of one
// sandbox included (they share its files, /etc/machine-id among them):
//
//   - /etc/machine-id: a fresh one, written into the sandbox's own layer
//     before it starts (where the environment has /etc), as its root;
//   - /proc/sys/kernel/random/boot_id: the host's is the same in every
//     sandbox, so the sandbox's own (a platform file, written at create)
//     is bound read-only over it, in the sandbox's mount namespace once
//     runc has made it (runc allows no mount there); gVisor's /proc has
//     no boot_id;
//   - the hostname is the sandbox's id (the spec).
//
// Random state needs nothing: a sandbox's processes start afresh from its
// files and draw from the kernel's pool, never from a copied one.

// bootIDFile is the sandbox's boot_id, among its own platform files.
const bootIDFile = "boot_id"

// newUUID returns a random version 4 UUID in its text form.
func newUUID() string {
	b := make([]byte, 16)
	rand.Read(b)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// giveIdentity gives the created (not yet started) sandbox, whose init
// is pid and whose root is mounted at rootDir in scratch (where the
// runtime created it), its machine id and boot id, and hides /proc's
// masked directories (procDirMasks) in the same pass.
func (c *Container) giveIdentity(s *sandbox, scratch *mountns.NS, pid int) error {
	err := s.withRoot(func(root string) error {
		fi, err := rootfs.Stat(root, "/etc")
		if err != nil || !fi.IsDir {
			return nil
		}
		id := make([]byte, 16)
		rand.Read(id)
		mid := []byte(hex.EncodeToString(id) + "\n")
		return asSandboxRoot(s, func() error { return rootfs.WriteFile(root, "/etc/machine-id", 0o444, bytes.NewReader(mid)) })
	})
	if err != nil && !errors.Is(err, errdefs.ErrInvalid) { // /etc/machine-id a directory, say: the image's business
		return fmt.Errorf("machine id: %w", err)
	}
	if s.rt.gvisor() {
		return nil
	}
	// From the sandbox's own platform files, through its root: the
	// mount table inside names /.warren/boot_id, no host path.
	plat := filepath.Join(c.rootDir(s.spec.ID), platformSub)
	binds := []bind{{filepath.Join(plat, bootIDFile), "/proc/sys/kernel/random/boot_id"}}
	for _, p := range procDirMasks() {
		binds = append(binds, bind{filepath.Join(plat, emptyDir), p})
	}
	return bindInto(scratch, pid, binds...)
}

// bind is a file or directory of a sandbox's root (src, a path in the
// namespace it is mounted in) to bind read-only onto target in the
// sandbox's own mount namespace.
type bind struct{ src, target string }

// bindInto makes binds, read-only, in the mount namespace of process pid:
// each a detached clone of its src (open_tree, made in from: a mount can
// be cloned only in its own namespace), made read-only, then moved there
// from a thread that joined that namespace and ends with it.
func bindInto(from *mountns.NS, pid int, binds ...bind) error {
	trees := make([]*os.File, 0, len(binds))
	defer func() {
		for _, t := range trees {
			t.Close()
		}
	}()
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC}
	for _, b := range binds {
		tree, err := from.Clone(unix.AT_FDCWD, b.src, 0)
		if err != nil {
			return fmt.Errorf("bind %s: %w", b.target, err)
		}
		trees = append(trees, tree)
		if err := unix.MountSetattr(int(tree.Fd()), "", unix.AT_EMPTY_PATH, &attr); err != nil {
			return fmt.Errorf("bind %s: mount_setattr: %w", b.target, err)
		}
	}
	to, err := mountns.Of(pid)
	if err != nil {
		return fmt.Errorf("bind into %d: %w", pid, err)
	}
	defer to.Close()
	return to.Run(func() error {
		for i, b := range binds {
			if err := unix.MoveMount(int(trees[i].Fd()), "", unix.AT_FDCWD, b.target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
				return fmt.Errorf("bind %s: move_mount: %w", b.target, err)
			}
		}
		return nil
	})
}
