package rootfs

import (
	"io"
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// attrs is the metadata to give an entry we create.
type attrs struct {
	mode         uint32    // permission bits incl. setuid, setgid, sticky
	uid, gid     int       // -1 keeps what the kernel gave
	atime, mtime time.Time // zero mtime leaves the times alone
}

// applyFd gives the open file or directory fd its owner, mode and times.
// The owner goes first: chown clears setuid and setgid bits.
func (a attrs) applyFd(fd int) error {
	if a.uid >= 0 || a.gid >= 0 {
		if err := unix.Fchown(fd, a.uid, a.gid); err != nil {
			return err
		}
	}
	if err := unix.Fchmod(fd, a.mode); err != nil {
		return err
	}
	if ts, ok := a.times(); ok {
		// utimensat(fd, NULL, ...) is futimens(3); x/sys has no wrapper
		// that passes a NULL path.
		if _, _, e := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0,
			uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0); e != 0 {
			return e
		}
	}
	return nil
}

// applyLink gives the symlink name in dirfd its owner and times, without
// following it. Symlinks have no mode of their own.
func (a attrs) applyLink(dirfd int, name string) error {
	if a.uid >= 0 || a.gid >= 0 {
		if err := unix.Fchownat(dirfd, name, a.uid, a.gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
	}
	if ts, ok := a.times(); ok {
		return unix.UtimesNanoAt(dirfd, name, ts[:], unix.AT_SYMLINK_NOFOLLOW)
	}
	return nil
}

func (a attrs) times() ([2]unix.Timespec, bool) {
	if a.mtime.IsZero() {
		return [2]unix.Timespec{}, false
	}
	at := a.atime
	if at.IsZero() {
		at = a.mtime
	}
	return [2]unix.Timespec{timespec(at), timespec(a.mtime)}, true
}

// timespec avoids UnixNano, which overflows outside 1678-2262 (tar headers
// may say anything).
func timespec(t time.Time) unix.Timespec {
	return unix.Timespec{Sec: t.Unix(), Nsec: int64(t.Nanosecond())}
}

// createFile makes the new regular file name in dirfd with r's content and
// attributes a. It never follows or reuses an existing entry (O_EXCL).
func createFile(dirfd int, name string, r io.Reader, a attrs) error {
	fd, err := unix.Openat(dirfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	_, err = io.Copy(f, r)
	if err == nil {
		err = a.applyFd(fd)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
