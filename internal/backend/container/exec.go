package container

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/rootfs"
)

// Exec runs req in the sandbox with `runc exec`, in a fresh child cgroup
// of the sandbox's cgroup.
//
// The exec is over when its main process has exited. Processes it left in
// the background live on in the sandbox (moved to its own cgroup), so an
// agent can start a server in one exec and use it in the next, unless they
// still hold the exec's stdout or stderr Config.ExecOutputGrace after the
// main process exited (`sleep 100 &` rather than `server >log 2>&1 &`):
// those are killed, so that Exec returns instead of waiting for them as
// `docker exec` would. On timeout, or when ctx ends, every process of the
// exec is killed, background ones included, and the sandbox keeps
// running.
//
// A command that cannot be started is reported as a shell would: exit code
// 127 if it was not found, 126 otherwise, with runc's message on stderr. A
// missing working directory is ErrInvalid.
// Exit codes above 128 are reported as signals (runc exec, like a shell,
// returns 128+n for a process killed by signal n). ErrNotFound for an
// unknown sandbox, ErrConflict if it is not running, ErrInvalid for an
// empty argv or an unknown user.
func (c *Container) Exec(ctx context.Context, id string, req backend.ExecRequest) (backend.ExecResult, error) {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return backend.ExecResult{}, errdefs.Invalid("exec in %s: empty argv", id)
	}
	if req.Cwd != "" && !strings.HasPrefix(req.Cwd, "/") {
		return backend.ExecResult{}, errdefs.Invalid("exec in %s: cwd %q is not absolute", id, req.Cwd)
	}
	s, err := c.get(id)
	if err != nil {
		return backend.ExecResult{}, err
	}
	if !s.init.alive() || c.created(id) {
		return backend.ExecResult{}, errdefs.New(errdefs.ErrConflict, "sandbox_not_running", "exec in %s: sandbox is not running", id)
	}
	var uid, gid uint32 // "" is root: no need to read /etc/passwd
	if req.User != "" {
		if uid, gid, err = rootfs.LookupUser(c.userDB(id, s), req.User); err != nil {
			// Unknown users are the caller's mistake, whatever kind
			// of error the lookup reported.
			return backend.ExecResult{}, errdefs.Invalid("exec in %s: user %q: %v", id, req.User, err)
		}
	}

	name := execPrefix + randomHex(8)
	dir := c.dir(id)
	procPath := filepath.Join(dir, name+".json")
	logPath := filepath.Join(dir, name+".log")
	b, err := json.Marshal(c.execProcess(s.spec, req, uid, gid))
	if err != nil {
		return backend.ExecResult{}, fmt.Errorf("exec in %s: %w", id, err)
	}
	if err := os.WriteFile(procPath, b, 0o600); err != nil {
		return backend.ExecResult{}, fmt.Errorf("exec in %s: %w", id, err)
	}
	defer os.Remove(procPath)
	defer os.Remove(logPath)
	if err := s.cg.create(name); err != nil {
		return backend.ExecResult{}, fmt.Errorf("exec in %s: %w", id, err)
	}

	pidPath := filepath.Join(dir, name+".pid")
	defer os.Remove(pidPath)
	cmd := exec.Command(c.cfg.RuncPath, "--root", c.cfg.RuncRoot,
		"--log", logPath, "--log-format", "json",
		"exec", "--process", procPath, "--pid-file", pidPath, "--cgroup", s.cg.runcArg(name), id)
	cmd.Env = c.runcEnv
	cmd.Stdin, cmd.Stdout, cmd.Stderr = req.Stdin, req.Stdout, req.Stderr
	// Go copies a Stdin that is not a file in a goroutine that Wait waits
	// for; stop waiting for it shortly after runc exits.
	cmd.WaitDelay = c.cfg.ExecOutputGrace

	start := time.Now()
	if err := cmd.Start(); err != nil {
		s.cg.remove(name)
		return backend.ExecResult{}, fmt.Errorf("exec in %s: %w", id, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// runc exec returns only once nothing holds the command's stdout and
	// stderr (it copies them through pipes of its own), so it also waits
	// for background processes that kept them. Watch the main process
	// itself to notice when the command is really over.
	mainExited := make(chan struct{})
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go func() {
		if waitPidFile(watchCtx, pidPath) == nil {
			close(mainExited)
		}
	}()

	var timeout <-chan time.Time
	if req.Timeout > 0 {
		t := time.NewTimer(req.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	var res backend.ExecResult
	var waitErr, cleanupErr error
	const (
		exited = iota
		mainGone
		timedOut
		cancelled
	)
	var why int
	select {
	case waitErr = <-done:
		why = exited
	case <-mainExited:
		why = mainGone
	case <-timeout:
		why = timedOut
	case <-ctx.Done():
		why = cancelled
	}
	res.Duration = time.Since(start)
	// Cleanup must finish even when ctx has ended: it is what kills. Its
	// time starts now, however long the exec ran.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), execCleanupTimeout)
	defer cancel()
	switch why {
	case exited:
		cleanupErr = s.cg.evacuate(cctx, name)
	case mainGone:
		select {
		case waitErr = <-done:
			cleanupErr = s.cg.evacuate(cctx, name)
		case <-time.After(c.cfg.ExecOutputGrace):
			// Something left behind holds the command's output: kill
			// what does, so that runc returns the main process's
			// status, and let the rest live on.
			waitErr, cleanupErr = c.killHolders(cctx, s, name, cmd, done)
			if cleanupErr == nil {
				cleanupErr = s.cg.evacuate(cctx, name)
			}
		}
	case timedOut, cancelled:
		res.TimedOut = why == timedOut
		waitErr, cleanupErr = c.killExec(cctx, s, name, cmd, done)
		res.Duration = time.Since(start)
	}
	if err := s.cg.remove(name); err != nil {
		cleanupErr = errors.Join(cleanupErr, err)
	}
	if cleanupErr != nil {
		return res, fmt.Errorf("exec in %s: %w", id, cleanupErr)
	}
	if ctx.Err() != nil && !res.TimedOut {
		return res, ctx.Err()
	}

	var exitErr *exec.ExitError
	if waitErr != nil && !errors.As(waitErr, &exitErr) && !errors.Is(waitErr, exec.ErrWaitDelay) {
		return res, fmt.Errorf("exec in %s: %w", id, waitErr)
	}
	if res.TimedOut {
		// Whatever runc said, the command was killed by us.
		res.ExitCode, res.Signal = 128+int(unix.SIGKILL), "SIGKILL"
		return res, nil
	}
	res.ExitCode = cmd.ProcessState.ExitCode()
	if res.ExitCode == 255 {
		// runc's own failures exit 255 too; they leave an error in the log.
		if msg := lastRuncError(logPath); msg != "" {
			err := c.execFailure(id, msg, &res)
			return res, err
		}
	}
	if res.ExitCode > 128 && res.ExitCode <= 128+64 {
		res.Signal = unix.SignalName(unix.Signal(res.ExitCode - 128))
	}
	return res, nil
}

// userDB is the directory whose etc/passwd and etc/group an exec's user
// name resolves against: the topmost of the sandbox's layers that has an
// etc/passwd, the environment as it was built. Never the sandbox's merged
// root: an agent that rewrote its /etc/passwd (nobody with uid 0) must
// not decide whom the platform's `exec -u nobody` runs as. Without such a
// layer (or its mount), the merged root.
func (c *Container) userDB(id string, s *sandbox) string {
	layers := s.spec.Layers
	for i := len(layers) - 1; i >= 0; i-- {
		mp, err := c.cfg.Mounts.Path(layers[i].Digest)
		if err != nil {
			continue
		}
		if fi, err := os.Lstat(filepath.Join(mp, "etc", "passwd")); err == nil && fi.Mode().IsRegular() {
			return mp
		}
	}
	return c.rootDir(id)
}

// execCleanupTimeout bounds what ending an exec may take (evacuating what
// it left running, or killing its whole tree), counted from when it ends.
const execCleanupTimeout = 30 * time.Second

// killExec kills everything in the exec's cgroup until runc exec has
// returned (the command may still be joining the cgroup when the timeout
// fires), then once more for anything left.
func (c *Container) killExec(ctx context.Context, s *sandbox, name string, cmd *exec.Cmd, done <-chan error) (waitErr, err error) {
	for waited := false; !waited; {
		if err := s.cg.kill(ctx, name); err != nil {
			return nil, err
		}
		select {
		case waitErr = <-done:
			waited = true
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			// runc exec is stuck: kill it too, and its process with it.
			cmd.Process.Kill()
			return <-done, ctx.Err()
		}
	}
	return waitErr, s.cg.kill(ctx, name)
}

// killHolders kills the processes in the exec's cgroup that hold one of
// the pipes runc copies the command's stdio through, until runc exec has
// returned.
func (c *Container) killHolders(ctx context.Context, s *sandbox, name string, cmd *exec.Cmd, done <-chan error) (error, error) {
	// runc's fds 0-2 are ours; the pipes it made for the command are
	// among the others.
	pipes := pipesOf(cmd.Process.Pid, 3)
	for {
		pids, err := s.cg.procs(name)
		if err != nil {
			return nil, err
		}
		for _, pid := range pids {
			for p := range pipesOf(pid, 0) {
				if pipes[p] {
					unix.Kill(pid, unix.SIGKILL)
					break
				}
			}
		}
		select {
		case waitErr := <-done:
			return waitErr, nil
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			cmd.Process.Kill()
			return <-done, ctx.Err()
		}
	}
}

// pipesOf returns the pipes ("pipe:[inode]") open in process pid at file
// descriptors from minFd up.
func pipesOf(pid, minFd int) map[string]bool {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	pipes := make(map[string]bool)
	for _, e := range entries {
		if fd, err := strconv.Atoi(e.Name()); err != nil || fd < minFd {
			continue
		}
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && strings.HasPrefix(l, "pipe:") {
			pipes[l] = true
		}
	}
	return pipes
}

// execFailure turns an error runc logged for an exec into a result or an
// error. A process that could not start is a result (127 or 126, as a
// shell would say, with runc's message already on the caller's stderr);
// anything else is an infrastructure error.
func (c *Container) execFailure(id, msg string, res *backend.ExecResult) error {
	if strings.Contains(msg, "chdir to cwd") {
		return errdefs.Invalid("exec in %s: working directory: %s", id, msg)
	}
	if strings.Contains(msg, "unable to start container process") {
		res.ExitCode = 126
		if strings.Contains(msg, "executable file not found") || strings.Contains(msg, "no such file or directory") {
			res.ExitCode = 127
		}
		return nil
	}
	if strings.Contains(msg, "cannot exec in a stopped") || strings.Contains(msg, "not running") {
		return errdefs.New(errdefs.ErrConflict, "sandbox_not_running", "exec in %s: %s", id, msg)
	}
	return fmt.Errorf("exec in %s: runc: %s", id, msg)
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
