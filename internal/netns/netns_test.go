package netns

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/testutil"
)

// newNS makes a namespace with loopback up, closed when t ends.
func newNS(t *testing.T) *os.File {
	t.Helper()
	testutil.RequireRoot(t)
	ns, err := New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	if err := LoopbackUp(ns); err != nil {
		t.Fatal(err)
	}
	return ns
}

// threadsIn counts this process's threads whose network namespace is ns.
func threadsIn(t *testing.T, ns *os.File) int {
	t.Helper()
	var want unix.Stat_t
	if err := unix.Fstat(int(ns.Fd()), &want); err != nil {
		t.Fatal(err)
	}
	tasks, _ := filepath.Glob("/proc/self/task/*/ns/net")
	n := 0
	for _, p := range tasks {
		var st unix.Stat_t
		if unix.Stat(p, &st) == nil && st.Ino == want.Ino && st.Dev == want.Dev {
			n++
		}
	}
	return n
}

// listenIn listens on 127.0.0.1:0 inside ns and echoes what each
// connection sends, then half-closes it.
func listenIn(t *testing.T, ns *os.File) net.Listener {
	t.Helper()
	var ln net.Listener
	if err := Do(ns, func() (err error) { ln, err = net.Listen("tcp", "127.0.0.1:0"); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
				c.(*net.TCPConn).CloseWrite()
			}()
		}
	}()
	return ln
}

func TestDialReachesOnlyTheNamespacesLoopback(t *testing.T) {
	ns := newNS(t)
	ln := listenIn(t, ns)
	addr := ln.Addr().String()

	// The host's loopback does not have it: the port is free there.
	host, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on the host's %s: %v; want it free (the listener is in another namespace)", addr, err)
	}
	host.Close()

	c, err := Dial(context.Background(), ns, "tcp", addr)
	if err != nil {
		t.Fatalf("Dial %s in the namespace: %v", addr, err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "ping"); err != nil {
		t.Fatal(err)
	}
	c.(*net.TCPConn).CloseWrite()
	b, err := io.ReadAll(c)
	if err != nil || string(b) != "ping" {
		t.Errorf("echo through the namespace: %q, %v; want ping", b, err)
	}
	if n := threadsIn(t, ns); n != 0 {
		t.Errorf("%d threads left in the namespace after Dial", n)
	}

	// Nothing listening there: refused, not the host's.
	ln.Close()
	if _, err := Dial(context.Background(), ns, "tcp", addr); !errors.Is(err, unix.ECONNREFUSED) {
		t.Errorf("Dial with nothing listening: %v, want ECONNREFUSED", err)
	}
}

// Many dials at once leave every thread of the process where it was.
func TestConcurrentDialsComeBack(t *testing.T) {
	ns := newNS(t)
	addr := listenIn(t, ns).Addr().String()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := Dial(context.Background(), ns, "tcp", addr)
			if err != nil {
				errs <- err
				return
			}
			c.Close()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := threadsIn(t, ns); n != 0 {
		t.Errorf("%d threads left in the namespace after 64 dials", n)
	}
	host, _ := os.Open("/proc/thread-self/ns/net")
	defer host.Close()
	if same, _ := Same(host, ns); same {
		t.Error("this thread is in the namespace")
	}
}

// A thread that cannot get back is dropped, never reused.
func TestFailedReturnDropsTheThread(t *testing.T) {
	ns := newNS(t)
	var enters int
	setns = func(fd, nstype int) error {
		enters++
		if enters == 2 { // the way back
			return unix.EPERM
		}
		return unix.Setns(fd, nstype)
	}
	defer func() { setns = unix.Setns }()
	err := Do(ns, func() error { return nil })
	if !errors.Is(err, unix.EPERM) {
		t.Fatalf("Do with a failing return: %v, want EPERM", err)
	}
	setns = unix.Setns
	deadline := time.Now().Add(5 * time.Second)
	for threadsIn(t, ns) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the thread stuck in the namespace still runs: it was not dropped")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestDialHonoursContext(t *testing.T) {
	ns := newNS(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Dial(ctx, ns, "tcp", "127.0.0.1:1"); err == nil {
		t.Error("Dial with a canceled context succeeded")
	}
	if err := Do(nil, func() error { return nil }); err == nil {
		t.Error("Do with no namespace succeeded")
	}
}
