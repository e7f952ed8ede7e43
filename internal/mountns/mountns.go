// Package mountns keeps a node's per-sandbox mounts out of the host's
// mount table.
//
// Every process that reads /proc/self/mountinfo pays for every line in
// it, and runc reads it several times per create, start and delete (and
// the kernel copies the whole table into each new mount namespace). With
// three mounts per sandbox in the host's table (its root overlay and two
// idmapped clones), a node with 2,000 sandboxes spent a third of its CPU
// in show_mountinfo and creates slowed down with the count (issue 18's
// bench/density). So a sandbox's mounts are made in a Scratch namespace:
// a private copy of the host's, holding only them, in which the runtime
// is started; the container's own namespace is a copy of that. The agent
// keeps a detached clone of the root (NS.Clone) on a Shelf, a namespace
// of its own, to reach the sandbox's files; the host's table never sees
// any of it.
//
// A Go process cannot move itself into another mount namespace (its
// threads share one fs_struct), but one OS thread can, after unsharing
// its filesystem attributes: every function here that changes namespace
// does so on a thread of its own that ends with it (package osthread).
package mountns

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/osthread"
)

// NS is a mount namespace held by a descriptor.
type NS struct{ f *os.File }

// New makes a mount namespace: a copy of the caller's with every mount
// private, so nothing mounted in it propagates back to the host (on hosts
// whose / is shared, as under systemd) and nothing the host mounts later
// appears in it. It lives until Close and until the last process started
// in it (Command) is gone.
func New() (*NS, error) {
	var f *os.File
	err := osthread.Run(func() error {
		if err := unsharePrivate(); err != nil {
			return err
		}
		var err error
		f, err = os.Open("/proc/thread-self/ns/mnt")
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("scratch mount namespace: %w", err)
	}
	return &NS{f: f}, nil
}

// unsharePrivate moves the calling thread (one that ends with its
// goroutine) into a new mount namespace, a copy of its own with every
// mount private.
func unsharePrivate() error {
	if err := unix.Unshare(unix.CLONE_FS | unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unshare mount namespace: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	return nil
}

// Of returns the mount namespace of process pid.
func Of(pid int) (*NS, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	if err != nil {
		return nil, err
	}
	return &NS{f: f}, nil
}

// Close drops the descriptor. The namespace goes once nothing else holds
// it, and with it every mount made in it that nothing references.
func (n *NS) Close() error { return n.f.Close() }

// Enter moves the calling thread into n. Only for a thread that ends
// with its goroutine (osthread.Run's, diskquota.OnThread's): a thread the
// scheduler reuses would carry the namespace into unrelated code.
func (n *NS) Enter() error {
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("unshare fs: %w", err)
	}
	if err := unix.Setns(int(n.f.Fd()), unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("join mount namespace: %w", err)
	}
	return nil
}

// Run runs f on a thread of its own inside n.
func (n *NS) Run(f func() error) error {
	return osthread.Run(func() error {
		if err := n.Enter(); err != nil {
			return err
		}
		return f()
	})
}

// RunCmd runs cmd to its end inside n: it, and what it forks, start with
// n's mounts (the child of a fork gets the forking thread's namespace).
func (n *NS) RunCmd(cmd *exec.Cmd) error {
	return n.Run(cmd.Run)
}

// Clone returns a detached clone of the mount at path in n (open_tree
// OPEN_TREE_CLONE, not recursive): a descriptor through which its files
// stay reachable from any namespace, in no mount table, for as long as it
// is open. dirfd and path are as for openat; AT_EMPTY_PATH clones dirfd's
// own mount.
func (n *NS) Clone(dirfd int, path string, flags uint) (*os.File, error) {
	var fd int
	err := n.Run(func() error {
		var err error
		fd, err = unix.OpenTree(dirfd, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|flags)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("clone mount %s: open_tree: %w", path, err)
	}
	return os.NewFile(uintptr(fd), path), nil
}

// Shelf keeps detached mounts (Clone's) alive without a descriptor each:
// each is attached under a name in a namespace of the shelf's own, held
// by one OS thread that lives as long as the shelf. A node with 10,000
// sandboxes would otherwise hold 10,000 descriptors for their roots, and
// hosts cap a process's descriptors (20,000 is common; raising it past
// the hard limit takes CAP_SYS_RESOURCE). The shelf's namespace is a
// private copy of the caller's, so the host's table never sees what is on
// it, and runtimes started elsewhere never copy it.
//
// Its mounts stay reachable from every thread of the process through
// the thread's root (/proc/PID/task/TID/root): Open returns a descriptor
// per call, which pins the mount for as long as it is open, even after
// Drop. Everything on the shelf goes when it is closed or the process
// ends.
type Shelf struct {
	calls chan func()
	quit  chan struct{} // closed by Close
	root  string        // the thread's root, as seen from any thread of this process
	dir   string        // where the names are, inside the shelf's namespace
	dev   uint64        // the device of dir's tmpfs
	once  sync.Once
}

// NewShelf starts a shelf whose mounts are attached under dir (an
// existing directory, covered with a private tmpfs in the shelf's
// namespace only).
func NewShelf(dir string) (*Shelf, error) {
	s := &Shelf{calls: make(chan func()), quit: make(chan struct{}), dir: dir}
	started := make(chan error, 1)
	// On a thread of its own that ends with the shelf, and its namespace
	// with it.
	go osthread.Run(func() error {
		err := s.setup()
		started <- err
		if err == nil {
			s.serve()
		}
		return err
	})
	if err := <-started; err != nil {
		return nil, fmt.Errorf("mount shelf: %w", err)
	}
	return s, nil
}

// setup moves the calling thread into the shelf's namespace, with a
// private tmpfs over dir.
func (s *Shelf) setup() error {
	if err := unsharePrivate(); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", s.dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0700,size=1m"); err != nil {
		return fmt.Errorf("mount tmpfs on %s: %w", s.dir, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(s.dir, &st); err != nil {
		return err
	}
	s.dev = st.Dev
	s.root = fmt.Sprintf("/proc/%d/task/%d/root", unix.Getpid(), unix.Gettid())
	return nil
}

// serve runs calls on the shelf's thread until Close.
func (s *Shelf) serve() {
	for {
		select {
		case f := <-s.calls:
			f()
		case <-s.quit:
			return
		}
	}
}

// do runs f on the shelf's thread.
func (s *Shelf) do(f func() error) error {
	done := make(chan error, 1)
	select {
	case s.calls <- func() { done <- f() }:
		return <-done
	case <-s.quit:
		return errors.New("shelf: closed")
	}
}

// Put attaches m, a detached mount (Clone's), under name. The caller
// still closes m.
func (s *Shelf) Put(name string, m *os.File) error {
	if err := validName(name); err != nil {
		return err
	}
	return s.do(func() error {
		target := filepath.Join(s.dir, name)
		if err := os.Mkdir(target, 0o700); err != nil {
			return fmt.Errorf("shelf: %w", err)
		}
		if err := unix.MoveMount(int(m.Fd()), "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			os.Remove(target)
			return fmt.Errorf("shelf: attach %s: move_mount: %w", name, err)
		}
		return nil
	})
}

// Open returns a descriptor of the mount put under name (O_PATH, a
// directory): /proc/self/fd/N names its root while it is open. An
// unknown name is fs.ErrNotExist.
func (s *Shelf) Open(name string) (*os.File, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	select {
	case <-s.quit:
		return nil, errors.New("shelf: closed")
	default:
	}
	// From the shelf's own directory, checked to be its tmpfs: were the
	// thread gone and its id reused, the path would lead elsewhere.
	p := filepath.Join(s.root, s.dir)
	dirfd, err := unix.Open(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: p, Err: err}
	}
	defer unix.Close(dirfd)
	var st unix.Stat_t
	if err := unix.Fstat(dirfd, &st); err != nil || st.Dev != s.dev {
		return nil, fmt.Errorf("shelf: %s is not the shelf's (%v)", p, err)
	}
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: filepath.Join(p, name), Err: err}
	}
	f := os.NewFile(uintptr(fd), filepath.Join(p, name))
	// Only a mount put there, not the bare directory of a Put under way
	// or a Drop done: that is on the shelf's own tmpfs.
	if err := unix.Fstat(fd, &st); err != nil || st.Dev == s.dev {
		f.Close()
		return nil, &os.PathError{Op: "open", Path: f.Name(), Err: fs.ErrNotExist}
	}
	return f, nil
}

// Drop detaches the mount put under name; descriptors Open returned keep
// it until they are closed. Dropping an unknown name is not an error.
func (s *Shelf) Drop(name string) error {
	if err := validName(name); err != nil {
		return err
	}
	return s.do(func() error {
		target := filepath.Join(s.dir, name)
		if err := unix.Unmount(target, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("shelf: detach %s: %w", name, err)
		}
		if err := os.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("shelf: %w", err)
		}
		return nil
	})
}

// Close ends the shelf's thread, and with its namespace every mount on
// it that no descriptor holds.
func (s *Shelf) Close() error {
	s.once.Do(func() { close(s.quit) })
	return nil
}

func validName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') {
		return fmt.Errorf("shelf: bad name %q", name)
	}
	return nil
}
