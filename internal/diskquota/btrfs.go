package diskquota

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
)

// From linux/btrfs.h (_IOW/_IOR/_IOWR on magic 0x94).
const (
	btrfsIocSubvolCreate = 0x5000940e // _IOW(0x94, 14, struct btrfs_ioctl_vol_args)
	btrfsIocSnapDestroy  = 0x5000940f // _IOW(0x94, 15, struct btrfs_ioctl_vol_args)
	btrfsIocInoLookup    = 0xd0009412 // _IOWR(0x94, 18, struct btrfs_ioctl_ino_lookup_args)
	btrfsIocQuotaCtl     = 0xc0109428 // _IOWR(0x94, 40, struct btrfs_ioctl_quota_ctl_args)
	btrfsIocQgroupCreate = 0x4010942a // _IOW(0x94, 42, struct btrfs_ioctl_qgroup_create_args)
	btrfsIocQgroupLimit  = 0x8030942b // _IOR(0x94, 43, struct btrfs_ioctl_qgroup_limit_args)
	btrfsIocTreeSearch   = 0xd0009411 // _IOWR(0x94, 17, struct btrfs_ioctl_search_args)

	btrfsQuotaCtlEnable     = 1
	btrfsQgroupLimitMaxRfer = 1 << 0
	// The root directory of every subvolume has this inode number.
	btrfsFirstFreeObjectID = 256
	btrfsQuotaTreeObjectID = 8
	btrfsQgroupInfoKey     = 242
)

type btrfsVolArgs struct {
	fd   int64
	name [4088]byte
}

type btrfsInoLookupArgs struct {
	treeid   uint64
	objectid uint64
	name     [4080]byte
}

type btrfsQuotaCtlArgs struct {
	cmd    uint64
	status uint64
}

type btrfsQgroupCreateArgs struct {
	create   uint64
	qgroupid uint64
}

type btrfsQgroupLimitArgs struct {
	qgroupid uint64
	flags    uint64
	maxRfer  uint64
	maxExcl  uint64
	rsvRfer  uint64
	rsvExcl  uint64
}

// btrfsSearchKey is struct btrfs_ioctl_search_key; the result buffer
// follows it in btrfs_ioctl_search_args (4096 - sizeof(key) bytes).
type btrfsSearchKey struct {
	treeID                             uint64
	minObjectID, maxObjectID           uint64
	minOffset, maxOffset               uint64
	minTransID, maxTransID             uint64
	minType, maxType                   uint32
	nrItems                            uint32
	unused                             uint32
	unused1, unused2, unused3, unused4 uint64
}

type btrfsSearchArgs struct {
	key btrfsSearchKey
	buf [4096 - unsafe.Sizeof(btrfsSearchKey{})]byte
}

// btrfsSearchHeader is struct btrfs_ioctl_search_header.
type btrfsSearchHeader struct {
	transid  uint64
	objectid uint64
	offset   uint64
	typ      uint32
	len      uint32
}

func ioctl(fd int, req uintptr, arg unsafe.Pointer) error {
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg)); errno != 0 {
		return errno
	}
	return nil
}

func openDir(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return fd, nil
}

func volArgs(name string) (*btrfsVolArgs, error) {
	a := &btrfsVolArgs{}
	if len(name) >= len(a.name) {
		return nil, fmt.Errorf("subvolume name %q too long", name)
	}
	copy(a.name[:], name)
	return a, nil
}

// enableBtrfs turns quotas on for the filesystem, once: enabling is
// idempotent in the kernel, but it costs a transaction.
func (q *Quota) enableBtrfs() error {
	q.btrfsMu.Lock()
	defer q.btrfsMu.Unlock()
	if q.btrfsOn {
		return nil
	}
	fd, err := openDir(q.base)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	args := btrfsQuotaCtlArgs{cmd: btrfsQuotaCtlEnable}
	if err := ioctl(fd, btrfsIocQuotaCtl, unsafe.Pointer(&args)); err != nil {
		return fmt.Errorf("enable btrfs quotas on %s: %w", q.base, err)
	}
	q.btrfsOn = true
	return nil
}

// createSubvolume makes path a subvolume and limits its qgroup's
// referenced bytes (data and metadata) to l.Bytes.
func (q *Quota) createSubvolume(path string, l Limit) error {
	if err := q.enableBtrfs(); err != nil {
		return err
	}
	parent, name := filepath.Split(filepath.Clean(path))
	pfd, err := openDir(parent)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	args, err := volArgs(name)
	if err != nil {
		return err
	}
	if err := ioctl(pfd, btrfsIocSubvolCreate, unsafe.Pointer(args)); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return &os.PathError{Op: "create subvolume", Path: path, Err: os.ErrExist}
		}
		return &os.PathError{Op: "create subvolume", Path: path, Err: err}
	}
	if err := os.Chmod(path, 0o700); err != nil {
		return err
	}
	fd, err := openDir(path)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	// qgroupid 0: the qgroup of the subvolume fd is in, 0/<subvolume id>,
	// which the kernel made with the subvolume.
	lim := btrfsQgroupLimitArgs{flags: btrfsQgroupLimitMaxRfer, maxRfer: uint64(l.Bytes)}
	if err := ioctl(fd, btrfsIocQgroupLimit, unsafe.Pointer(&lim)); err != nil {
		return fmt.Errorf("limit qgroup of %s: %w", path, err)
	}
	return nil
}

// subvolumeID returns the id of the subvolume whose root is the directory
// fd refers to.
func subvolumeID(fd int) (uint64, error) {
	args := btrfsInoLookupArgs{objectid: btrfsFirstFreeObjectID}
	if err := ioctl(fd, btrfsIocInoLookup, unsafe.Pointer(&args)); err != nil {
		return 0, err
	}
	return args.treeid, nil
}

// removeSubvolume deletes the subvolume at path with its contents, then
// its qgroup. Kernels since 6.x remove a deleted subvolume's qgroup
// themselves once its blocks are dropped and refuse to destroy it before
// (EBUSY); older ones destroy it at once.
func removeSubvolume(path string) error {
	fd, err := openDir(path)
	if err != nil {
		return err
	}
	id, err := subvolumeID(fd)
	unix.Close(fd)
	if err != nil {
		return fmt.Errorf("look up subvolume %s: %w", path, err)
	}
	parent, name := filepath.Split(filepath.Clean(path))
	pfd, err := openDir(parent)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	args, err := volArgs(name)
	if err != nil {
		return err
	}
	err = ioctl(pfd, btrfsIocSnapDestroy, unsafe.Pointer(args))
	if errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EPERM) {
		// A subvolume nested inside (ENOTEMPTY): empty it the slow way,
		// which deletes nested empty subvolumes with rmdir, then again.
		if rerr := removeContents(path); rerr != nil {
			return rerr
		}
		err = ioctl(pfd, btrfsIocSnapDestroy, unsafe.Pointer(args))
	}
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return &os.PathError{Op: "delete subvolume", Path: path, Err: err}
	}
	qg := btrfsQgroupCreateArgs{create: 0, qgroupid: id}
	switch err := ioctl(pfd, btrfsIocQgroupCreate, unsafe.Pointer(&qg)); {
	case err == nil, errors.Is(err, unix.ENOENT), errors.Is(err, unix.EBUSY), errors.Is(err, unix.ENOTCONN):
		// Gone, or the kernel drops it with the subvolume, or quotas off.
	default:
		return fmt.Errorf("destroy qgroup 0/%d of %s: %w", id, path, err)
	}
	return nil
}

func removeContents(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// subvolumeUsage reads the referenced bytes of path's qgroup from the
// quota tree (BTRFS_IOC_TREE_SEARCH, as `btrfs qgroup show` does). The
// kernel updates it at each transaction commit.
func subvolumeUsage(path string) (int64, error) {
	fd, err := openDir(path)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	id, err := subvolumeID(fd)
	if err != nil {
		return 0, fmt.Errorf("look up subvolume %s: %w", path, err)
	}
	if err := unix.Syncfs(fd); err != nil { // commit: qgroup numbers are per transaction
		return 0, err
	}
	var args btrfsSearchArgs
	args.key = btrfsSearchKey{
		treeID:      btrfsQuotaTreeObjectID,
		minObjectID: 0, maxObjectID: 0, // qgroup info items are keyed (0, INFO, qgroupid)
		minOffset: id, maxOffset: id,
		minType: btrfsQgroupInfoKey, maxType: btrfsQgroupInfoKey,
		maxTransID: ^uint64(0),
		nrItems:    1,
	}
	if err := ioctl(fd, btrfsIocTreeSearch, unsafe.Pointer(&args)); err != nil {
		return 0, fmt.Errorf("search quota tree: %w", err)
	}
	if args.key.nrItems == 0 {
		return 0, fmt.Errorf("%s: no qgroup 0/%d", path, id)
	}
	h := (*btrfsSearchHeader)(unsafe.Pointer(&args.buf[0]))
	if h.typ != btrfsQgroupInfoKey || h.offset != id || h.len < 24 {
		return 0, fmt.Errorf("%s: unexpected quota tree item %+v", path, *h)
	}
	// struct btrfs_qgroup_info_item: generation, rfer, rfer_cmpr, excl, ...
	item := args.buf[unsafe.Sizeof(*h):]
	rfer := *(*uint64)(unsafe.Pointer(&item[8]))
	return int64(rfer), nil
}

// btrfsIocSnapCreateV2 is _IOW(0x94, 23, struct btrfs_ioctl_vol_args_v2).
const btrfsIocSnapCreateV2 = 0x50009417

// btrfsVolArgsV2 is struct btrfs_ioctl_vol_args_v2: the source's fd, then
// flags and the (unused) qgroup inheritance, then the new name.
type btrfsVolArgsV2 struct {
	fd      int64
	transid uint64
	flags   uint64
	unused  [4]uint64
	name    [4040]byte
}

// IsSubvolume says whether path is the root of a btrfs subvolume.
func IsSubvolume(path string) bool {
	var st unix.Stat_t
	var fs unix.Statfs_t
	return unix.Lstat(path, &st) == nil && st.Ino == btrfsFirstFreeObjectID && st.Mode&unix.S_IFMT == unix.S_IFDIR &&
		unix.Statfs(path, &fs) == nil && fs.Type == unix.BTRFS_SUPER_MAGIC
}

// Snapshot makes dst a writable snapshot of the btrfs subvolume src: one
// transaction, whatever src holds, every block shared until written.
// dst's parent must be on the same filesystem. ErrUnsupported (errors.Is)
// where src is not a subvolume; Remove (or RemoveTree) deletes dst.
func Snapshot(src, dst string) error {
	if !IsSubvolume(src) {
		return fmt.Errorf("snapshot %s: not a btrfs subvolume: %w", src, errors.ErrUnsupported)
	}
	sfd, err := openDir(src)
	if err != nil {
		return err
	}
	defer unix.Close(sfd)
	parent, name := filepath.Split(filepath.Clean(dst))
	pfd, err := openDir(parent)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	args := &btrfsVolArgsV2{fd: int64(sfd)}
	if len(name) >= len(args.name) {
		return fmt.Errorf("snapshot name %q too long", name)
	}
	copy(args.name[:], name)
	if err := ioctl(pfd, btrfsIocSnapCreateV2, unsafe.Pointer(args)); err != nil {
		return &os.PathError{Op: "snapshot subvolume", Path: dst, Err: err}
	}
	return nil
}

// RemoveTree removes path and everything under it: a btrfs subvolume
// (a Snapshot) with its qgroup, else a plain tree. A missing path is
// fine.
func RemoveTree(path string) error {
	if IsSubvolume(path) {
		return removeSubvolume(path)
	}
	return os.RemoveAll(path)
}

// btrfsRootTreeObjectID and btrfsRootItemKey find a subvolume's root item.
const (
	btrfsRootTreeObjectID = 1
	btrfsRootItemKey      = 132
)

// clearStaleQgroups destroys the level-0 qgroups of subvolumes that are
// gone (`btrfs qgroup clear-stale`), and returns how many. A deleted
// subvolume's qgroup can only be destroyed once its blocks are dropped,
// which the kernel's cleaner does later; kernels since 6.x then destroy
// it themselves, but not always (one whose numbers were not zero yet at
// the drop stays behind, stale, for good). So every removal sweeps up
// after the earlier ones. Qgroups of subvolumes still being dropped
// answer EBUSY and are left for the next sweep.
func clearStaleQgroups(base string) (int, error) {
	fd, err := openDir(base)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	var ids []uint64
	for next := uint64(btrfsFirstFreeObjectID); ; {
		var args btrfsSearchArgs
		args.key = btrfsSearchKey{
			treeID:      btrfsQuotaTreeObjectID,
			minObjectID: 0, maxObjectID: 0,
			minOffset: next, maxOffset: 1<<48 - 1, // level 0: the subvolume id itself
			minType: btrfsQgroupInfoKey, maxType: btrfsQgroupInfoKey,
			maxTransID: ^uint64(0),
			nrItems:    4096,
		}
		if err := ioctl(fd, btrfsIocTreeSearch, unsafe.Pointer(&args)); err != nil {
			if errors.Is(err, unix.ENOENT) { // quotas off: no quota tree
				return 0, nil
			}
			return 0, fmt.Errorf("search quota tree: %w", err)
		}
		if args.key.nrItems == 0 {
			break
		}
		off := uintptr(0)
		for i := uint32(0); i < args.key.nrItems; i++ {
			h := (*btrfsSearchHeader)(unsafe.Pointer(&args.buf[off]))
			if h.typ == btrfsQgroupInfoKey {
				ids = append(ids, h.offset)
			}
			next = h.offset + 1
			off += unsafe.Sizeof(*h) + uintptr(h.len)
		}
	}
	cleared := 0
	var errs []error
	for _, id := range ids {
		var args btrfsSearchArgs
		args.key = btrfsSearchKey{
			treeID:      btrfsRootTreeObjectID,
			minObjectID: id, maxObjectID: id,
			maxOffset: ^uint64(0),
			minType:   btrfsRootItemKey, maxType: btrfsRootItemKey,
			maxTransID: ^uint64(0),
			nrItems:    1,
		}
		if err := ioctl(fd, btrfsIocTreeSearch, unsafe.Pointer(&args)); err != nil {
			return cleared, fmt.Errorf("search root tree: %w", err)
		}
		if args.key.nrItems > 0 {
			continue // the subvolume exists, or is still being dropped
		}
		qg := btrfsQgroupCreateArgs{create: 0, qgroupid: id}
		switch err := ioctl(fd, btrfsIocQgroupCreate, unsafe.Pointer(&qg)); {
		case err == nil:
			cleared++
		case errors.Is(err, unix.ENOENT), errors.Is(err, unix.EBUSY), errors.Is(err, unix.ENOTCONN):
		default:
			errs = append(errs, fmt.Errorf("destroy stale qgroup 0/%d: %w", id, err))
		}
	}
	return cleared, errors.Join(errs...)
}
