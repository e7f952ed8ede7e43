package diskquota

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// From linux/fs.h.
const (
	fsIocFSGetXattr    = 0x801c581f // _IOR('X', 31, struct fsxattr)
	fsIocFSSetXattr    = 0x401c5820 // _IOW('X', 32, struct fsxattr)
	fsXflagProjInherit = 0x00000200
)

// struct fsxattr.
type fsxattr struct {
	xflags     uint32
	extsize    uint32
	nextents   uint32
	projid     uint32
	cowextsize uint32
	pad        [8]byte
}

// From linux/quota.h and linux/dqblk_xfs.h.
const (
	prjQuota   = 2
	qGetInfo   = 0x800005
	qGetQuota  = 0x800007
	qSetQuota  = 0x800008
	qXGetQuota = 'X'<<8 + 3
	qXSetQLim  = 'X'<<8 + 4
	qXGetQStat = 'X'<<8 + 5

	qifBLimits   = 1
	qifSpace     = 2
	qifILimits   = 4
	qifInodes    = 8
	qifDqBlkSize = 1024 // if_dqblk limits count 1 KiB blocks

	fsDquotVersion = 1
	fsProjQuota    = 2 // fs_disk_quota.d_flags
	fsDqISoft      = 1 << 0
	fsDqIHard      = 1 << 1
	fsDqBSoft      = 1 << 2
	fsDqBHard      = 1 << 3
	bbSize         = 512 // fs_disk_quota counts 512-byte basic blocks

	fsQuotaPdqAcct = 1 << 4 // fs_quota_stat.qs_flags
	fsQuotaPdqEnfd = 1 << 5
)

// struct if_dqblk (Q_GETQUOTA, Q_SETQUOTA).
type ifDqblk struct {
	bhardlimit uint64
	bsoftlimit uint64
	curspace   uint64
	ihardlimit uint64
	isoftlimit uint64
	curinodes  uint64
	btime      uint64
	itime      uint64
	valid      uint32
	_          uint32
}

// struct fs_disk_quota (Q_XGETQUOTA, Q_XSETQLIM).
type fsDiskQuota struct {
	version      int8
	flags        int8
	fieldmask    uint16
	id           uint32
	blkHardlimit uint64
	blkSoftlimit uint64
	inoHardlimit uint64
	inoSoftlimit uint64
	bcount       uint64
	icount       uint64
	itimer       int32
	btimer       int32
	iwarns       uint16
	bwarns       uint16
	itimerHi     int8
	btimerHi     int8
	rtbtimerHi   int8
	padding2     int8
	rtbHardlimit uint64
	rtbSoftlimit uint64
	rtbcount     uint64
	rtbtimer     int32
	rtbwarns     uint16
	padding3     int16
	padding4     [8]byte
}

func qcmd(cmd, typ int) int { return cmd<<8 | typ&0xff }

// projects hands out project ids and sets project quotas on one
// filesystem (xfs or ext4).
type projects struct {
	kind Mechanism
	base string
	mu   sync.Mutex // one id allocation at a time

	devMu sync.Mutex
	dev   string // block device node for quotactl where quotactl_fd is missing
}

// openProjects checks that base's filesystem enforces project quotas.
func openProjects(base string, kind Mechanism) (*projects, error) {
	p := &projects{kind: kind, base: base}
	if kind == XFS {
		var stat [256]byte // struct fs_quota_stat; qs_flags is the u16 at offset 2
		if err := p.quotactl(qXGetQStat, 0, unsafe.Pointer(&stat[0])); err != nil {
			return nil, fmt.Errorf("Q_XGETQSTAT: %w", err)
		}
		if flags := binary.LittleEndian.Uint16(stat[2:]); flags&fsQuotaPdqEnfd == 0 {
			return nil, errors.New("project quotas are not enforced")
		}
	} else {
		var info [24]byte // struct if_dqinfo
		if err := p.quotactl(qGetInfo, 0, unsafe.Pointer(&info[0])); err != nil {
			return nil, fmt.Errorf("Q_GETINFO: %w", err)
		}
	}
	var fx fsxattr
	if err := p.getXattr(base, &fx); err != nil {
		return nil, err
	}
	return p, nil
}

// quotactl runs cmd for project id on the filesystem: quotactl_fd on the
// base directory, or quotactl on a device node for kernels before 5.14.
func (p *projects) quotactl(cmd int, id uint32, addr unsafe.Pointer) error {
	fd, err := openDir(p.base)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	_, _, errno := unix.Syscall6(unix.SYS_QUOTACTL_FD, uintptr(fd), uintptr(qcmd(cmd, prjQuota)), uintptr(id), uintptr(addr), 0, 0)
	if errno != unix.ENOSYS {
		if errno != 0 {
			return errno
		}
		return nil
	}
	dev, err := p.device()
	if err != nil {
		return err
	}
	special, err := unix.BytePtrFromString(dev)
	if err != nil {
		return err
	}
	_, _, errno = unix.Syscall6(unix.SYS_QUOTACTL, uintptr(qcmd(cmd, prjQuota)), uintptr(unsafe.Pointer(special)), uintptr(id), uintptr(addr), 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// device makes a block device node for base's filesystem next to base
// (as Docker's projectquota does), for quotactl.
func (p *projects) device() (string, error) {
	p.devMu.Lock()
	defer p.devMu.Unlock()
	if p.dev != "" {
		return p.dev, nil
	}
	var st unix.Stat_t
	if err := unix.Stat(p.base, &st); err != nil {
		return "", &os.PathError{Op: "stat", Path: p.base, Err: err}
	}
	dev := filepath.Join(filepath.Dir(p.base), "."+filepath.Base(p.base)+".quota-dev")
	os.Remove(dev)
	if err := unix.Mknod(dev, unix.S_IFBLK|0o600, int(st.Dev)); err != nil {
		return "", &os.PathError{Op: "mknod", Path: dev, Err: err}
	}
	p.dev = dev
	return dev, nil
}

func (p *projects) getXattr(path string, fx *fsxattr) error {
	fd, err := openDir(path)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := ioctl(fd, fsIocFSGetXattr, unsafe.Pointer(fx)); err != nil {
		return &os.PathError{Op: "FS_IOC_FSGETXATTR", Path: path, Err: err}
	}
	return nil
}

func (p *projects) setProject(path string, id uint32) error {
	fd, err := openDir(path)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var fx fsxattr
	if err := ioctl(fd, fsIocFSGetXattr, unsafe.Pointer(&fx)); err != nil {
		return &os.PathError{Op: "FS_IOC_FSGETXATTR", Path: path, Err: err}
	}
	fx.projid = id
	fx.xflags |= fsXflagProjInherit
	if err := ioctl(fd, fsIocFSSetXattr, unsafe.Pointer(&fx)); err != nil {
		return &os.PathError{Op: "FS_IOC_FSSETXATTR", Path: path, Err: err}
	}
	return nil
}

// limits is one project's limits and usage, in bytes and inodes.
type limits struct {
	bytes, inodes       int64 // hard limits, 0 = none
	usedBytes, usedInos int64
}

func (p *projects) get(id uint32) (limits, error) {
	if p.kind == XFS {
		var d fsDiskQuota
		if err := p.quotactl(qXGetQuota, id, unsafe.Pointer(&d)); err != nil {
			if errors.Is(err, unix.ENOENT) {
				return limits{}, nil // no dquot yet: unused
			}
			return limits{}, fmt.Errorf("Q_XGETQUOTA project %d: %w", id, err)
		}
		return limits{bytes: int64(d.blkHardlimit) * bbSize, inodes: int64(d.inoHardlimit),
			usedBytes: int64(d.bcount) * bbSize, usedInos: int64(d.icount)}, nil
	}
	var d ifDqblk
	if err := p.quotactl(qGetQuota, id, unsafe.Pointer(&d)); err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) {
			return limits{}, nil
		}
		return limits{}, fmt.Errorf("Q_GETQUOTA project %d: %w", id, err)
	}
	return limits{bytes: int64(d.bhardlimit) * qifDqBlkSize, inodes: int64(d.ihardlimit),
		usedBytes: int64(d.curspace), usedInos: int64(d.curinodes)}, nil
}

// set sets project id's hard and soft limits (zero clears them).
func (p *projects) set(id uint32, l Limit) error {
	if p.kind == XFS {
		bb := uint64((l.Bytes + bbSize - 1) / bbSize)
		d := fsDiskQuota{version: fsDquotVersion, flags: fsProjQuota, id: id,
			fieldmask:    fsDqBHard | fsDqBSoft | fsDqIHard | fsDqISoft,
			blkHardlimit: bb, blkSoftlimit: bb,
			inoHardlimit: uint64(l.Inodes), inoSoftlimit: uint64(l.Inodes)}
		if err := p.quotactl(qXSetQLim, id, unsafe.Pointer(&d)); err != nil {
			return fmt.Errorf("Q_XSETQLIM project %d: %w", id, err)
		}
		return nil
	}
	kb := uint64((l.Bytes + qifDqBlkSize - 1) / qifDqBlkSize)
	d := ifDqblk{bhardlimit: kb, bsoftlimit: kb, ihardlimit: uint64(l.Inodes), isoftlimit: uint64(l.Inodes),
		valid: qifBLimits | qifILimits}
	if err := p.quotactl(qSetQuota, id, unsafe.Pointer(&d)); err != nil {
		return fmt.Errorf("Q_SETQUOTA project %d: %w", id, err)
	}
	return nil
}

// Project ids are drawn at random from [projMin, projMax) and taken only
// if no file and no limit uses them, so that agents sharing a filesystem
// (several data dirs, or another tool's projects with small ids) do not
// collide.
const (
	projMin = 1 << 20
	projMax = 1 << 31
)

func (p *projects) create(path string, l Limit) error {
	if err := os.Mkdir(path, 0o700); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	id, err := p.freeID()
	if err != nil {
		return err
	}
	// Limits first, then the id: files under path are never unlimited.
	if err := p.set(id, l); err != nil {
		return err
	}
	if err := p.setProject(path, id); err != nil {
		p.set(id, Limit{})
		return err
	}
	return nil
}

func (p *projects) freeID() (uint32, error) {
	for range 64 {
		var b [4]byte
		rand.Read(b[:])
		id := projMin + binary.LittleEndian.Uint32(b[:])%(projMax-projMin)
		l, err := p.get(id)
		if err != nil {
			return 0, err
		}
		if l == (limits{}) {
			return id, nil
		}
	}
	return 0, errors.New("no free project id after 64 tries")
}

func (p *projects) projectOf(path string) (uint32, error) {
	var fx fsxattr
	if err := p.getXattr(path, &fx); err != nil {
		return 0, err
	}
	return fx.projid, nil
}

func (p *projects) remove(path string) error {
	id, err := p.projectOf(path)
	if err != nil {
		return err
	}
	if err := os.RemoveAll(path); err != nil {
		return err
	}
	if id < projMin {
		return nil // not one of ours: a plain directory
	}
	return p.set(id, Limit{})
}

func (p *projects) usage(path string) (int64, error) {
	id, err := p.projectOf(path)
	if err != nil {
		return 0, err
	}
	if id < projMin {
		return 0, fmt.Errorf("%s has no project quota", path)
	}
	l, err := p.get(id)
	return l.usedBytes, err
}
