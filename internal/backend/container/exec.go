package container

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/osthread"
	"github.com/warrenhq/warren/internal/qos"
	"github.com/warrenhq/warren/internal/rootfs"
)

// Exec runs req in the sandbox through warren-enter (enter.go), in a
// fresh child cgroup of the sandbox's cgroup; in a gVisor sandbox through
// `runsc exec` (gvisor.go says how that differs).
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
// 127 if it was not found, 126 otherwise, with a message on stderr. A
// missing working directory is ErrInvalid. ErrNotFound for an unknown
// sandbox, ErrConflict if it is not running, ErrInvalid for an empty argv
// or an unknown user, ErrUnavailable for a Shell request on a node without
// the trusted shell.
func (c *Container) Exec(ctx context.Context, id string, req backend.ExecRequest) (backend.ExecResult, error) {
	argv := req.Argv
	if req.Shell != "" {
		if len(req.Argv) > 0 {
			return backend.ExecResult{}, errdefs.Invalid("exec in %s: give argv or a shell command, not both", id)
		}
		argv = []string{"sh", "-c", req.Shell}
	}
	if len(argv) == 0 || argv[0] == "" {
		return backend.ExecResult{}, errdefs.Invalid("exec in %s: empty argv", id)
	}
	if req.Cwd != "" && !strings.HasPrefix(req.Cwd, "/") {
		return backend.ExecResult{}, errdefs.Invalid("exec in %s: cwd %q is not absolute", id, req.Cwd)
	}
	s, err := c.get(id)
	if err != nil {
		return backend.ExecResult{}, err
	}
	if !s.init.alive() || c.created(s) {
		return backend.ExecResult{}, errdefs.New(errdefs.ErrConflict, "sandbox_not_running", "exec in %s: sandbox is not running", id)
	}
	if req.Shell != "" && c.shell.file == nil {
		return backend.ExecResult{}, errdefs.Unavailable("exec in %s: %v", id, c.shell.err)
	}
	var uid, gid uint32 // "" is root: no need to read /etc/passwd
	if req.User != "" {
		if uid, gid, err = c.lookupUser(s, req.User); err != nil {
			// Unknown users are the caller's mistake, whatever kind
			// of error the lookup reported.
			return backend.ExecResult{}, errdefs.Invalid("exec in %s: user %q: %v", id, req.User, err)
		}
	}
	if s.rt.gvisor() {
		return c.gvisorExec(ctx, s, argv, uid, gid, req) // gvisor.go
	}
	filters, err := c.initFilters(s)
	if err != nil {
		return backend.ExecResult{}, fmt.Errorf("exec in %s: %w", id, err)
	}
	e := &enterRequest{uid: uid, gid: gid, cwd: execCwd(s.spec, req), argv: argv,
		env: execEnv(s.spec.Env, req.Env, uid), execFd: -1, filters: filters, userns: s.ids != nil}
	e.landlockHandled, e.landlockAllowed = c.landlock[0], c.landlock[1]
	e.apparmor = c.apparmor
	e.schedIdle = s.spec.BestEffort
	e.coreShare = s.spec.BestEffort && c.qos.CoreScheduling == qos.CoreSchedulingOn
	e.memoryMerge = c.merges(s)
	e.oomScoreAdj = qos.OOMScoreAdj(s.spec.BestEffort)
	if e.capEff, e.capPerm, e.capBound, err = capMasks(uid); err != nil {
		return backend.ExecResult{}, fmt.Errorf("exec in %s: %w", id, err)
	}
	for _, l := range c.rlimits {
		e.rlimits = append(e.rlimits, rlimit{rlimitNumbers[l.Type], l.Soft, l.Hard})
	}

	name := execPrefix + randomHex(8)
	if err := s.cg.create(name); err != nil {
		return backend.ExecResult{}, fmt.Errorf("exec in %s: %w", id, err)
	}
	x, err := c.startEnter(s, name, e, req)
	if err != nil {
		s.cg.remove(name)
		return backend.ExecResult{}, fmt.Errorf("exec in %s: %w", id, err)
	}
	defer x.close()

	var timeout <-chan time.Time
	if req.Timeout > 0 {
		t := time.NewTimer(req.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	var res backend.ExecResult
	var cleanupErr error
	select {
	case <-x.exited:
	case <-timeout:
		res.TimedOut = true
	case <-ctx.Done():
	}
	res.Duration = time.Since(x.start)
	// Cleanup must finish even when ctx has ended: it is what kills. Its
	// time starts now, however long the exec ran.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), execCleanupTimeout)
	defer cancel()
	select {
	case <-x.exited:
		// Over: what holds its output beyond the grace is killed, the
		// rest moved to the sandbox's cgroup.
		if !x.outputDone(c.cfg.ExecOutputGrace) {
			cleanupErr = x.killHolders(cctx, s, name)
		}
		if cleanupErr == nil {
			cleanupErr = s.cg.evacuate(cctx, name)
		}
	default:
		cleanupErr = x.killAll(cctx, s, name)
		res.Duration = time.Since(x.start)
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
	if res.TimedOut {
		// However it ended, the command was killed by us.
		res.ExitCode, res.Signal = 128+int(unix.SIGKILL), "SIGKILL"
		return res, nil
	}
	st, err := x.status()
	if err != nil {
		return res, fmt.Errorf("exec in %s: %w", id, err)
	}
	return res, c.execResult(id, st, argv[0], req.Stderr, &res)
}

// execResult fills in res from how warren-enter said the exec ended. A
// command that could not start is a result (127 or 126, as a shell would
// say, with a message on the caller's stderr); a missing working directory
// is ErrInvalid; anything else the launcher could not do is an
// infrastructure error.
func (c *Container) execResult(id string, st enterStatus, name string, stderr io.Writer, res *backend.ExecResult) error {
	errno := unix.Errno(st.n)
	switch {
	case st.exited:
		res.ExitCode = st.n
	case st.signaled:
		res.ExitCode, res.Signal = 128+st.n, unix.SignalName(unix.Signal(st.n))
	case st.stage == "cwd":
		return errdefs.Invalid("exec in %s: working directory: %v", id, errno)
	case st.stage == "exec":
		res.ExitCode = 126
		msg := errno.Error()
		if errno == unix.ENOENT {
			res.ExitCode, msg = 127, "command not found"
		}
		if stderr != nil {
			fmt.Fprintf(stderr, "warren: %s: %s\n", name, msg)
		}
	case st.stage == "version":
		return errdefs.Unavailable("exec in %s: %s is from another build of warren (its request format differs): install this build's (scripts/build-helpers)", id, c.cfg.EnterPath)
	default:
		return fmt.Errorf("exec in %s: warren-enter: %s: %v", id, st.stage, errno)
	}
	return nil
}

// execCwd is where an exec starts: the request's cwd, else the sandbox's
// workdir, else /.
func execCwd(spec backend.Spec, req backend.ExecRequest) string {
	for _, d := range []string{req.Cwd, spec.Workdir} {
		if d != "" {
			return d
		}
	}
	return "/"
}

// initFilters returns the sandbox's seccomp filters, read from its init on
// the first exec (and again after an agent restart).
func (c *Container) initFilters(s *sandbox) ([][]byte, error) {
	s.filterMu.Lock()
	defer s.filterMu.Unlock()
	if s.filters == nil {
		f, err := initFilters(s.init, 2*time.Second)
		if err != nil {
			return nil, err
		}
		s.filters = f
	}
	return s.filters, nil
}

// entered is one running warren-enter and the command's stdio.
type entered struct {
	cmd     *exec.Cmd
	start   time.Time
	exited  chan struct{}   // closed when warren-enter has exited: the main process has
	waitErr error           // cmd.Wait's, once exited is closed
	statusR *os.File        // warren-enter's status line
	stdin   *os.File        // our end of the command's stdin, if it reads one
	outputs chan struct{}   // closed once stdout and stderr are both closed by every holder
	pipes   map[string]bool // "pipe:[inode]" of the command's stdout and stderr
	readers []*os.File      // our ends of those
}

func newEntered() *entered {
	return &entered{exited: make(chan struct{}), outputs: make(chan struct{}), pipes: make(map[string]bool)}
}

// startEnter starts warren-enter for e in the sandbox's exec cgroup sub,
// with the request's stdio.
func (c *Container) startEnter(s *sandbox, sub string, e *enterRequest, req backend.ExecRequest) (x *entered, err error) {
	var files []*os.File // ours to close once warren-enter has them
	defer func() { closeAll(files) }()
	x = newEntered()
	defer func() {
		if err != nil {
			x.close()
		}
	}()

	pidfd, err := unix.PidfdOpen(s.init.pid, 0)
	if err != nil {
		return nil, fmt.Errorf("pidfd of init: %w", err)
	}
	files = append(files, os.NewFile(uintptr(pidfd), "pidfd"))
	if !s.init.alive() { // the pid was the init's when the pidfd was made
		return nil, errdefs.New(errdefs.ErrConflict, "sandbox_not_running", "sandbox is not running")
	}
	statusR, statusW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	x.statusR = statusR
	files = append(files, statusW)
	extra := []*os.File{nil, files[0], statusW} // fds 3, 4, 5
	if req.Shell != "" {
		e.execFd = 3 + len(extra)
		extra = append(extra, c.shell.file)
	}
	cgFiles, err := c.cgroupProcsFiles(s, sub)
	if err != nil {
		return nil, err
	}
	files = append(files, cgFiles...)
	for _, f := range cgFiles {
		e.cgroupFds = append(e.cgroupFds, 3+len(extra))
		extra = append(extra, f)
	}
	reqFile, err := memfdOf("warren-exec", e.encode(), 0)
	if err != nil {
		return nil, err
	}
	files = append(files, reqFile)
	extra[0] = reqFile

	cmd := exec.Command(c.cfg.EnterPath)
	cmd.Env = []string{}
	cmd.ExtraFiles = extra
	stdio, err := x.pipeStdio(cmd, req)
	files = append(files, stdio...)
	if err != nil {
		return nil, err
	}
	x.start = time.Now()
	// From a thread that never ends: warren-enter dies with the thread
	// that forked it (PDEATHSIG).
	if err := osthread.Start(cmd); err != nil {
		return nil, err
	}
	x.cmd = cmd
	go func() {
		x.waitErr = cmd.Wait()
		close(x.exited)
	}()
	x.copyStdin(req)
	return x, nil
}

// pipeStdio gives cmd the request's stdio: /dev/null or a pipe fed by
// copyStdin, and pipes whose ends x reads into the request's writers,
// with x.outputs closed once both are closed by every holder. It returns
// cmd's ends, which the caller closes once cmd has started.
func (x *entered) pipeStdio(cmd *exec.Cmd, req backend.ExecRequest) (files []*os.File, err error) {
	if req.Stdin == nil {
		devnull, err := os.Open(os.DevNull)
		if err != nil {
			return files, err
		}
		files = append(files, devnull)
		cmd.Stdin = devnull
	} else {
		r, w, err := os.Pipe()
		if err != nil {
			return files, err
		}
		files = append(files, r)
		cmd.Stdin, x.stdin = r, w
	}
	var copying sync.WaitGroup
	for _, o := range []struct {
		dst io.Writer
		set *io.Writer
	}{{req.Stdout, &cmd.Stdout}, {req.Stderr, &cmd.Stderr}} {
		r, w, err := os.Pipe()
		if err != nil {
			return files, err
		}
		files = append(files, w)
		x.readers = append(x.readers, r)
		var st unix.Stat_t
		if err := unix.Fstat(int(r.Fd()), &st); err == nil {
			x.pipes[fmt.Sprintf("pipe:[%d]", st.Ino)] = true
		}
		*o.set = w
		dst := o.dst
		if dst == nil {
			dst = io.Discard
		}
		copying.Add(1)
		go func() {
			defer copying.Done()
			io.Copy(dst, r)
		}()
	}
	go func() { copying.Wait(); close(x.outputs) }()
	return files, nil
}

// copyStdin feeds the request's stdin to the command, once it started.
func (x *entered) copyStdin(req backend.ExecRequest) {
	if x.stdin != nil {
		go func() {
			io.Copy(x.stdin, req.Stdin)
			x.stdin.Close()
		}()
	}
}

// outputDone waits up to grace for the command's stdout and stderr to be
// closed by every process that holds them.
func (x *entered) outputDone(grace time.Duration) bool {
	select {
	case <-x.outputs:
		return true
	case <-time.After(grace):
		return false
	}
}

// killHolders kills the processes in the exec's cgroup that still hold
// the command's stdout or stderr, until both are closed.
func (x *entered) killHolders(ctx context.Context, s *sandbox, sub string) error {
	for !x.outputDone(10 * time.Millisecond) {
		pids, err := s.cg.procs(sub)
		if err != nil {
			return err
		}
		for _, pid := range pids {
			for p := range pipesOf(pid, 0) {
				if x.pipes[p] {
					unix.Kill(pid, unix.SIGKILL)
					break
				}
			}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}

// killAll kills everything in the exec's cgroup until warren-enter has
// returned (the command may still be joining the cgroup when the timeout
// fires), then once more for anything left, and waits for its output.
func (x *entered) killAll(ctx context.Context, s *sandbox, sub string) error {
	for exited := false; !exited; {
		if err := s.cg.kill(ctx, sub); err != nil {
			return err
		}
		select {
		case <-x.exited:
			exited = true
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			// warren-enter is stuck: kill it too.
			x.cmd.Process.Kill()
			<-x.exited
			return ctx.Err()
		}
	}
	if err := s.cg.kill(ctx, sub); err != nil {
		return err
	}
	if !x.outputDone(time.Second) {
		return errors.New("the command's output is still held open after its processes were killed")
	}
	return nil
}

// status returns how warren-enter said the exec ended.
func (x *entered) status() (enterStatus, error) {
	st, err := readEnterStatus(x.statusR)
	if err != nil && x.waitErr != nil {
		err = fmt.Errorf("%w (warren-enter: %v)", err, x.waitErr)
	}
	return st, err
}

// close releases our ends of the pipes; the copiers end with them.
func (x *entered) close() {
	if x.stdin != nil {
		x.stdin.Close()
	}
	if x.statusR != nil {
		x.statusR.Close()
	}
	closeAll(x.readers)
}

// lookupUser resolves an exec's user name against the etc/passwd and
// etc/group of the topmost of the sandbox's layers that has an
// etc/passwd, the environment as it was built. Never the sandbox's merged
// root: an agent that rewrote its /etc/passwd (nobody with uid 0) must
// not decide whom the platform's `exec -u nobody` runs as. Without such a
// layer (or its mount), the merged root.
func (c *Container) lookupUser(s *sandbox, user string) (uid, gid uint32, err error) {
	layers := s.spec.Layers
	for i := len(layers) - 1; i >= 0; i-- {
		mp, err := c.cfg.Mounts.Path(layers[i].Digest)
		if err != nil {
			continue
		}
		if fi, err := os.Lstat(filepath.Join(mp, "etc", "passwd")); err == nil && fi.Mode().IsRegular() {
			return rootfs.LookupUser(mp, user)
		}
	}
	err = s.withRoot(func(root string) (err error) {
		uid, gid, err = rootfs.LookupUser(root, user)
		return err
	})
	return uid, gid, err
}

// execCleanupTimeout bounds what ending an exec may take (evacuating what
// it left running, or killing its whole tree), counted from when it ends.
const execCleanupTimeout = 30 * time.Second

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

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
