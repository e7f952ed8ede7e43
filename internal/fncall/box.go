package fncall

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/fncall/proto"
)

// box is one pre-created container: a warren-fninit process, pid 1 of its
// own namespaces, in its own cgroups, with the runtime's root built and
// nothing running. A box serves exactly one call and is then destroyed.
type box struct {
	id      string
	cmd     *exec.Cmd
	sock    *os.File
	enc     *json.Encoder
	replies chan proto.Reply // closed when fninit's socket ends
	cg      *cgroup
	created time.Time
	exited  chan struct{} // closed when fninit has exited and been reaped
	// netns is the box's network namespace, back to netnsPool once every
	// process of the box is gone.
	netns     *os.File
	netnsPool *netnsPool
}

// boxSpec is what newBox needs; a pool fills it in from its runtime.
type boxSpec struct {
	init         string // warren-fninit's path
	cgroupParent string
	setup        proto.Setup
	cpus         float64
	idleMemory   int64 // the limit while waiting in the pool
	netns        *netnsPool
}

// newBox starts fninit and waits until the container is ready. On error
// nothing is left behind.
func newBox(ctx context.Context, spec boxSpec) (b *box, err error) {
	id := "fn-" + randomHex(6)
	cg, err := newCgroup(spec.cgroupParent, id)
	if err != nil {
		return nil, err
	}
	b = &box{id: id, cg: cg, replies: make(chan proto.Reply, 1), created: time.Now(), exited: make(chan struct{})}
	defer func() {
		if err != nil {
			b.destroy()
		}
	}()
	if err := cg.setMemory(spec.idleMemory); err != nil {
		return b, err
	}
	if spec.cpus > 0 {
		if err := cg.setCPUs(spec.cpus); err != nil {
			return b, err
		}
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return b, err
	}
	b.sock = os.NewFile(uintptr(fds[0]), "fninit")
	child := os.NewFile(uintptr(fds[1]), "fninit-child")
	defer child.Close()

	b.cmd = exec.Command(spec.init)
	b.cmd.Env = []string{}
	if b.netns, err = spec.netns.get(); err != nil {
		return b, err
	}
	b.netnsPool = spec.netns
	b.cmd.ExtraFiles = []*os.File{child, b.netns} // proto.Fd, proto.NetnsFd
	b.cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS,
		Pdeathsig:  syscall.SIGKILL, // an agent that dies takes its pool along
	}
	if err := b.cmd.Start(); err != nil {
		return b, fmt.Errorf("start %s: %w", spec.init, err)
	}
	go func() { _ = b.cmd.Wait(); close(b.exited) }()
	// fninit blocks reading Setup: it is in its cgroups before it does
	// anything of the container's.
	if err := cg.join(b.cmd.Process.Pid); err != nil {
		return b, err
	}
	b.enc = json.NewEncoder(b.sock)
	go b.read()
	if err := b.enc.Encode(proto.Message{Setup: &spec.setup}); err != nil {
		return b, fmt.Errorf("send setup: %w", err)
	}
	r, err := b.reply(ctx, 30*time.Second)
	if err != nil {
		return b, err
	}
	if !r.Ready {
		return b, fmt.Errorf("container setup: %s", r.Error)
	}
	return b, nil
}

func (b *box) read() {
	defer close(b.replies)
	dec := json.NewDecoder(bufio.NewReader(b.sock))
	for {
		var r proto.Reply
		if err := dec.Decode(&r); err != nil {
			return
		}
		b.replies <- r
	}
}

// errBoxGone is a box whose fninit died or stopped answering.
var errBoxGone = errors.New("container's init is gone")

// reply waits for fninit's next reply.
func (b *box) reply(ctx context.Context, timeout time.Duration) (proto.Reply, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case r, ok := <-b.replies:
		if !ok {
			return r, errBoxGone
		}
		if r.Error != "" && !r.Ready && r.Result == nil {
			return r, errors.New(r.Error)
		}
		return r, nil
	case <-ctx.Done():
		return proto.Reply{}, ctx.Err()
	case <-t.C:
		return proto.Reply{}, fmt.Errorf("%w: no answer in %s", errBoxGone, timeout)
	}
}

// send writes one message to fninit.
func (b *box) send(m proto.Message) error {
	if err := b.enc.Encode(m); err != nil {
		return fmt.Errorf("%w: %v", errBoxGone, err)
	}
	return nil
}

// alive reports whether fninit still runs.
func (b *box) alive() bool {
	select {
	case <-b.exited:
		return false
	default:
		return true
	}
}

// destroy ends the container: closing the socket makes fninit exit, and
// SIGKILL makes sure; as pid 1 its death kills every process in the
// namespace. Then the cgroups go. Safe to call on a half-made box.
func (b *box) destroy() error {
	if b.sock != nil {
		b.sock.Close()
	}
	started := b.cmd != nil && b.cmd.Process != nil
	if started {
		_ = b.cmd.Process.Kill()
		<-b.exited // pid 1 gone: the kernel has killed every other process
	}
	if b.netns != nil {
		if started {
			b.netnsPool.put(b.netns)
		} else {
			b.netns.Close()
		}
	}
	return b.cg.remove()
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
