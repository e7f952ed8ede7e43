package cgroup

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// File is an open cgroup control file: a plain descriptor (kernfs files
// need no poller), read and written at offset 0 in one system call each.
// The zero value is not a file; NoFile is the value of one not open.
type File int

// NoFile marks a File not open.
const NoFile File = -1

// Open opens the control file name of the cgroup directory dir.
func Open(dir, name string, flag int) (File, error) {
	path := filepath.Join(dir, name)
	fd, err := unix.Open(path, flag|unix.O_CLOEXEC, 0)
	if err != nil {
		return NoFile, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return File(fd), nil
}

// Valid reports whether f is open.
func (f File) Valid() bool { return f >= 0 }

// Close closes f if it is open and marks it not open.
func (f *File) Close() {
	if *f >= 0 {
		unix.Close(int(*f))
	}
	*f = NoFile
}

// WriteInt writes v in decimal.
func (f File) WriteInt(v int64) error { return f.WriteString(strconv.FormatInt(v, 10)) }

// WriteString writes s in one write, again if a signal interrupted it:
// a long one (memory.reclaim reclaiming a sandbox's memory) fails with
// EINTR when a signal arrives meanwhile, and Go's runtime sends its
// threads signals of its own (SIGURG, to preempt goroutines). The cgroup
// v2 guest saw memory.reclaim fail so.
func (f File) WriteString(s string) error {
	for {
		_, err := unix.Pwrite(int(f), []byte(s), 0)
		if err != unix.EINTR {
			return err
		}
	}
}

// ReadInt reads a file holding one integer. v2's "max" reads as -1.
func (f File) ReadInt() (int64, error) {
	var b [32]byte
	n, err := unix.Pread(int(f), b[:], 0)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b[:n]))
	if s == "max" {
		return -1, nil
	}
	return strconv.ParseInt(s, 10, 64)
}

// Keyed reads one "key value" line of a flat keyed file (memory.events,
// pids.events, cpu.stat, memory.oom_control); a key the kernel does not
// have reads as 0 (old kernels lack oom_kill, for one).
func (f File) Keyed(key string) (int64, error) {
	var b [1024]byte
	n, err := unix.Pread(int(f), b[:], 0)
	if err != nil {
		return 0, err
	}
	return keyed(b[:n], key)
}

// Keyed2 reads two keys of one flat keyed file in one read.
func (f File) Keyed2(k1, k2 string) (int64, int64, error) {
	var b [1024]byte
	n, err := unix.Pread(int(f), b[:], 0)
	if err != nil {
		return 0, 0, err
	}
	v1, err := keyed(b[:n], k1)
	if err != nil {
		return 0, 0, err
	}
	v2, err := keyed(b[:n], k2)
	return v1, v2, err
}

func keyed(b []byte, key string) (int64, error) {
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		if len(line) > len(key) && line[len(key)] == ' ' && string(line[:len(key)]) == key {
			return strconv.ParseInt(strings.TrimSpace(string(line[len(key)+1:])), 10, 64)
		}
	}
	return 0, nil
}
