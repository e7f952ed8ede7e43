package diskquota

import (
	"testing"
	"unsafe"
)

// TestABI pins the Go mirrors of the kernel's structs to the sizes and
// offsets of linux/{fs,quota,dqblk_xfs,btrfs}.h (x86-64 and arm64 alike:
// none has a pointer or long), as a C program printed them. The xfs and
// ext4 paths cannot run on a kernel without quota support; this is what
// keeps them honest there.
func TestABI(t *testing.T) {
	var dq fsDiskQuota
	for _, c := range []struct {
		what      string
		got, want uintptr
	}{
		{"sizeof(struct fsxattr)", unsafe.Sizeof(fsxattr{}), 28},
		{"sizeof(struct if_dqblk)", unsafe.Sizeof(ifDqblk{}), 72},
		{"sizeof(struct fs_disk_quota)", unsafe.Sizeof(dq), 112},
		{"offsetof(fs_disk_quota, d_rtb_hardlimit)", unsafe.Offsetof(dq.rtbHardlimit), 72},
		{"offsetof(fs_disk_quota, d_padding4)", unsafe.Offsetof(dq.padding4), 104},
		{"sizeof(struct btrfs_ioctl_vol_args)", unsafe.Sizeof(btrfsVolArgs{}), 4096},
		{"sizeof(struct btrfs_ioctl_ino_lookup_args)", unsafe.Sizeof(btrfsInoLookupArgs{}), 4096},
		{"sizeof(struct btrfs_ioctl_qgroup_limit_args)", unsafe.Sizeof(btrfsQgroupLimitArgs{}), 48},
		{"sizeof(struct btrfs_ioctl_search_key)", unsafe.Sizeof(btrfsSearchKey{}), 104},
		{"sizeof(struct btrfs_ioctl_search_args)", unsafe.Sizeof(btrfsSearchArgs{}), 4096},
		{"sizeof(struct btrfs_ioctl_search_header)", unsafe.Sizeof(btrfsSearchHeader{}), 32},
	} {
		if c.got != c.want {
			t.Errorf("%s: Go has %d, the kernel %d", c.what, c.got, c.want)
		}
	}
	// _IOC(dir, type, nr, size) = dir<<30 | size<<16 | type<<8 | nr.
	ioc := func(dir, typ, nr, size uintptr) uintptr { return dir<<30 | size<<16 | typ<<8 | nr }
	const w, r, rw = 1, 2, 3
	for _, c := range []struct {
		what      string
		got, want uintptr
	}{
		{"FS_IOC_FSGETXATTR", fsIocFSGetXattr, ioc(r, 'X', 31, unsafe.Sizeof(fsxattr{}))},
		{"FS_IOC_FSSETXATTR", fsIocFSSetXattr, ioc(w, 'X', 32, unsafe.Sizeof(fsxattr{}))},
		{"BTRFS_IOC_SUBVOL_CREATE", btrfsIocSubvolCreate, ioc(w, 0x94, 14, 4096)},
		{"BTRFS_IOC_SNAP_DESTROY", btrfsIocSnapDestroy, ioc(w, 0x94, 15, 4096)},
		{"BTRFS_IOC_TREE_SEARCH", btrfsIocTreeSearch, ioc(rw, 0x94, 17, 4096)},
		{"BTRFS_IOC_INO_LOOKUP", btrfsIocInoLookup, ioc(rw, 0x94, 18, 4096)},
		{"BTRFS_IOC_QUOTA_CTL", btrfsIocQuotaCtl, ioc(rw, 0x94, 40, 16)},
		{"BTRFS_IOC_QGROUP_CREATE", btrfsIocQgroupCreate, ioc(w, 0x94, 42, 16)},
		{"BTRFS_IOC_QGROUP_LIMIT", btrfsIocQgroupLimit, ioc(r, 0x94, 43, 48)},
	} {
		if c.got != c.want {
			t.Errorf("%s: %#x, want %#x", c.what, c.got, c.want)
		}
	}
	if qcmd(qXSetQLim, prjQuota) != 0x580402 || qcmd(qSetQuota, prjQuota) != 0x80000802 {
		t.Errorf("QCMD: Q_XSETQLIM %#x, Q_SETQUOTA %#x", qcmd(qXSetQLim, prjQuota), qcmd(qSetQuota, prjQuota))
	}
}
