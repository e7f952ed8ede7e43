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
// keeps a detached clone of the root (Scratch.Clone) to reach the
// sandbox's files, and the host's table never sees any of it.
//
// A Go process cannot move itself into another mount namespace (its
// threads share one fs_struct), but one OS thread can, after unsharing
// its filesystem attributes: every function here that changes namespace
// does so on a thread of its own that ends with it (package osthread).
package mountns

import (
	"fmt"
	"os"
	"os/exec"

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
		if err := unix.Unshare(unix.CLONE_FS | unix.CLONE_NEWNS); err != nil {
			return fmt.Errorf("unshare mount namespace: %w", err)
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			return fmt.Errorf("make mounts private: %w", err)
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
