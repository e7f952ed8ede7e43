// Package netns runs code inside a network namespace from the host, the
// one place warren enters one: the node reaches a sandbox's ports by
// creating sockets in its namespace (Dial), whatever its network policy,
// and the network manager configures interfaces there (Do).
//
// A namespace is entered per OS thread (setns(2) with CLONE_NEWNET), so Do
// runs its function on a thread locked to it, never the main thread
// (osthread.Locked), and puts the thread back in the namespace it came
// from before unlocking it. If that fails the thread ends with the call,
// so no other goroutine ever runs in the wrong namespace. A socket keeps the namespace it was made in
// for its whole life, so a connection Dial returns works from any thread.
package netns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/osthread"
)

// setns is unix.Setns; tests replace it to make the way back fail.
var setns = unix.Setns

// Do runs fn on an OS thread inside the network namespace ns (an open
// namespace file, such as /proc/<pid>/ns/net) and returns its error. fn
// must not start goroutines that expect to be in ns: they run on other
// threads. Files and sockets fn creates stay in ns after it returns.
func Do(ns *os.File, fn func() error) error {
	if ns == nil {
		return errors.New("netns: no namespace")
	}
	var ferr error
	osthread.Locked(func() bool {
		// The thread's own namespace, to come back to: another thread of
		// this process may be elsewhere, so not /proc/self.
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			ferr = fmt.Errorf("netns: %w", err)
			return true
		}
		defer orig.Close()
		if err := setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			ferr = fmt.Errorf("netns: enter %s: %w", ns.Name(), err)
			return true // still where it was
		}
		ferr = fn()
		if err := setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			// The thread ends with this call.
			ferr = errors.Join(ferr, fmt.Errorf("netns: return from %s: %w (thread dropped)", ns.Name(), err))
			return false
		}
		return true
	})
	return ferr
}

// Dial connects to addr ("127.0.0.1:8000") over network ("tcp") from
// inside the network namespace ns, as net.Dialer.DialContext does: ctx
// bounds the connect. The connection belongs to ns and is used from
// anywhere.
func Dial(ctx context.Context, ns *os.File, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := Do(ns, func() error {
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	if err != nil && c != nil {
		c.Close()
		c = nil
	}
	return c, err
}

// New makes a network namespace with nothing but a loopback interface,
// down, as the kernel makes one, and returns it open. It lives as long as
// the file or anything else inside it (a socket, a process, a bind mount).
// It needs CAP_SYS_ADMIN.
func New() (*os.File, error) {
	var f *os.File
	var ferr error
	osthread.Locked(func() bool {
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			ferr = fmt.Errorf("netns: %w", err)
			return true
		}
		defer orig.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ferr = fmt.Errorf("netns: unshare: %w", err)
			return true
		}
		if f, err = os.Open("/proc/thread-self/ns/net"); err != nil {
			ferr = fmt.Errorf("netns: %w", err)
		}
		if err := setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			if f != nil {
				f.Close()
				f = nil
			}
			ferr = fmt.Errorf("netns: return from a new namespace: %w (thread dropped)", err)
			return false
		}
		return true
	})
	return f, ferr
}

// LoopbackUp sets the loopback interface of ns up, which a namespace New
// made lacks (container runtimes do this for their containers).
func LoopbackUp(ns *os.File) error {
	return Do(ns, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("netns: socket: %w", err)
		}
		defer unix.Close(fd)
		ifr, err := unix.NewIfreq("lo")
		if err != nil {
			return err
		}
		if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
			return fmt.Errorf("netns: lo flags: %w", err)
		}
		ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
		if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
			return fmt.Errorf("netns: set lo up: %w", err)
		}
		return nil
	})
}

// Same reports whether two namespace files name the same namespace.
func Same(a, b *os.File) (bool, error) {
	var sa, sb unix.Stat_t
	if err := unix.Fstat(int(a.Fd()), &sa); err != nil {
		return false, err
	}
	if err := unix.Fstat(int(b.Fd()), &sb); err != nil {
		return false, err
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino, nil
}
