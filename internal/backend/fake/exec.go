package fake

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/rootfs"
)

// defaultPath is PATH for execs whose environment sets none, as container
// runtimes do.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// outputGrace is how long Exec keeps reading output after the command
// exits, for background processes that still hold its pipes.
const outputGrace = 2 * time.Second

// Exec runs req.Argv (or req.Shell with the host's /bin/sh) as a host
// process in the sandbox's root, cwd resolved
// in-root (default spec.Workdir, then "/"), with env spec.Env + req.Env
// and PATH searched on the host (default PATH if the env has none), plus
// WARREN_FAKE_ROOT, by which Stop, Destroy and Processes find every
// process it starts. It is not confined in any way.
//
// The command gets its own process group; on timeout or when ctx ends the
// whole group is killed. A timed-out exec returns TimedOut with exit code
// 137 (SIGKILL); one whose ctx ended returns ctx.Err(). A command not found
// exits 127 with a message on stderr, as a shell reports it. req.User is
// checked against the sandbox's /etc/passwd and honoured only when running
// as root. ErrNotFound for an unknown sandbox, ErrConflict if it is not
// running, ErrInvalid for an empty argv, a relative or missing cwd, or an
// unknown user.
func (b *Backend) Exec(ctx context.Context, id string, req backend.ExecRequest) (backend.ExecResult, error) {
	if req.Shell != "" {
		if len(req.Argv) > 0 {
			return backend.ExecResult{}, errdefs.Invalid("fake: exec in %s: give argv or a shell command, not both", id)
		}
		// The host's shell is the fake's trusted one.
		req.Argv = []string{"/bin/sh", "-c", req.Shell}
	}
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return backend.ExecResult{}, errdefs.Invalid("fake: exec in %s: empty argv", id)
	}
	b.mu.Lock()
	x, err := b.get(id)
	b.mu.Unlock()
	if err != nil {
		return backend.ExecResult{}, err
	}
	cmd, err := b.command(x, req)
	if err != nil {
		return backend.ExecResult{}, err
	}
	if cmd == nil { // not found, reported like a shell
		fmt.Fprintf(stderrOf(req), "fake: exec %s: not found in PATH\n", req.Argv[0])
		return backend.ExecResult{ExitCode: 127}, nil
	}

	run := ctx
	var cancel context.CancelFunc = func() {}
	if req.Timeout > 0 {
		run, cancel = context.WithTimeout(ctx, req.Timeout)
	}
	defer cancel()
	start := time.Now()
	// Start under b.mu so that Stop and Destroy, which mark the sandbox
	// first and kill second, never miss a process started in between.
	b.mu.Lock()
	if x.st.State != backend.StateRunning {
		b.mu.Unlock()
		return backend.ExecResult{}, errdefs.New(errdefs.ErrConflict, "sandbox_not_running",
			"fake: exec in %s: sandbox is %s", id, x.st.State)
	}
	err = cmd.Start()
	b.mu.Unlock()
	if err != nil {
		return backend.ExecResult{}, fmt.Errorf("fake: exec in %s: %w", id, err)
	}
	// Kill the whole group, not just the leader as exec.CommandContext
	// would: `sh -c 'sleep 60 & sleep 60'` must not outlive its timeout.
	stop := context.AfterFunc(run, func() { unix.Kill(-cmd.Process.Pid, unix.SIGKILL) })
	waitErr := cmd.Wait()
	stop()
	res := backend.ExecResult{Duration: time.Since(start)}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok {
		if ws.Signaled() {
			res.ExitCode, res.Signal = 128+int(ws.Signal()), unix.SignalName(ws.Signal())
		} else {
			res.ExitCode = ws.ExitStatus()
		}
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	res.TimedOut = run.Err() != nil
	var exitErr *exec.ExitError
	if waitErr != nil && !errors.As(waitErr, &exitErr) && !errors.Is(waitErr, exec.ErrWaitDelay) {
		return res, fmt.Errorf("fake: exec in %s: %w", id, waitErr)
	}
	return res, nil
}

// command prepares the host process for req, or returns nil if argv[0] is
// not found.
func (b *Backend) command(x *box, req backend.ExecRequest) (*exec.Cmd, error) {
	id, root := x.spec.ID, x.root()
	cwd := req.Cwd
	if cwd == "" {
		cwd = x.spec.Workdir
	}
	if cwd == "" {
		cwd = "/"
	}
	if !strings.HasPrefix(cwd, "/") {
		return nil, errdefs.Invalid("fake: exec in %s: cwd %q is not absolute", id, cwd)
	}
	dir, err := hostDir(root, cwd)
	if err != nil {
		return nil, errdefs.Invalid("fake: exec in %s: cwd %s: %v", id, cwd, err)
	}
	var cred *syscall.Credential
	if req.User != "" {
		uid, gid, err := rootfs.LookupUser(root, req.User)
		if err != nil {
			return nil, errdefs.Invalid("fake: exec in %s: user %q: %v", id, req.User, err)
		}
		switch {
		case os.Geteuid() == 0:
			cred = &syscall.Credential{Uid: uid, Gid: gid}
		case int(uid) != os.Geteuid():
			return nil, errdefs.Unavailable("fake: exec in %s as %q needs root", id, req.User)
		}
	}

	env := append(append([]string{}, x.spec.Env...), req.Env...)
	pathEnv, ok := lookupEnv(env, "PATH")
	if !ok {
		pathEnv = defaultPath
		env = append([]string{"PATH=" + defaultPath}, env...)
	}
	// The marker lets Stop, Destroy and Processes find every process the
	// sandbox's execs started, even ones that left the process group.
	env = append(env, markerEnv(root))
	prog := lookPath(req.Argv[0], pathEnv)
	if prog == "" {
		return nil, nil
	}

	cmd := &exec.Cmd{
		Path:        prog,
		Args:        req.Argv,
		Dir:         dir,
		Env:         env,
		Stdin:       req.Stdin,
		Stdout:      req.Stdout,
		Stderr:      req.Stderr,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true, Credential: cred},
		WaitDelay:   outputGrace,
	}
	return cmd, nil
}

// hostDir resolves cwd in-root and returns the host path it reached. The
// host path may be stale by the time the command starts; that is fine for
// a backend that confines nothing anyway.
func hostDir(root, cwd string) (string, error) {
	f, err := rootfs.Open(root, cwd, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return "", err
	}
	defer f.Close()
	return os.Readlink("/proc/self/fd/" + strconv.Itoa(int(f.Fd())))
}

// lookPath finds name in the host directories of pathEnv; "" if it is not
// there. Names with a slash are taken as they are (relative to the cwd).
func lookPath(name, pathEnv string) string {
	if strings.Contains(name, "/") {
		return name
	}
	for _, dir := range filepath.SplitList(pathEnv) {
		if !filepath.IsAbs(dir) {
			continue
		}
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// lookupEnv returns the last value of key in env, which is the one a
// process sees.
func lookupEnv(env []string, key string) (string, bool) {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == key {
			return v, true
		}
	}
	return "", false
}

func stderrOf(req backend.ExecRequest) io.Writer {
	if req.Stderr == nil {
		return io.Discard
	}
	return req.Stderr
}
