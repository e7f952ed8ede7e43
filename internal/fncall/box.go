package fncall

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/fncall/proto"
)

// box is one pre-created container: a pid 1 cloned by the launcher into
// its own namespaces, in its own cgroups, with the runtime's root built and
// nothing running. A box serves exactly one call and is then destroyed.
type box struct {
	id      string
	pidfd   int
	sock    *os.File
	frames  *proto.Reader // the container's replies, read by whoever waits for one
	cg      *cgroup
	cgroups *cgroupPool // cg goes back there
	created time.Time
	exited  chan struct{} // closed when pid 1 has been reaped: every process of the box is gone
	// netns is the box's network namespace, back to netnsPool once every
	// process of the box is gone.
	netns     *os.File
	netnsPool *netnsPool
}

// boxSpec is what newBox needs; a pool fills it in from its runtime.
type boxSpec struct {
	launcher func() (*launcher, error)
	cgroups  *cgroupPool
	setup    proto.Setup
	cpus     float64
	netns    *netnsPool
}

// newBox has the launcher make a container and waits until it is ready. On
// error nothing is left behind.
func newBox(ctx context.Context, spec boxSpec) (b *box, err error) {
	cg, err := spec.cgroups.get(spec.cpus > 0)
	if err != nil {
		return nil, err
	}
	b = &box{id: "fn-" + randomHex(6), cg: cg, cgroups: spec.cgroups, pidfd: -1, created: time.Now()}
	defer func() {
		if err != nil {
			b.destroy()
		}
	}()
	if err := cg.setCPUs(spec.cpus); err != nil {
		return b, err
	}
	l, err := spec.launcher()
	if err != nil {
		return b, err
	}
	if b.netns, err = spec.netns.get(); err != nil {
		return b, err
	}
	b.netnsPool = spec.netns
	m, err := l.make(&spec.setup, b.netns, cg.join(spec.cpus > 0))
	if err != nil {
		return b, err
	}
	b.pidfd, b.sock, b.exited = m.pidfd, m.sock, m.exited
	b.frames = proto.NewReader(b.sock)
	r, err := b.reply(ctx, 30*time.Second)
	if err != nil {
		return b, err
	}
	if !r.Ready {
		return b, fmt.Errorf("container setup: %s", r.Error)
	}
	return b, nil
}

// errBoxGone is a box whose fninit died or stopped answering.
var errBoxGone = errors.New("container's init is gone")

// errNoReplyYet is next's answer when the deadline came first.
var errNoReplyYet = errors.New("no reply yet")

// next reads the container's next reply, waiting in the runtime's poller
// until deadline at most (then errNoReplyYet, and the stream is intact).
// The caller's goroutine reads: no hand-off per reply.
func (b *box) next(deadline time.Time) (proto.Reply, error) {
	if err := b.sock.SetReadDeadline(deadline); err != nil {
		return proto.Reply{}, fmt.Errorf("%w: %v", errBoxGone, err)
	}
	t, body, err := b.frames.Next()
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return proto.Reply{}, errNoReplyYet
	case err != nil:
		return proto.Reply{}, fmt.Errorf("%w: %v", errBoxGone, err)
	}
	r, err := proto.DecodeReply(t, body)
	if err != nil {
		return r, fmt.Errorf("%w: %v", errBoxGone, err)
	}
	return r, nil
}

// reply waits up to timeout for fninit's next reply, which must not be an
// error. A cancelled ctx is noticed within replyPoll.
func (b *box) reply(ctx context.Context, timeout time.Duration) (proto.Reply, error) {
	end := time.Now().Add(timeout)
	for {
		r, err := b.next(earliest(end, time.Now().Add(replyPoll)))
		if err == errNoReplyYet {
			if err := ctx.Err(); err != nil {
				return r, err
			}
			if time.Now().Before(end) {
				continue
			}
			return r, fmt.Errorf("%w: no answer in %s", errBoxGone, timeout)
		}
		if err == nil && r.Error != "" && !r.Ready && r.Result == nil {
			err = errors.New(r.Error)
		}
		return r, err
	}
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// replyPoll is how often a wait for a reply looks at its context.
const replyPoll = 100 * time.Millisecond

// send writes one frame to the container.
func (b *box) send(frame []byte, err error) error {
	if err != nil {
		return err
	}
	if _, err := b.sock.Write(frame); err != nil {
		return fmt.Errorf("%w: %v", errBoxGone, err)
	}
	return nil
}

// alive reports whether the container's pid 1 still runs.
func (b *box) alive() bool {
	return !closed(b.exited)
}

// destroy ends the container: closing its socket makes pid 1 exit, and as
// the pid namespace's init its death kills every process in it; SIGKILL
// makes sure if it does not go. Then the cgroups go. Safe to call on a
// half-made box.
func (b *box) destroy() error {
	if b.sock != nil {
		b.sock.Close()
	}
	if b.exited != nil {
		t := time.NewTimer(killGrace)
		select {
		case <-b.exited:
		case <-t.C:
			_ = unix.PidfdSendSignal(b.pidfd, unix.SIGKILL, nil, 0)
			<-b.exited
		}
		t.Stop()
		// Reported by the launcher, pid 1 was reaped after its whole
		// namespace; if the launcher died instead, the kernel is still
		// ending the container: the pidfd says when it has.
		fds := []unix.PollFd{{Fd: int32(b.pidfd), Events: unix.POLLIN}}
		_, _ = unix.Poll(fds, int(killGrace/time.Millisecond))
	}
	if b.pidfd >= 0 {
		unix.Close(b.pidfd)
	}
	if b.netns != nil {
		if b.exited != nil {
			b.netnsPool.put(b.netns)
		} else {
			b.netns.Close()
		}
	}
	return b.cgroups.put(b.cg)
}

// closed reports whether ch is closed (nothing is ever sent on it).
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
