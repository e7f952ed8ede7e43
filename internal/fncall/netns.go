package fncall

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// netnsPool recycles network namespaces between containers. Making a
// network namespace is the most expensive part of a fresh container (the
// kernel tears one down with RCU waits, on a worker thread, long after the
// last process left), and nothing of a call survives in it: it has only lo,
// a program cannot reconfigure it (no CAP_NET_ADMIN in the initial user
// namespace), and its sockets die with the container's processes. Two live
// containers never share one. Every other namespace, the cgroups and the
// root filesystem are new for every container.
type netnsPool struct{ list freeList[*os.File] }

func newNetnsPool(max int) *netnsPool { return &netnsPool{list: freeList[*os.File]{max: max}} }

// get returns a namespace no live container uses, with lo up.
func (p *netnsPool) get() (*os.File, error) {
	if f, ok := p.list.pop(); ok {
		return f, nil
	}
	return newNetns()
}

// put takes back the namespace of a container whose processes are all gone.
func (p *netnsPool) put(f *os.File) {
	if !p.list.push(f) {
		f.Close()
	}
}

func (p *netnsPool) close() {
	for _, f := range p.list.close() {
		f.Close()
	}
}

// newNetns makes a network namespace on a locked thread, brings its lo up
// and returns a handle to it, putting the thread back where it was.
func newNetns() (ns *os.File, err error) {
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer orig.Close()
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("new network namespace: %w", err)
	}
	defer func() {
		// A thread that cannot go back stays locked and dies with this
		// goroutine, instead of serving others in the wrong namespace.
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
	}()
	if ns, err = os.Open("/proc/thread-self/ns/net"); err != nil {
		return nil, err
	}
	if err := loopbackUp(); err != nil {
		ns.Close()
		return nil, fmt.Errorf("lo up: %w", err)
	}
	return ns, nil
}

// loopbackUp brings up lo in the calling thread's network namespace.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}
