package fninit

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/fncall/proto"
)

// run starts r as the runs' uid, relays its output under the cap, and
// ends it on its exit, on the wall limit, on an output overflow or on a Kill
// from the agent. Whatever ends it, every other process in the container is
// killed and reaped before the result is returned, so the next run starts in
// an empty container.
func (in *init1) run(r *proto.Run) proto.RunResult {
	res, pid, outs, err := in.start(r)
	if err != nil {
		return res
	}
	start := time.Now()

	exited := make(chan struct{})
	reaped := make(chan struct{}) // closed at ECHILD: only fninit is left
	var ws unix.WaitStatus
	var ru unix.Rusage
	go func() { // reap everything; note the run's own end
		defer close(reaped)
		for {
			var s unix.WaitStatus
			var u unix.Rusage
			p, err := unix.Wait4(-1, &s, 0, &u)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil { // ECHILD: nothing left
				return
			}
			if p == pid {
				ws, ru = s, u
				res.WallNs = int64(time.Since(start))
				close(exited)
			}
		}
	}()

	var timeout <-chan time.Time
	if r.WallNs > 0 {
		t := time.NewTimer(time.Duration(r.WallNs))
		defer t.Stop()
		timeout = t.C
	}
	killAll := func(reason string) {
		if res.Killed == "" {
			res.Killed = reason
		}
		_ = unix.Kill(-1, unix.SIGKILL)
	}
	msgs := in.msgs
wait:
	for {
		select {
		case <-exited:
			break wait
		case <-timeout:
			killAll("wall")
		case <-outs.overflow:
			killAll("output")
		case m, ok := <-msgs:
			switch {
			case !ok: // the agent is gone: so is the container
				msgs = nil
				killAll("closed")
			case m.Kill != "":
				killAll(m.Kill)
			}
		}
	}
	// The run is over: nothing it started may outlive it.
	_ = unix.Kill(-1, unix.SIGKILL)
	outs.wait()
	<-reaped // before the next run forks, or this reaper could take its pid

	res.Stdout, res.StdoutBytes = outs.out.bytes()
	res.Stderr, res.StderrBytes = outs.err.bytes()
	res.CPUNs = syscall.TimevalToNsec(syscall.Timeval(ru.Utime)) + syscall.TimevalToNsec(syscall.Timeval(ru.Stime))
	res.MaxRSSKiB = ru.Maxrss
	switch {
	case ws.Exited():
		res.ExitCode = ws.ExitStatus()
	case ws.Signaled():
		res.Signal = int(ws.Signal())
		res.ExitCode = 128 + res.Signal
	}
	return res
}

// start forks and execs the run. On error, res says why (the program's
// fault: not found, not executable).
func (in *init1) start(r *proto.Run) (res proto.RunResult, pid int, outs *outputs, err error) {
	fail := func(code int, err error) (proto.RunResult, int, *outputs, error) {
		return proto.RunResult{ExitCode: code, StartError: err.Error()}, 0, nil, err
	}
	if len(r.Argv) == 0 {
		return fail(127, errors.New("empty argv"))
	}
	path, err := lookPath(r.Argv[0], r.Env, r.Dir)
	if err != nil {
		return fail(127, err)
	}
	stdin, err := stdinFile(r.Stdin)
	if err != nil {
		return fail(127, err)
	}
	defer stdin.Close()
	outs, outW, errW, err := newOutputs(r.OutputBytes)
	if err != nil {
		return fail(127, err)
	}
	setLimits(r)
	s := in.setup
	pid, err = syscall.ForkExec(path, r.Argv, &syscall.ProcAttr{
		Dir:   r.Dir,
		Env:   r.Env,
		Files: []uintptr{stdin.Fd(), outW.Fd(), errW.Fd()},
		Sys: &syscall.SysProcAttr{
			Credential: &syscall.Credential{Uid: uint32(s.UID), Gid: uint32(s.GID), Groups: []uint32{}},
			Setsid:     true,
		},
	})
	outW.Close()
	errW.Close()
	if err != nil {
		outs.wait()
		code := 126
		if errors.Is(err, syscall.ENOENT) {
			code = 127
		}
		return proto.RunResult{ExitCode: code, StartError: fmt.Sprintf("%s: %v", r.Argv[0], err)}, 0, nil, err
	}
	// The OOM killer must pick the run (and what it starts), never
	// fninit: raising a score needs no privilege, lowering fninit's might
	// be refused.
	_ = os.WriteFile("/proc/"+strconv.Itoa(pid)+"/oom_score_adj", []byte("1000"), 0)
	return proto.RunResult{}, pid, outs, nil
}

// setLimits sets the rlimits a run inherits. fninit itself writes no file
// and uses little CPU after the files step, so it can carry them.
func setLimits(r *proto.Run) {
	set := func(res int, cur, max uint64) {
		_ = unix.Setrlimit(res, &unix.Rlimit{Cur: cur, Max: max})
	}
	inf := uint64(unix.RLIM_INFINITY)
	if r.FileBytes > 0 {
		set(unix.RLIMIT_FSIZE, uint64(r.FileBytes), uint64(r.FileBytes))
	} else {
		set(unix.RLIMIT_FSIZE, inf, inf)
	}
	if r.CPUSeconds > 0 {
		set(unix.RLIMIT_CPU, uint64(r.CPUSeconds), uint64(r.CPUSeconds)+1)
	} else {
		set(unix.RLIMIT_CPU, inf, inf)
	}
	if r.StackBytes > 0 {
		set(unix.RLIMIT_STACK, uint64(r.StackBytes), uint64(r.StackBytes))
	}
	set(unix.RLIMIT_CORE, 0, 0)
}

// stdinFile is the run's stdin: a memfd holding data (the program may read
// it at its own pace, or not at all), or /dev/null.
func stdinFile(data []byte) (*os.File, error) {
	if len(data) == 0 {
		return os.Open("/dev/null")
	}
	fd, err := unix.MemfdCreate("stdin", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "stdin")
	if _, err := f.Write(data); err != nil {
		f.Close()
		return nil, err
	}
	if _, err := f.Seek(0, 0); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// lookPath finds name in env's PATH like execvp, relative names against dir.
func lookPath(name string, env []string, dir string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path := "/usr/local/bin:/usr/bin:/bin"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, d := range filepath.SplitList(path) {
		if d == "" {
			d = "."
		}
		p := filepath.Join(d, name)
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: command not found", name)
}

// outputs relays a run's stdout and stderr.
type outputs struct {
	out, err *capture
	overflow chan struct{} // closed when either passes the cap
	once     sync.Once
	done     sync.WaitGroup
}

func newOutputs(limit int64) (o *outputs, outW, errW *os.File, err error) {
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, nil, nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, nil, nil, err
	}
	o = &outputs{overflow: make(chan struct{})}
	o.out = &capture{limit: limit}
	o.err = &capture{limit: limit}
	o.done.Add(2)
	go o.pump(outR, o.out)
	go o.pump(errR, o.err)
	return o, outW, errW, nil
}

func (o *outputs) pump(r *os.File, c *capture) {
	defer o.done.Done()
	defer r.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 && c.add(buf[:n]) {
			o.once.Do(func() { close(o.overflow) })
		}
		if err != nil {
			return
		}
	}
}

func (o *outputs) wait() { o.done.Wait() }

// capture keeps the first limit bytes (0: unlimited) and counts the rest.
type capture struct {
	limit int64
	buf   []byte
	total int64
}

// add reports whether the total just passed the limit.
func (c *capture) add(p []byte) bool {
	c.total += int64(len(p))
	room := len(p)
	if c.limit > 0 {
		room = int(min(int64(len(p)), max(c.limit-int64(len(c.buf)), 0)))
	}
	c.buf = append(c.buf, p[:room]...)
	return c.limit > 0 && c.total > c.limit
}

func (c *capture) bytes() ([]byte, int64) { return c.buf, c.total }
