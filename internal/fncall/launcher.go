package fncall

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/fncall/proto"
	"github.com/warrenhq/warren/internal/qos"
)

// launcher is the node's warren-fninit: one single-threaded process that
// makes every container by cloning itself (no exec per container; see
// cmd/warren-fninit/fninit.c). Makes are answered in the order they were
// asked; a container's exit is reported once its whole pid namespace is
// gone.
type launcher struct {
	conn *net.UnixConn
	cmd  *exec.Cmd

	mu      sync.Mutex
	waiting []chan made           // MAKEs sent, in order, awaiting MADE
	exits   map[int]chan struct{} // running containers' pid -> closed when reaped
	err     error                 // set once the launcher is gone
	dead    chan struct{}
	closing atomic.Bool
}

// made is the launcher's answer to a MAKE.
type made struct {
	sock   *os.File
	pidfd  int
	exited chan struct{}
	err    error
}

// errLauncherGone is a launcher that exited; containers it made die with it.
var errLauncherGone = errors.New("fncall: warren-fninit exited")

// startLauncher starts path as the node's launcher. It dies with this
// process (PDEATHSIG, from a thread that lives as long as it does).
func startLauncher(path string, log *slog.Logger) (*launcher, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	ours := os.NewFile(uintptr(fds[0]), "fninit")
	child := os.NewFile(uintptr(fds[1]), "fninit-child")
	defer child.Close()
	c, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		child.Close()
		return nil, err
	}
	l := &launcher{conn: c.(*net.UnixConn), exits: map[int]chan struct{}{}, dead: make(chan struct{})}
	l.cmd = exec.Command(path, fmt.Sprintf("proto=%d", proto.Version))
	l.cmd.Env = []string{}
	l.cmd.ExtraFiles = []*os.File{child} // proto.Fd
	l.cmd.Stderr = logWriter{log}
	// A session of its own, without the agent's terminal; its containers
	// stay in it (one scheduler autogroup for them all).
	l.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setsid: true}
	started := make(chan error, 1)
	go func() {
		// PDEATHSIG fires when the thread that started the child ends:
		// this one stays until the launcher does.
		runtime.LockOSThread()
		if err := l.cmd.Start(); err != nil {
			started <- fmt.Errorf("start %s: %w", path, err)
			return
		}
		// Its containers, cloned from it, inherit it: latency work,
		// before the agent in a host-wide OOM (internal/qos).
		if err := qos.SetOOMScoreAdj(l.cmd.Process.Pid, qos.OOMScoreLatency); err != nil {
			l.cmd.Process.Kill()
			l.cmd.Wait()
			started <- fmt.Errorf("start %s: %w", path, err)
			return
		}
		started <- nil
		err := l.cmd.Wait()
		l.conn.Close()
		if !l.closing.Load() {
			log.Warn("fncall: warren-fninit exited; its containers died with it", "err", err)
		}
	}()
	if err := <-started; err != nil {
		l.conn.Close()
		return nil, err
	}
	go l.read()
	return l, nil
}

// read dispatches the launcher's messages until it is gone.
func (l *launcher) read() {
	var err error
	for err == nil {
		err = l.readOne()
	}
	l.mu.Lock()
	l.err = fmt.Errorf("%w: %v", errLauncherGone, err)
	waiting, exits := l.waiting, l.exits
	l.waiting, l.exits = nil, map[int]chan struct{}{}
	l.mu.Unlock()
	close(l.dead)
	for _, w := range waiting {
		w <- made{err: l.err}
	}
	// The containers get SIGKILL from the kernel as the launcher dies;
	// exits without a launcher to report them: no pid namespace outlives
	// its init's reaping, and the cgroups' removal waits for them anyway.
	for _, ch := range exits {
		close(ch)
	}
	if !l.closing.Load() { // it broke the protocol, or its socket did
		l.cmd.Process.Kill()
	}
}

func (l *launcher) readOne() error {
	// The header through ReadMsgUnix: a MADE's descriptors come with its
	// first byte. Nothing reads past a frame's end, so the next header
	// always starts a read.
	var h [4]byte
	oob := make([]byte, unix.CmsgSpace(2*4))
	n, oobn, _, _, err := l.conn.ReadMsgUnix(h[:], oob)
	if err != nil {
		return err
	}
	if n < 4 {
		if _, err := io.ReadFull(l.conn, h[n:]); err != nil {
			return err
		}
	}
	var fds []int
	if oobn > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err == nil && len(msgs) > 0 {
			fds, _ = unix.ParseUnixRights(&msgs[0])
		}
	}
	t, body, err := proto.ReadBody(l.conn, h)
	if err != nil {
		closeFds(fds)
		return err
	}
	d := proto.NewDecoder(body)
	switch t {
	case proto.TypeMade:
		pid, errno := int(d.U64()), syscall.Errno(d.U64())
		var m made
		switch {
		case d.Err != nil:
			m.err = d.Err
		case errno != 0:
			m.err = fmt.Errorf("make container: %w", errno)
		case len(fds) != 2:
			m.err = fmt.Errorf("make container: %d descriptors in the answer, want 2", len(fds))
		default:
			// Non-blocking, so the runtime's poller serves it and a
			// Close ends a blocked Read (and the container with it).
			_ = unix.SetNonblock(fds[0], true)
			m.sock = os.NewFile(uintptr(fds[0]), "container")
			m.pidfd = fds[1]
			m.exited = make(chan struct{})
			fds = nil
		}
		closeFds(fds)
		l.mu.Lock()
		if m.exited != nil {
			l.exits[pid] = m.exited
		}
		if len(l.waiting) == 0 {
			l.mu.Unlock()
			return errors.New("fncall: warren-fninit answered a make nobody asked for")
		}
		w := l.waiting[0]
		l.waiting = l.waiting[1:]
		l.mu.Unlock()
		w <- m
	case proto.TypeExited:
		pid := int(d.U64())
		l.mu.Lock()
		ch := l.exits[pid]
		delete(l.exits, pid)
		l.mu.Unlock()
		if ch != nil {
			close(ch)
		}
	default:
		closeFds(fds)
		return fmt.Errorf("fncall: unexpected message %q from warren-fninit", t)
	}
	return nil
}

// make asks for one container in setup's image, in netns, joining the
// cgroups whose cgroup.procs files are given (descriptors open for
// writing).
func (l *launcher) make(setup *proto.Setup, netns *os.File, cgroupProcs []int) (made, error) {
	frame, err := proto.Make(setup)
	if err != nil {
		return made{}, err
	}
	ch := make(chan made, 1)
	l.mu.Lock()
	if l.err != nil {
		l.mu.Unlock()
		return made{}, l.err
	}
	l.waiting = append(l.waiting, ch)
	fds := append([]int{int(netns.Fd())}, cgroupProcs...)
	_, _, err = l.conn.WriteMsgUnix(frame, unix.UnixRights(fds...), nil)
	if err != nil {
		l.waiting = l.waiting[:len(l.waiting)-1]
		l.mu.Unlock()
		return made{}, fmt.Errorf("%w: %v", errLauncherGone, err)
	}
	l.mu.Unlock()
	runtime.KeepAlive(netns)
	// The answer comes at once (a clone), and is always awaited: the
	// container it makes is never lost.
	m := <-ch
	return m, m.err
}

// alive reports whether the launcher still runs.
func (l *launcher) alive() bool {
	return !closed(l.dead)
}

// close ends the launcher, and with it every container it made.
func (l *launcher) close() {
	l.closing.Store(true)
	l.conn.Close()
	<-l.dead
}

func closeFds(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// logWriter sends the launcher's stderr (it only writes there when it
// fails) to the log.
type logWriter struct{ log *slog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.log.Warn("fncall: warren-fninit", "msg", string(p))
	return len(p), nil
}
