package fncall

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/fncall/proto"
)

// killGrace is how long a run may take to answer after a Kill or a
// cancelled call before the box counts as broken.
const killGrace = 5 * time.Second

// exec runs one process in b under lim and classifies how it ended. The
// accounting comes from the box's cgroup, which only this run's processes
// (and the idle fninit) use: CPU time is cpuacct's, peak memory is the
// cgroup's high-water mark above what the box used before the run. A
// platform fault is a SandboxError result, never an error.
func (b *box) exec(ctx context.Context, run proto.Run, lim limits) api.FnCaseResult {
	res, err := b.execRaw(ctx, run, lim)
	if err != nil {
		return api.FnCaseResult{Status: api.FnSandboxError, ExitCode: -1, Message: err.Error()}
	}
	return res
}

func (b *box) execRaw(ctx context.Context, run proto.Run, lim limits) (api.FnCaseResult, error) {
	before, err := b.prepare(lim)
	if err != nil {
		return api.FnCaseResult{}, err
	}
	run.WallNs = int64(lim.wall)
	run.OutputBytes = lim.output
	run.FileBytes = lim.fileSize
	run.CPUSeconds = int64(lim.cpu/time.Second) + 1 // backstop for the watch below
	run.StackBytes = lim.memory
	if err := b.send(proto.RunFrame(&run)); err != nil {
		return api.FnCaseResult{}, err
	}

	// Watch CPU time in the cgroup: RLIMIT_CPU counts one process and
	// whole seconds; this counts every process, finely. The waits for the
	// result end at each watch.
	every := min(max(lim.cpu/20, 5*time.Millisecond), 50*time.Millisecond)
	var killed string
	kill := func(reason string) error {
		if killed != "" {
			return nil
		}
		killed = reason
		return b.send(proto.KillFrame(reason), nil)
	}
	var giveUp time.Time // set once the run was told to end for the call's sake
	for {
		r, err := b.next(time.Now().Add(every))
		switch {
		case err == nil && r.Result == nil:
			return api.FnCaseResult{}, fmt.Errorf("container: %s", r.Error)
		case err == nil:
			return b.classify(r.Result, before, lim)
		case err != errNoReplyYet:
			return api.FnCaseResult{}, err
		}
		cpu, err := b.cg.cpuNs()
		if err != nil {
			return api.FnCaseResult{}, err
		}
		b.cg.sample()
		if cpu-before.cpuNs > int64(lim.cpu) {
			if err := kill("cpu"); err != nil {
				return api.FnCaseResult{}, err
			}
		}
		if ctx.Err() != nil {
			if err := kill("cancelled"); err != nil {
				return api.FnCaseResult{}, err
			}
			if giveUp.IsZero() {
				giveUp = time.Now().Add(killGrace)
			} else if time.Now().After(giveUp) {
				return api.FnCaseResult{}, fmt.Errorf("%w: run not ended %s after the call was cancelled", errBoxGone, killGrace)
			}
		}
	}
}

// prepare sets the box's limits for the next run and returns the counters
// before it.
func (b *box) prepare(lim limits) (counters, error) {
	c, err := b.cg.before()
	if err != nil {
		return c, err
	}
	if err := b.cg.setMemory(c.memory + lim.memory); err != nil {
		return c, err
	}
	// Between runs pid 1 is alone and single-threaded: it counts as one.
	if err := b.cg.setPids(1 + lim.pids); err != nil {
		return c, err
	}
	if err := b.cg.resetPeak(); err != nil {
		return c, err
	}
	return c, nil
}

// classify turns fninit's report and the cgroup's counters into a result.
func (b *box) classify(r *proto.RunResult, before counters, lim limits) (api.FnCaseResult, error) {
	after, err := b.cg.after()
	if err != nil {
		return api.FnCaseResult{}, err
	}
	res := api.FnCaseResult{
		ExitCode:        r.ExitCode,
		StdoutTruncated: r.StdoutBytes > int64(len(r.Stdout)),
		StderrTruncated: r.StderrBytes > int64(len(r.Stderr)),
		StdoutBytes:     r.StdoutBytes,
		StderrBytes:     r.StderrBytes,
		CPUMs:           (after.cpuNs - before.cpuNs) / 1e6,
		WallMs:          r.WallNs / 1e6,
		PeakMemory:      max(after.peak-before.memory, 0),
	}
	res.Stdout, res.StdoutEncoding = api.EncodeBytes(r.Stdout)
	res.Stderr, res.StderrEncoding = api.EncodeBytes(r.Stderr)
	sig := syscall.Signal(r.Signal)
	if r.Signal != 0 {
		res.Signal = signalName(sig)
	}
	cpuOver := after.cpuNs-before.cpuNs > int64(lim.cpu)
	oom := after.oomKill > before.oomKill
	switch {
	case r.Killed == "wall":
		res.Status, res.Message = api.FnTimeLimit, fmt.Sprintf("wall time limit %s", lim.wall)
	case r.Killed == "cpu" || sig == syscall.SIGXCPU || (cpuOver && r.Signal != 0):
		res.Status, res.Message = api.FnTimeLimit, fmt.Sprintf("CPU time limit %s", lim.cpu)
	case r.Killed == "output":
		res.Status, res.Message = api.FnOutputLimit, fmt.Sprintf("output limit %d bytes", lim.output)
	case r.Killed == "cancelled":
		return res, errors.New("call cancelled")
	case r.Killed != "":
		return res, fmt.Errorf("run killed: %s", r.Killed)
	case oom || (r.ExitCode != 0 && after.failcnt > before.failcnt):
		res.Status, res.Message = api.FnMemoryLimit, fmt.Sprintf("memory limit %d bytes", lim.memory)
	case sig == syscall.SIGXFSZ:
		res.Status, res.Message = api.FnOutputLimit, fmt.Sprintf("file size limit %d bytes", lim.fileSize)
	case r.Signal != 0:
		res.Status = api.FnSignal
	case r.ExitCode != 0:
		res.Status, res.Message = api.FnNonZeroExit, r.StartError
	case cpuOver:
		// It finished, but used more CPU than allowed between two
		// watches: still over the limit.
		res.Status, res.Message = api.FnTimeLimit, fmt.Sprintf("CPU time limit %s", lim.cpu)
	default:
		res.Status = api.FnOK
	}
	if n := after.forkFails - before.forkFails; n > 0 && res.Message == "" {
		res.Message = fmt.Sprintf("pids limit %d reached: %d forks refused", lim.pids, n)
	}
	return res, nil
}

// signalName is the signal's name ("SIGSEGV"), or SIG<n> for one without.
func signalName(s syscall.Signal) string {
	if n := unix.SignalName(s); n != "" {
		return n
	}
	return fmt.Sprintf("SIG%d", int(s))
}
