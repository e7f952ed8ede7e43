// Package diskquota limits how many bytes (and, where the filesystem can,
// how many inodes) one directory tree may use on the host, so that one
// sandbox's writable layer cannot fill the node's disk. It is the one host
// package for disk quotas: it detects what the filesystem of a base
// directory offers and uses it.
//
//   - btrfs: each limited directory is a subvolume with a qgroup limit on
//     its referenced bytes, as Docker's btrfs driver does (quotas are
//     enabled on the filesystem at the first limited Create). btrfs has no
//     per-subvolume inode count: every inode's metadata is charged to the
//     qgroup, so the byte limit bounds the files too, and an inode limit is
//     refused (Quota.Inodes reports false).
//   - xfs and ext4: each limited directory gets its own project id with the
//     inherit flag (FS_IOC_FSSETXATTR) and a project quota on bytes and
//     inodes, as Docker's overlay2 size option does: quotactl Q_XSETQLIM on
//     xfs, Q_SETQUOTA with PRJQUOTA on ext4. The filesystem must be mounted
//     with project quotas on (prjquota; ext4 also needs the quota and
//     project features). quotactl_fd (Linux 5.14) is used, or quotactl on a
//     device node made next to the base directory on older kernels.
//
// Everything is written against the kernel's documented ioctl and quotactl
// interfaces (linux/btrfs.h, linux/fs.h, linux/quota.h, linux/dqblk_xfs.h).
// Nothing is persisted: a limit lives in the filesystem (the subvolume's
// qgroup, the directory's project id), so it survives an agent restart and
// Remove finds what to undo from the directory itself.
//
// Past a limit, writes inside fail with EDQUOT (btrfs, xfs, ext4) or ENOSPC;
// the rest of the filesystem is untouched.
package diskquota

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/errdefs"
)

// Mechanism names how a Quota enforces limits; the API shows it as a
// node's disk_quota.
type Mechanism string

const (
	Btrfs Mechanism = "btrfs" // subvolume + qgroup: bytes (metadata included)
	XFS   Mechanism = "xfs"   // project quota: bytes and inodes
	Ext4  Mechanism = "ext4"  // project quota: bytes and inodes
	None  Mechanism = "none"  // the filesystem offers nothing warren uses
)

// Limit is what one directory tree may use. Zero fields mean no limit.
type Limit struct {
	Bytes  int64
	Inodes int64
}

// IsZero reports whether l limits nothing.
func (l Limit) IsZero() bool { return l == Limit{} }

// Quota creates and removes limited directories under one base directory.
// It is safe for concurrent use.
type Quota struct {
	base   string
	mech   Mechanism
	reason string // why None

	btrfsMu sync.Mutex // serialises enabling btrfs quotas
	btrfsOn bool

	prj *projects // xfs and ext4
}

// Detect returns the Quota for directories under base (which must exist), using what base's filesystem offers. It never fails: a
// filesystem without quotas gives a Quota whose Mechanism is None, with
// Reason saying why. Cost: a statfs and, on xfs or ext4, one quotactl.
func Detect(base string) *Quota {
	q := &Quota{base: filepath.Clean(base)}
	q.mech, q.reason = q.detect()
	return q
}

func (q *Quota) detect() (Mechanism, string) {
	var st unix.Statfs_t
	if err := unix.Statfs(q.base, &st); err != nil {
		return None, fmt.Sprintf("statfs %s: %v", q.base, err)
	}
	if os.Geteuid() != 0 {
		return None, "disk quotas need root"
	}
	switch uint32(st.Type) {
	case unix.BTRFS_SUPER_MAGIC:
		return Btrfs, ""
	case unix.XFS_SUPER_MAGIC:
		p, err := openProjects(q.base, XFS)
		if err != nil {
			return None, fmt.Sprintf("%s is on xfs without project quotas: %v (mount it with prjquota)", q.base, err)
		}
		q.prj = p
		return XFS, ""
	case unix.EXT4_SUPER_MAGIC:
		p, err := openProjects(q.base, Ext4)
		if err != nil {
			return None, fmt.Sprintf("%s is on ext4 without project quotas: %v (mkfs.ext4 -O quota,project or tune2fs -O quota,project, and mount it with prjquota)", q.base, err)
		}
		q.prj = p
		return Ext4, ""
	}
	return None, fmt.Sprintf("%s is on %s, which offers no quota warren uses (btrfs, or xfs or ext4 with project quotas)", q.base, fsName(int64(st.Type)))
}

// Mechanism says how limits are enforced, None if they cannot be.
func (q *Quota) Mechanism() Mechanism { return q.mech }

// Reason says why the Mechanism is None ("" otherwise).
func (q *Quota) Reason() string { return q.reason }

// Inodes reports whether an inode limit can be enforced (xfs, ext4).
func (q *Quota) Inodes() bool { return q.mech == XFS || q.mech == Ext4 }

// DefaultInodes is the inode limit for a byte limit that comes without
// one: one inode per 16 KiB, the ratio mkfs.ext4 gives a filesystem by
// default (so a sandbox holds its share of inodes in proportion to its
// share of bytes), and at least 1024.
func DefaultInodes(bytes int64) int64 {
	if bytes <= 0 {
		return 0
	}
	return max(bytes/(16<<10), 1024)
}

// Create makes the directory path (mode 0700, under the base directory,
// on its filesystem) limited to l. A zero l makes a plain directory. An existing
// path is an error wrapping os.ErrExist; a limit the filesystem cannot
// enforce is ErrUnavailable (code disk_quota_unsupported); a negative one
// ErrInvalid. On error nothing is left behind.
func (q *Quota) Create(path string, l Limit) error {
	if l.Bytes < 0 || l.Inodes < 0 {
		return errdefs.Invalid("disk limit %+v: negative", l)
	}
	if !strings.HasPrefix(filepath.Clean(path), q.base+"/") {
		return errdefs.Invalid("disk quota: %s is not under %s", path, q.base)
	}
	if l.IsZero() {
		return os.Mkdir(path, 0o700)
	}
	switch {
	case q.mech == None:
		return errUnsupported("this node cannot limit disk: %s", q.reason)
	case l.Inodes > 0 && !q.Inodes():
		return errUnsupported("this node cannot limit inodes: %s counts each inode's metadata in the byte limit but has no inode limit", q.mech)
	}
	var err error
	if q.mech == Btrfs {
		err = q.createSubvolume(path, l)
	} else {
		err = q.prj.create(path, l)
	}
	if err != nil && !errors.Is(err, os.ErrExist) {
		if rerr := q.Remove(path); rerr != nil {
			err = fmt.Errorf("%w (cleanup: %v)", err, rerr)
		}
	}
	return err
}

// Remove removes path with everything under it and whatever limits it
// (the btrfs subvolume and its qgroup, the project quota). A missing path
// is not an error. Nothing under path may be mounted.
func (q *Quota) Remove(path string) error {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return &os.PathError{Op: "lstat", Path: path, Err: err}
	}
	switch q.mech {
	case Btrfs:
		if st.Ino == btrfsFirstFreeObjectID && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			err := removeSubvolume(path)
			// Sweep up after earlier removals (this one's qgroup goes
			// once the cleaner has dropped the subvolume). A failed
			// sweep is no failed removal: the next one tries again.
			_, _ = q.ClearStale()
			return err
		}
	case XFS, Ext4:
		return q.prj.remove(path)
	}
	return os.RemoveAll(path)
}

// ClearStale destroys the qgroups of btrfs subvolumes that are gone, as
// `btrfs qgroup clear-stale` does, and says how many. The kernel usually
// destroys a deleted subvolume's qgroup itself once it has dropped its
// blocks, but not always; Remove calls this each time, and an agent at
// start. Elsewhere it does nothing.
func (q *Quota) ClearStale() (int, error) {
	if q.mech != Btrfs {
		return 0, nil
	}
	return clearStaleQgroups(q.base)
}

// Usage returns the bytes path's limit has charged so far, for tests and
// diagnostics: the qgroup's referenced bytes on btrfs, the project's
// space on xfs and ext4. ErrNotFound if path carries no limit.
func (q *Quota) Usage(path string) (int64, error) {
	switch q.mech {
	case Btrfs:
		return subvolumeUsage(path)
	case XFS, Ext4:
		return q.prj.usage(path)
	}
	return 0, errdefs.New(errdefs.ErrNotFound, "", "%s has no disk limit", path)
}

// CodeUnsupported is the error code of a limit the filesystem cannot
// enforce (api.CodeDiskQuotaUnsupported).
const CodeUnsupported = "disk_quota_unsupported"

func errUnsupported(format string, args ...any) error {
	return errdefs.New(errdefs.ErrUnavailable, CodeUnsupported, format, args...)
}

func fsName(t int64) string {
	switch uint32(t) {
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	case unix.OVERLAYFS_SUPER_MAGIC:
		return "overlayfs"
	case unix.EXT4_SUPER_MAGIC:
		return "ext4"
	case unix.NFS_SUPER_MAGIC:
		return "nfs"
	case unix.FUSE_SUPER_MAGIC:
		return "fuse"
	}
	return fmt.Sprintf("a filesystem of type %#x", t)
}
