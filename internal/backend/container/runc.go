package container

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/errdefs"
)

// runc runs one runc subcommand whose stdio is not the container's, and
// returns its error message on failure.
func (c *Container) runc(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, c.cfg.RuncPath, append([]string{"--root", c.cfg.RuncRoot}, args...)...)
	cmd.Env = c.runcEnv
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = err.Error()
		}
		return fmt.Errorf("runc %s: %s", args[0], msg)
	}
	return nil
}

// runcCreate runs `runc create`. The container's init inherits runc's
// stdio, so runc gets /dev/null and reports errors through a log file
// instead of a pipe that the init would hold open forever. It also starts
// a session of its own: a signal to the agent's process group (Ctrl-C in
// a terminal) must not reach the sandboxes.
func (c *Container) runcCreate(ctx context.Context, id, bundle string) error {
	logPath := filepath.Join(bundle, "runc.log")
	cmd := exec.CommandContext(ctx, c.cfg.RuncPath, "--root", c.cfg.RuncRoot,
		"--log", logPath, "--log-format", "json",
		"create", "--bundle", bundle, id)
	cmd.Env = c.runcEnv
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Run(); err != nil {
		if msg := lastRuncError(logPath); msg != "" {
			return fmt.Errorf("runc create: %s", msg)
		}
		return fmt.Errorf("runc create: %w", err)
	}
	return nil
}

// runcEnv is the agent's environment without the variables through which
// runc would hand the agent's systemd notification socket or its
// socket-activated listeners to sandboxes.
func runcEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES":
			continue
		}
		env = append(env, kv)
	}
	return env
}

// lastRuncError returns the message of the last error runc logged (JSON
// log format) in logPath, or "".
func lastRuncError(logPath string) string {
	f, err := os.Open(logPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	var msg string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var e struct{ Level, Msg string }
		if json.Unmarshal(sc.Bytes(), &e) == nil && (e.Level == "error" || e.Level == "fatal") {
			msg = e.Msg
		}
	}
	return msg
}

// runcState is the part of runc's own state file (<root>/<id>/state.json,
// libcontainer's State, stable since runc 1.0) the backend reads. Reading
// it costs a file read instead of a `runc state` fork and exec.
type runcState struct {
	InitPid     int               `json:"init_process_pid"`
	InitStart   uint64            `json:"init_process_start"`
	CgroupPaths map[string]string `json:"cgroup_paths"`
}

// readRuncState reads runc's state for id. ErrNotFound if runc has none.
func (c *Container) readRuncState(id string) (*runcState, error) {
	b, err := os.ReadFile(filepath.Join(c.cfg.RuncRoot, id, "state.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, errdefs.New(errdefs.ErrNotFound, "sandbox_not_found", "no runtime state for sandbox %s", id)
	}
	if err != nil {
		return nil, fmt.Errorf("runtime state of %s: %w", id, err)
	}
	var st runcState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("runtime state of %s: %w", id, err)
	}
	if st.InitPid <= 0 {
		return nil, fmt.Errorf("runtime state of %s: no init pid", id)
	}
	return &st, nil
}

// created reports whether runc created the container but it was not
// started: runc's init then blocks on the exec fifo until `runc start`
// opens it, and removes it after.
func (c *Container) created(id string) bool {
	_, err := os.Lstat(filepath.Join(c.cfg.RuncRoot, id, "exec.fifo"))
	return err == nil
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
