package container

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/errdefs"
)

// runcState is the part of runc's own state file (<root>/<id>/state.json,
// libcontainer's State, stable since runc 1.0) the backend reads. Reading
// it costs a file read instead of a `runc state` fork and exec.
type runcState struct {
	InitPid     int               `json:"init_process_pid"`
	InitStart   uint64            `json:"init_process_start"`
	CgroupPaths map[string]string `json:"cgroup_paths"`
}

// readRuncState reads runc's state for id. ErrNotFound if runc has none.
// runc's init waits on the exec fifo until started, and removes it after.
func (c *Container) readRuncState(id string) (*runtimeState, error) {
	b, err := os.ReadFile(filepath.Join(c.runc.root, id, "state.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, errdefs.New(errdefs.ErrNotFound, "sandbox_not_found", "no runtime state for sandbox %s", id)
	}
	if err != nil {
		return nil, err
	}
	var st runcState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, err
	}
	return &runtimeState{InitPid: st.InitPid, InitStart: st.InitStart, CgroupPaths: st.CgroupPaths,
		Created: exists(c.runcFifo(id)), RootPid: st.InitPid}, nil
}

// runcFifo is runc's exec fifo of id.
func (c *Container) runcFifo(id string) string { return filepath.Join(c.runc.root, id, "exec.fifo") }

// created reports whether the sandbox was created but not started.
func (c *Container) created(s *sandbox) bool {
	if !s.rt.gvisor() {
		return exists(c.runcFifo(s.spec.ID)) // one stat, no parse
	}
	st, err := c.readState(s.rt, s.spec.ID)
	return err == nil && st.Created
}

// initProc identifies a container's init by pid and start time (clock
// ticks since boot, /proc/<pid>/stat field 22), so that a recycled pid is
// never mistaken for it.
type initProc struct {
	pid   int
	start uint64
}

// alive reports whether the process is still running (not a zombie).
func (p initProc) alive() bool {
	if p.pid <= 0 {
		return false
	}
	state, start, err := procStat(p.pid)
	return err == nil && start == p.start && state != 'Z' && state != 'X'
}

// procStat returns the state and start time of pid from /proc/<pid>/stat.
func procStat(pid int) (state byte, start uint64, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// The command name (field 2) is in parentheses and may contain spaces
	// and parentheses: fields resume after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	start, err = strconv.ParseUint(f[19], 10, 64) // field 22
	return f[0][0], start, err
}

// signal sends sig to p through a pidfd, so that it cannot hit a process
// that reused the pid. A process already gone is not an error.
func (p initProc) signal(sig unix.Signal) error {
	fd, err := unix.PidfdOpen(p.pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("pidfd_open %d: %w", p.pid, err)
	}
	defer unix.Close(fd)
	if !p.alive() { // checked after open: the pidfd now pins the identity
		return nil
	}
	if err := unix.PidfdSendSignal(fd, sig, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("signal %d: %w", p.pid, err)
	}
	return nil
}

// wait blocks until p exits or ctx ends.
func (p initProc) wait(ctx context.Context) error {
	if p.pid <= 0 {
		return nil // never had one
	}
	return waitExit(ctx, p.pid, p.alive)
}

// waitExit blocks until pid exits or ctx ends. It works for processes that
// are not the agent's children (recovered sandboxes): a pidfd becomes
// readable when the process exits, and the runtime's poller waits on it,
// so many waiters cost no threads. same, checked once the pidfd is open,
// tells whether pid is still the process meant, as opposed to a recycled
// pid; nil trusts it.
func waitExit(ctx context.Context, pid int, same func() bool) error {
	if pid <= 0 {
		return fmt.Errorf("waitExit: bad pid %d", pid)
	}
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	// A pid already reaped is ESRCH, or, on kernels before 6.9 while its
	// struct pid is still referenced (runc just reaped it), EINVAL: the
	// process has no thread group left. Either way it has exited. Seen on
	// Debian 12's 6.1 (scripts/test-cgroup-v2): missing it left an exec
	// whose background child holds its output waiting for that child.
	if errors.Is(err, unix.ESRCH) || errors.Is(err, unix.EINVAL) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	defer f.Close()
	if same != nil && !same() {
		return nil
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { f.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	err = rc.Read(func(fd uintptr) bool {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, _ := unix.Poll(pfd, 0)
		return n > 0
	})
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return ctx.Err()
	}
	return err
}
