package container

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/cgroup"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/guard"
)

// gVisor (RuntimeGVisor): the sandbox's processes run on the sentry, a
// kernel in user space (runsc's "boot" process, running as nobody under
// seccomp), which asks the host only for what it cannot do itself; files
// come through the gofer, a second process that serves the sandbox's root
// and binds. The platform is runsc's default, ptrace: it needs no KVM.
// The backend drives it as it drives runc, over the same bundle, root
// overlay and cgroups, with these differences:
//
//   - The runtime's init, as the host sees it, is the sentry: signals to
//     it go to the sandbox's init (catatonit), and the sandbox ends with
//     it. Freezing the container's cgroup freezes the sentry, the gofer
//     and every process of the sandbox: Pause and Snapshot work as with
//     runc.
//   - No user namespace of warren's (the sentry runs in one of its own),
//     no boot_id to bind (gVisor has none), /dev is gVisor's own, the
//     init is the host's catatonit bound read-only (the sentry must read
//     what it execs), and the image's /tmp is bound explicitly, or gVisor
//     would hide it under a tmpfs in its memory, out of reach of file
//     calls and snapshots.
//   - The root is served with --file-access=shared: file calls write the
//     merged root from the host, and the sandbox must see them.
//   - Exec goes through `runsc exec`: warren-enter's setns would enter the
//     sentry's namespaces, not the sandbox. The trusted shell is bound
//     read-only into the sandbox (gvisorShellPath) for Shell requests. A
//     timeout kills the exec's process tree as `runsc ps` shows it; a
//     process that left that tree (orphaned to the sandbox's init before
//     the timeout) is not in it. Nor can the backend tell which
//     background process still holds an exec's output: once the command
//     is over, Exec waits ExecOutputGrace for its output, then returns and
//     drops the rest, leaving those processes running.
//   - Limits hold for the sandbox as a whole: the memory cgroup's limit
//     counts the sentry, and a sandbox over it is killed whole (the host
//     cannot pick a process inside). PIDs becomes RLIMIT_NPROC of every
//     process, which gVisor enforces per user, and a far larger pids limit
//     on the host's cgroup (each process inside costs the host ~10 tasks
//     of the sentry and its ptrace stubs), so that a fork bomb cannot
//     exhaust the host.
//   - Network: --network=none, the sentry's own loopback and nothing
//     else. The node cannot enter it, so NetNS and DialPort refuse.
//
// runsc names its control socket after the sandbox id in the host's
// abstract namespace: ids must be unique on the host, which sandbox ids,
// prefixed with their node's, are.

// runscFlags configure every runsc call (runsc reads its configuration
// from each call's flags, not from its state).
var runscFlags = []string{"--network=none", "--file-access=shared", "--overlay2=none"}

// gvisorShellPath is where the trusted shell appears in a gVisor sandbox.
const gvisorShellPath = "/dev/warren-sh"

// gvisorTasks* size the host's pids limit of a gVisor sandbox from its
// Resources.PIDs: measured on the ptrace platform, 162 processes inside
// took 1457 host tasks, and an idle sandbox 25.
const (
	gvisorTasksPerProcess = 16
	gvisorTasksBase       = 128
)

// gvisorProbeTimeout bounds GVisorAvailable's trial sandbox: on a host
// whose KVM cannot run gVisor's kvm platform, runsc hangs rather than
// fail.
const gvisorProbeTimeout = 30 * time.Second

// GVisorAvailable reports whether this host runs gVisor sandboxes: nil,
// or ErrUnavailable with the reason (runsc missing, or the error of a
// trial sandbox, `runsc do true`, with the flags sandboxes get). The
// first answer is kept; the trial costs about a second (and, when it
// fails, leaves runsc's small bundle directory in TMPDIR, where the
// sentry also builds its chroot).
func (c *Container) GVisorAvailable(ctx context.Context) error {
	c.gvisorMu.Lock()
	defer c.gvisorMu.Unlock()
	if c.gvisorChecked {
		return c.gvisorErr
	}
	err := probeGVisor(ctx, c.gvisor)
	if ctx.Err() == nil { // an answer about the host, not about ctx
		c.gvisorChecked, c.gvisorErr = true, err
	}
	return err
}

func probeGVisor(ctx context.Context, r *ociRuntime) error {
	if os.Geteuid() != 0 {
		return errdefs.Unavailable("gvisor: runsc needs root")
	}
	if _, err := os.Stat(r.path); err != nil {
		return errdefs.Unavailable("gvisor: %s not found: install runsc (Debian's runsc package)", r.path)
	}
	tctx, cancel := context.WithTimeout(ctx, gvisorProbeTimeout)
	defer cancel()
	probe := *r
	probe.root = filepath.Join(r.root, "probe")
	defer os.RemoveAll(probe.root)
	// do runs on the host's root under an overlay in memory, which
	// shared file access rules out; the rest is as for sandboxes.
	probe.flags = slices.DeleteFunc(slices.Clone(r.flags), func(f string) bool { return strings.HasPrefix(f, "--file-access=") })
	cmd := probe.command(tctx, "do", "true")
	cmd.Dir = "/"
	var out bytes.Buffer
	// Pipes only: runsc hands its stdio to the sandbox's user, and
	// chowns them (/dev/null included) to give it.
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(nil), &out, &out
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	case tctx.Err() != nil:
		return errdefs.Unavailable("gvisor: a trial sandbox (runsc do true) did not finish within %v", gvisorProbeTimeout)
	}
	msg := strings.TrimSpace(out.String())
	if msg == "" {
		msg = err.Error()
	}
	return errdefs.Unavailable("gvisor: runsc cannot run a sandbox on this host: %s", msg)
}

// runscStatePaths are runsc's state file and lock of sandbox id.
func runscStatePaths(root, id string) []string {
	base := filepath.Join(root, id+"_sandbox:"+id)
	return []string{base + ".state", base + ".lock"}
}

// runscIDs lists the sandboxes runsc holds state for under root.
func runscIDs(root string) []string {
	entries, _ := os.ReadDir(root)
	var ids []string
	for _, e := range entries {
		id, rest, ok := strings.Cut(e.Name(), "_sandbox:")
		if ok && (rest == id+".state" || rest == id+".lock") && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	return ids
}

// readRunscState reads runsc's state file of id (runsc's container.Container
// as JSON): its status and the sentry's pid. Its cgroups are the ones the
// bundle names, in every hierarchy. ErrNotFound if there is none.
func (c *Container) readRunscState(id string) (*runtimeState, error) {
	b, err := os.ReadFile(runscStatePaths(c.gvisor.root, id)[0])
	if errors.Is(err, os.ErrNotExist) {
		return nil, errdefs.New(errdefs.ErrNotFound, "sandbox_not_found", "no runtime state for sandbox %s", id)
	}
	if err != nil {
		return nil, err
	}
	var st struct {
		Status   string `json:"status"`
		GoferPid int    `json:"goferPid"`
		Sandbox  struct {
			Pid int `json:"pid"`
		} `json:"sandbox"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, err
	}
	l, err := cgroup.Host()
	if err != nil {
		return nil, err
	}
	rs := &runtimeState{InitPid: st.Sandbox.Pid, RootPid: st.GoferPid, Created: st.Status == "created", CgroupPaths: map[string]string{}}
	path := c.cgroupRel(id, false)
	if be := c.cgroupRel(id, true); len(l.Paths(be)) > 0 && l.Paths(be)[0].Exists() {
		path = be
	}
	if l.Mode == cgroup.Unified {
		rs.CgroupPaths[""] = filepath.Join(l.Unified, path)
	} else {
		for ctrl := range l.V1 {
			rs.CgroupPaths[ctrl], _ = l.V1Dir(ctrl, path)
		}
	}
	rs.InitStart = c.sentryStart(rs.InitPid, id)
	return rs, nil
}

// sentryStart is the start time of pid if it is the sentry of sandbox id
// (runsc-sandbox ... --root=<ours> ... boot ... <id>), else 0: runsc
// records no start time, and a recycled pid must not pass for the
// sandbox's.
func (c *Container) sentryStart(pid int, id string) uint64 {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return 0
	}
	argv := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	if argv[0] != "runsc-sandbox" || argv[len(argv)-1] != id || !slices.Contains(argv, "--root="+c.gvisor.root) {
		return 0
	}
	_, start, err := procStat(pid)
	if err != nil {
		return 0
	}
	return start
}

// gvisorSpec adapts a sandbox's OCI spec to gVisor (see the top of this
// file). root is its root's path in the bundle, held the agent's way to
// it (sandbox.withRoot).
func (c *Container) gvisorSpec(oci *specs.Spec, spec backend.Spec, root, held string) {
	for i, m := range oci.Mounts {
		switch m.Destination {
		case "/dev":
			oci.Mounts[i] = devTmpfs
		case initPath:
			// The sentry reads what it execs, as the init's user: not
			// the platform's execute-only copy (installInit), which
			// guards the init's seccomp filters the node reads, a
			// runc concern.
			oci.Mounts[i].Source = c.cfg.InitPath
		}
	}
	// A directory, not a symlink: the gofer would follow that on the host.
	if fi, err := os.Lstat(filepath.Join(held, "tmp")); err == nil && fi.IsDir() {
		oci.Mounts = append(oci.Mounts, specs.Mount{Destination: "/tmp", Type: "bind", Source: filepath.Join(root, "tmp"), Options: []string{"bind", "rw"}})
	}
	if c.shell.file != nil {
		oci.Mounts = append(oci.Mounts, specs.Mount{Destination: gvisorShellPath, Type: "bind", Source: c.cfg.ShellPath,
			Options: []string{"bind", "ro", "nosuid", "nodev"}})
	}
	oci.Process.Rlimits = c.gvisorRlimits(spec.Resources)
	if p := spec.Resources.PIDs; p > 0 {
		host := p*gvisorTasksPerProcess + gvisorTasksBase
		oci.Linux.Resources.Pids = &specs.LinuxPids{Limit: &host}
	}
	oci.Process.ApparmorProfile = "" // the sentry confines the sandbox; a profile would confine the sentry
}

// gvisorRlimits are the rlimits of a gVisor sandbox's init and execs:
// PIDs is each user's RLIMIT_NPROC, which the sentry enforces.
func (c *Container) gvisorRlimits(r backend.Resources) []specs.POSIXRlimit {
	rl := slices.Clone(c.rlimits)
	if r.PIDs > 0 {
		rl = append(rl, specs.POSIXRlimit{Type: "RLIMIT_NPROC", Hard: uint64(r.PIDs), Soft: uint64(r.PIDs)})
	}
	return rl
}

// gvisorStdio opens what runsc create hands the sandbox's init as its
// stdio, a file in the bundle: never /dev/null, which runsc would chown to
// the sentry's user. The init writes nothing there but warnings.
func gvisorStdio(bundle string) (*os.File, error) {
	return os.OpenFile(filepath.Join(bundle, "stdio"), os.O_RDWR|os.O_CREATE|os.O_APPEND|unix.O_CLOEXEC, 0o600)
}

// gvisorExec runs argv in gVisor sandbox s through `runsc exec` (see the
// top of this file), with the same results as Exec.
func (c *Container) gvisorExec(ctx context.Context, s *sandbox, argv []string, uid, gid uint32, req backend.ExecRequest) (backend.ExecResult, error) {
	id := s.spec.ID
	cwd := execCwd(s.spec, req)
	env := execEnv(s.spec.Env, req.Env, uid)
	if fi, err := c.Stat(ctx, id, cwd); err != nil || !fi.IsDir {
		return backend.ExecResult{}, errdefs.Invalid("exec in %s: working directory %s: not a directory", id, cwd)
	}
	if req.Shell != "" {
		argv = append([]string{gvisorShellPath}, argv[1:]...)
	} else if code, msg := c.lookCommand(id, cwd, argv[0], env); code != 0 {
		if req.Stderr != nil {
			fmt.Fprintf(req.Stderr, "warren: %s: %s\n", argv[0], msg)
		}
		return backend.ExecResult{ExitCode: code}, nil
	}
	proc := specs.Process{Args: argv, Env: env, Cwd: cwd, User: specs.User{UID: uid, GID: gid},
		Capabilities: guard.Capabilities(uid), Rlimits: c.gvisorRlimits(s.spec.Resources), NoNewPrivileges: true}
	b, err := json.Marshal(proc)
	if err != nil {
		return backend.ExecResult{}, err
	}
	base := filepath.Join(c.dir(id), execPrefix+randomHex(8))
	procPath, logPath, pidPath := base+".json", base+".log", base+".pid"
	defer os.Remove(procPath)
	defer os.Remove(logPath)
	defer os.Remove(pidPath)
	if err := os.WriteFile(procPath, b, 0o600); err != nil {
		return backend.ExecResult{}, fmt.Errorf("exec in %s: %w", id, err)
	}

	cmd := s.rt.command(context.Background(), "--debug-log", logPath, "--debug-log-format", "json",
		"exec", "--process", procPath, "--internal-pid-file", pidPath, id)
	cmd.SysProcAttr = &unix.SysProcAttr{Setsid: true}
	if req.Stdin == nil {
		req.Stdin = bytes.NewReader(nil) // a pipe, not /dev/null (gvisorStdio)
	}
	x := newEntered()
	defer x.close()
	files, err := x.pipeStdio(cmd, req)
	if err == nil {
		x.start = time.Now()
		err = cmd.Start()
	}
	closeAll(files) // runsc has them, or failed
	if err != nil {
		return backend.ExecResult{}, fmt.Errorf("exec in %s: %w", id, err)
	}
	x.cmd = cmd
	go func() {
		x.waitErr = cmd.Wait()
		close(x.exited)
	}()
	x.copyStdin(req)

	var res backend.ExecResult
	var timeout <-chan time.Time
	if req.Timeout > 0 {
		t := time.NewTimer(req.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-x.exited:
	case <-timeout:
		res.TimedOut = true
	case <-ctx.Done():
	}
	res.Duration = time.Since(x.start)
	select {
	case <-x.exited:
		x.outputDone(c.cfg.ExecOutputGrace) // whatever holds it after, we cannot tell
	default:
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), execCleanupTimeout)
		defer cancel()
		if err := c.gvisorKillExec(cctx, x, id, pidPath); err != nil {
			return res, fmt.Errorf("exec in %s: %w", id, err)
		}
		res.Duration = time.Since(x.start)
		x.outputDone(time.Second)
	}
	if ctx.Err() != nil && !res.TimedOut {
		return res, ctx.Err()
	}
	if res.TimedOut {
		res.ExitCode, res.Signal = 128+int(unix.SIGKILL), "SIGKILL"
		return res, nil
	}
	ws, msg, ok := runscExitStatus(logPath)
	switch {
	case !ok && msg != "":
		return res, fmt.Errorf("exec in %s: runsc exec: %s", id, msg)
	case !ok:
		return res, fmt.Errorf("exec in %s: runsc exec: %v", id, x.waitErr)
	case ws.Signaled():
		res.ExitCode, res.Signal = 128+int(ws.Signal()), unix.SignalName(ws.Signal())
	default:
		res.ExitCode = ws.ExitStatus()
	}
	return res, nil
}

// gvisorKillExec kills the exec's process tree, once its pid is known
// (runsc writes it once the process runs), and waits for runsc exec to
// return.
func (c *Container) gvisorKillExec(ctx context.Context, x *entered, id, pidPath string) error {
	for {
		if b, err := os.ReadFile(pidPath); err == nil && len(b) > 0 {
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				return fmt.Errorf("runsc exec pid file: %w", err)
			}
			if err := c.gvisorKillTree(ctx, id, pid); err != nil {
				return err
			}
			break
		}
		select {
		case <-x.exited:
			return nil // it never ran, or ended meanwhile
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	select {
	case <-x.exited:
		return nil
	case <-ctx.Done():
		x.cmd.Process.Kill()
		<-x.exited
		return ctx.Err()
	}
}

// gvisorKillTree kills process top of sandbox id and every process it
// descends from, as `runsc ps` shows them: all are stopped first, top
// down until no new one appears, so that none forks or is orphaned out of
// the tree meanwhile; then all are killed.
func (c *Container) gvisorKillTree(ctx context.Context, id string, top int) error {
	held := map[int]bool{}
	for {
		procs, err := c.gvisorProcs(ctx, id)
		if err != nil {
			return err
		}
		var more []int
		for _, pid := range descendants(procs, top) {
			if !held[pid] {
				more = append(more, pid)
			}
		}
		if len(more) == 0 {
			break
		}
		for _, pid := range more {
			c.gvisor.run(ctx, "kill", "--pid", strconv.Itoa(pid), id, "STOP") // one gone meanwhile is fine
			held[pid] = true
		}
	}
	for pid := range held {
		c.gvisor.run(ctx, "kill", "--pid", strconv.Itoa(pid), id, "KILL")
	}
	return ctx.Err()
}

// descendants returns top, if it is in procs (pid -> parent pid), and
// every process below it, parents first.
func descendants(procs map[int]int, top int) []int {
	if _, ok := procs[top]; !ok {
		return nil
	}
	tree := []int{top}
	for i := 0; i < len(tree); i++ {
		for pid, ppid := range procs {
			if ppid == tree[i] && pid != top {
				tree = append(tree, pid)
			}
		}
	}
	return tree
}

// gvisorProcs lists the processes in sandbox id (pid -> parent pid, as
// the sandbox numbers them) from `runsc ps`.
func (c *Container) gvisorProcs(ctx context.Context, id string) (map[int]int, error) {
	out, err := c.gvisor.output(ctx, "ps", id)
	if err != nil {
		return nil, err
	}
	return parsePs(out)
}

// parsePs reads `runsc ps`'s table: UID PID PPID C TTY STIME TIME CMD.
func parsePs(out []byte) (map[int]int, error) {
	procs := map[int]int{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for first := true; sc.Scan(); first = false {
		f := strings.Fields(sc.Text())
		if first || len(f) == 0 {
			continue
		}
		if len(f) < 3 {
			return nil, fmt.Errorf("runsc ps: unexpected line %q", sc.Text())
		}
		pid, err1 := strconv.Atoi(f[1])
		ppid, err2 := strconv.Atoi(f[2])
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("runsc ps: unexpected line %q", sc.Text())
		}
		procs[pid] = ppid
	}
	return procs, sc.Err()
}

// runscExitStatus reads how an exec's process ended from runsc exec's
// debug log (JSON lines): its exit code alone cannot tell "exit 137" from
// SIGKILL. Without one, msg is the error runsc logged, if any.
func runscExitStatus(logPath string) (ws unix.WaitStatus, msg string, ok bool) {
	f, err := os.Open(logPath)
	if err != nil {
		return 0, "", false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var e struct{ Msg string }
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue
		}
		if v, found := strings.CutPrefix(e.Msg, "Exiting with status: "); found {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
			if err == nil {
				return unix.WaitStatus(n), "", true
			}
		}
		if v, found := strings.CutPrefix(e.Msg, "FATAL ERROR: "); found {
			msg = v
		}
	}
	return 0, msg, false
}

// lookCommand finds name as a shell would, in the sandbox's root from
// the host: a path containing "/" as it is (from cwd), else in env's
// PATH. It returns 0 if it is there and executable, else 127 (not found)
// or 126 (not executable) and why. runsc would say so too, but on the
// command's stderr and as its own failure.
func (c *Container) lookCommand(id, cwd, name string, env []string) (int, string) {
	var cands []string
	if strings.Contains(name, "/") {
		cands = []string{filepath.Join(cwd, name)}
	} else {
		path := strings.TrimPrefix(defaultPath, "PATH=")
		for _, kv := range env {
			if v, ok := strings.CutPrefix(kv, "PATH="); ok {
				path = v
			}
		}
		for _, d := range filepath.SplitList(path) {
			if !filepath.IsAbs(d) {
				d = filepath.Join(cwd, d) // "" too
			}
			cands = append(cands, filepath.Join(d, name))
		}
	}
	code, msg := 127, "command not found"
	for _, p := range cands {
		fi, err := c.Stat(context.Background(), id, p)
		switch {
		case err != nil:
		case !fi.IsDir && fi.Mode&0o111 != 0:
			return 0, ""
		default:
			code, msg = 126, unix.EACCES.Error()
		}
	}
	return code, msg
}
