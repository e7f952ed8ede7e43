package fncall

import (
	"fmt"
	"os"

	"github.com/warrenhq/warren/internal/netns"
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

// newNetns makes a network namespace with its lo up.
func newNetns() (*os.File, error) {
	ns, err := netns.New()
	if err != nil {
		return nil, err
	}
	if err := netns.LoopbackUp(ns); err != nil {
		ns.Close()
		return nil, fmt.Errorf("lo up: %w", err)
	}
	return ns, nil
}
