package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/guest/proto"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/guard"
	"github.com/warrenhq/warren/internal/osthread"
	"github.com/warrenhq/warren/internal/rootfs"
)

// launch is what the agent tells the launcher (on its fd 3).
type launch struct {
	Argv  []string `json:"argv"`
	Env   []string `json:"env"`
	Cwd   string   `json:"cwd"`
	UID   uint32   `json:"uid"`
	GID   uint32   `json:"gid"`
	Shell bool     `json:"shell,omitempty"` // exec fd 6, the platform's shell
	// Capability masks (guard's set for UID).
	Eff, Perm, Bound uint64
	// Machine: the command runs as the user would in a whole machine (a
	// vm, which is the wall): no capability dropped beyond what the
	// change of user drops, no no_new_privs (sudo works).
	Machine bool `json:"machine,omitempty"`
}

// outputGrace is how long an exec waits, once its command exited, for
// what it left in the background to let go of its stdout and stderr.
const outputGrace = 100 * time.Millisecond

// frames writes an exec's response frames, one writer at a time.
type frames struct {
	mu sync.Mutex
	w  http.ResponseWriter
	rc *http.ResponseController
}

func (f *frames) write(kind byte, p []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := proto.WriteFrame(f.w, kind, p); err != nil {
		return err
	}
	return f.rc.Flush()
}

func (a *agent) handleExec(w http.ResponseWriter, r *http.Request) {
	br := bufio.NewReader(r.Body)
	line, err := br.ReadBytes('\n')
	var req proto.ExecRequest
	if err == nil {
		err = json.Unmarshal(line, &req)
	}
	if err != nil {
		reply(w, nil, errdefs.Invalid("exec: request: %v", err))
		return
	}
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	rc.EnableFullDuplex()
	f := &frames{w: w, rc: rc}
	res, err := a.exec(r.Context(), req, br, f)
	out := proto.ExecResult{ExecResult: res}
	if err != nil {
		out.Error = toError(err)
	}
	b, _ := json.Marshal(out)
	f.write(proto.FrameResult, b)
}

func (a *agent) exec(ctx context.Context, req proto.ExecRequest, stdin io.Reader, f *frames) (backend.ExecResult, error) {
	var res backend.ExecResult
	argv := req.Argv
	if req.Shell != "" {
		if len(argv) > 0 {
			return res, errdefs.Invalid("give argv or a shell command, not both")
		}
		argv = []string{"sh", "-c", req.Shell}
	}
	if len(argv) == 0 || argv[0] == "" {
		return res, errdefs.Invalid("empty argv")
	}
	if req.Cwd != "" && !strings.HasPrefix(req.Cwd, "/") {
		return res, errdefs.Invalid("cwd %q is not absolute", req.Cwd)
	}
	a.mu.Lock()
	started, start, ns := a.started, a.start, a.ns
	a.mu.Unlock()
	if !started {
		return res, errdefs.New(errdefs.ErrConflict, "sandbox_not_running", "the sandbox is not started")
	}
	l := launch{Argv: argv, Shell: req.Shell != "", Machine: a.vm}
	if req.User != "" {
		var err error
		if l.UID, l.GID, err = rootfs.LookupUser(userDB(), req.User); err != nil {
			return res, errdefs.Invalid("user %q: %v", req.User, err)
		}
	}
	l.Env = backend.ExecEnv(start.Env, req.Env, l.UID)
	l.Cwd = req.Cwd
	if l.Cwd == "" {
		l.Cwd = start.Workdir
	}
	if l.Cwd == "" {
		l.Cwd = "/"
	}
	caps := guard.Capabilities(l.UID)
	var err error
	if l.Eff, err = guard.CapMask(caps.Effective); err == nil {
		if l.Perm, err = guard.CapMask(caps.Permitted); err == nil {
			l.Bound, err = guard.CapMask(caps.Bounding)
		}
	}
	if err != nil {
		return res, err
	}
	x, err := startLaunch(l, req.Stdin, ns, a.reaps)
	if err != nil {
		return res, err
	}
	defer x.close()
	if req.Stdin {
		go func() {
			io.Copy(x.stdin, stdin)
			x.stdin.Close()
		}()
	}
	go x.copy(x.stdout, proto.FrameStdout, f)
	go x.copy(x.stderr, proto.FrameStderr, f)

	var timeout <-chan time.Time
	if req.Timeout > 0 {
		t := time.NewTimer(req.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	var ws unix.WaitStatus
	select {
	case ws = <-x.exited:
		res.Duration = time.Since(x.start)
		if !x.outputDone(outputGrace) {
			x.killHolders()
		}
		x.evacuate()
	case <-timeout:
		res.TimedOut = true
	case <-ctx.Done():
	}
	if res.Duration == 0 { // killed: the whole tree goes
		x.killAll()
		res.Duration = time.Since(x.start)
		if res.TimedOut {
			res.ExitCode, res.Signal = 128+int(unix.SIGKILL), "SIGKILL"
			return res, nil
		}
		return res, ctx.Err()
	}
	x.waitOutput()
	if stage, err := x.stage(); stage != "" {
		switch stage {
		case "cwd":
			return res, errdefs.Invalid("working directory %s: %v", l.Cwd, err)
		case "notfound":
			res.ExitCode = 127
			f.write(proto.FrameStderr, []byte(fmt.Sprintf("warren: %s: command not found\n", argv[0])))
		case "exec":
			res.ExitCode = 126
			f.write(proto.FrameStderr, []byte(fmt.Sprintf("warren: %s: %v\n", argv[0], err)))
		default:
			return res, fmt.Errorf("exec launcher: %s: %v", stage, err)
		}
		return res, nil
	}
	switch {
	case ws.Signaled():
		res.ExitCode, res.Signal = 128+int(ws.Signal()), unix.SignalName(ws.Signal())
	default:
		res.ExitCode = ws.ExitStatus()
	}
	return res, nil
}

// userDB is the directory whose etc/passwd resolves user names: the
// topmost layer that has one, the environment as built (never the
// sandbox's merged root, which its workload may have rewritten).
func userDB() string {
	ents, _ := os.ReadDir(layersDir)
	for i := len(ents) - 1; i >= 0; i-- {
		d := filepath.Join(layersDir, strconv.Itoa(i))
		if _, err := os.Stat(filepath.Join(d, "etc/passwd")); err == nil {
			return d
		}
	}
	return rootDir
}

// launched is one running exec.
type launched struct {
	pid            int
	cg             string // its cgroup
	start          time.Time
	exited         <-chan unix.WaitStatus
	stdin          *os.File
	stdout, stderr *os.File // our read ends
	pipes          map[string]bool
	status         *os.File
	outputs        sync.WaitGroup
	outDone        chan struct{}
}

// startLaunch starts the launcher in the sandbox's pid namespace and in a
// cgroup of its own under the sandbox's.
func startLaunch(l launch, withStdin bool, ns namespaces, reaps *reaps) (_ *launched, err error) {
	x := &launched{pipes: map[string]bool{}, outDone: make(chan struct{})}
	var closeAfter []*os.File
	defer func() {
		for _, f := range closeAfter {
			f.Close()
		}
		if err != nil {
			x.close()
		}
	}()
	pipe := func() (r, w *os.File, err error) {
		r, w, err = os.Pipe()
		if err == nil {
			var st unix.Stat_t
			unix.Fstat(int(r.Fd()), &st)
			x.pipes[fmt.Sprintf("pipe:[%d]", st.Ino)] = true
		}
		return
	}
	null, err := os.Open("/dev/null")
	if err != nil {
		return nil, err
	}
	closeAfter = append(closeAfter, null)
	in := null
	if withStdin {
		var r *os.File
		if r, x.stdin, err = os.Pipe(); err != nil {
			return nil, err
		}
		in = r
		closeAfter = append(closeAfter, r)
	}
	var outW, errW *os.File
	if x.stdout, outW, err = pipe(); err != nil {
		return nil, err
	}
	closeAfter = append(closeAfter, outW)
	if x.stderr, errW, err = pipe(); err != nil {
		return nil, err
	}
	closeAfter = append(closeAfter, errW)
	cfgR, cfgW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	closeAfter = append(closeAfter, cfgR)
	b, _ := json.Marshal(l)
	go func() { cfgW.Write(b); cfgW.Close() }()
	var stW *os.File
	if x.status, stW, err = os.Pipe(); err != nil {
		return nil, err
	}
	closeAfter = append(closeAfter, stW)
	shell := null
	if l.Shell {
		if shell, err = os.Open(shellPath); err != nil {
			return nil, errdefs.Unavailable("the platform's shell: %v", err)
		}
		closeAfter = append(closeAfter, shell)
	}

	var rnd [6]byte
	rand.Read(rnd[:])
	x.cg = filepath.Join(sandboxCg, "exec-"+hex.EncodeToString(rnd[:]))
	if err := os.Mkdir(x.cg, 0o755); err != nil {
		return nil, err
	}
	cgFd, err := unix.Open(x.cg, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(cgFd)
	attr := &syscall.ProcAttr{
		Env:   []string{},
		Files: []uintptr{in.Fd(), outW.Fd(), errW.Fd(), cfgR.Fd(), stW.Fd(), ns.mnt.Fd(), shell.Fd(), ns.uts.Fd(), ns.ipc.Fd()},
		Sys:   &syscall.SysProcAttr{Setsid: true, UseCgroupFD: true, CgroupFD: cgFd},
	}
	// The launcher is born in the sandbox's pid namespace: setns(2) of a
	// pid namespace applies to the children of the calling thread, which
	// ends with the call (osthread).
	var pid int
	err = osthread.Run(func() error {
		if err := unix.Setns(int(ns.pid.Fd()), unix.CLONE_NEWPID); err != nil {
			return fmt.Errorf("join the sandbox's pid namespace: %w", err)
		}
		var err error
		pid, err = syscall.ForkExec(selfExe, []string{roleLauncher}, attr)
		return err
	})
	if err != nil {
		os.Remove(x.cg)
		return nil, fmt.Errorf("start: %w", err)
	}
	x.pid, x.start, x.exited = pid, time.Now(), reaps.watch(pid)
	x.outputs.Add(2)
	go func() { x.outputs.Wait(); close(x.outDone) }()
	return x, nil
}

func (x *launched) copy(r *os.File, kind byte, f *frames) {
	defer x.outputs.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			f.write(kind, buf[:n])
		}
		if err != nil {
			return
		}
	}
}

func (x *launched) outputDone(d time.Duration) bool {
	select {
	case <-x.outDone:
		return true
	case <-time.After(d):
		return false
	}
}

func (x *launched) waitOutput() {
	if !x.outputDone(5 * time.Second) {
		x.killHolders()
		x.outputDone(5 * time.Second)
	}
}

// killHolders kills the exec's processes that hold its stdout or stderr.
func (x *launched) killHolders() {
	for i := 0; !x.outputDone(10*time.Millisecond) && i < 500; i++ {
		for _, pid := range procs(x.cg) {
			fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
			for _, fd := range fds {
				if t, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && x.pipes[t] {
					unix.Kill(pid, unix.SIGKILL)
					break
				}
			}
		}
	}
}

// evacuate moves what the exec left running to the sandbox's cgroup: a
// background process outlives its exec.
func (x *launched) evacuate() {
	for _, pid := range procs(x.cg) {
		os.WriteFile(filepath.Join(sandboxCg, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0)
	}
}

// killAll kills everything in the exec's cgroup until the launcher has
// been reaped and nothing is left.
func (x *launched) killAll() {
	kill := func() { os.WriteFile(filepath.Join(x.cg, "cgroup.kill"), []byte("1"), 0) }
	kill()
	select {
	case <-x.exited:
	case <-time.After(30 * time.Second):
	}
	for i := 0; i < 1000 && len(procs(x.cg)) > 0; i++ {
		kill()
		time.Sleep(5 * time.Millisecond)
	}
	x.outputDone(time.Second)
}

// stage reads what the launcher said before it exec'd the command, if it
// failed: "cwd", "notfound", "exec" or a setup step, with the errno.
func (x *launched) stage() (string, error) {
	b, _ := io.ReadAll(io.LimitReader(x.status, 4096))
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", nil
	}
	stage, msg, _ := strings.Cut(s, " ")
	if n, err := strconv.Atoi(msg); err == nil {
		return stage, unix.Errno(n)
	}
	return stage, errors.New(msg)
}

func (x *launched) close() {
	for _, f := range []*os.File{x.stdin, x.stdout, x.stderr, x.status} {
		if f != nil {
			f.Close()
		}
	}
	if x.cg != "" {
		for i := 0; i < 100; i++ {
			if err := os.Remove(x.cg); err == nil || os.IsNotExist(err) {
				break
			}
			x.evacuate()
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// procs lists the pids in cgroup dir.
func procs(dir string) []int {
	b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}
