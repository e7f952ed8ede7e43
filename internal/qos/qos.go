// Package qos puts a sandbox's work into its quality-of-service class on
// the host's CPU scheduler.
//
// There are two classes (api.QoSLatency, the default, and
// api.QoSBestEffort). Latency work is scheduled as any process is.
// Best-effort work yields to it, at two levels:
//
//   - Every thread of a best-effort sandbox runs under SCHED_IDLE: the
//     kernel runs it only when nothing else wants the CPU, and a waking
//     normal task preempts it at once. The policy is inherited across fork
//     and exec, so what the sandbox starts stays idle; leaving it needs
//     CAP_SYS_NICE or an RLIMIT_NICE above 0 (sched(7)), and a sandbox has
//     neither (RLIMITNice). Backends set it on the sandbox's init and on
//     every process they start in it (Idle, IdleTree; the container
//     backend's exec launcher does it itself before exec).
//   - The class's cgroup (ClassGroup), which holds the best-effort
//     sandboxes' cgroups, is an idle group (SetGroupIdle): cpu.idle, which
//     Linux has had on v1 and v2 alike since 5.15, gives the group as a
//     whole SCHED_IDLE's weight against its sibling groups (the latency
//     sandboxes'), which per-task SCHED_IDLE alone does not (with group
//     scheduling, a task's policy counts only among the tasks of its own
//     group: DSec measured SCHED_IDLE alone helping latency work by at
//     most 3.4%). Where cpu.idle is missing, the group gets the least
//     weight there is (cpu.shares 2, cpu.weight 1).
//
// Core scheduling keeps best-effort and latency work off sibling SMT
// threads of one core (a busy sibling slows a core's other thread, and
// leaks through shared caches). It needs CONFIG_SCHED_CORE and SMT; Probe
// reports whether the host has both. Where it does, a best-effort
// sandbox's init gets a core scheduling cookie of its own (CoreCookie),
// which its children inherit and its execs share (the exec launcher asks
// for the init's), so its threads never share a core with a latency
// sandbox's. Where it does not, there is nothing to keep apart (no SMT) or
// no way to (no core scheduling), and the node says so.
package qos

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/cgroup"
	"github.com/warrenhq/warren/internal/osthread"
)

// ClassGroup is the cgroup, below a backend's cgroup parent, that holds
// the best-effort sandboxes' cgroups: one idle group for the whole class,
// so that however many best-effort sandboxes are runnable, together they
// weigh as one idle entity against the latency sandboxes beside them (an
// idle group of each would add up: a thousand of them weigh 3,000, three
// latency sandboxes' worth).
const ClassGroup = "best-effort"

// RLIMITNice is the RLIMIT_NICE a sandbox's processes get (soft and
// hard): 0, so that none can leave SCHED_IDLE or lower its nice value.
const RLIMITNice = 0

// Group says how SetGroupIdle made a cgroup yield.
const (
	GroupCPUIdle   = "cpu.idle"   // an idle group (Linux >= 5.15)
	GroupCPUShares = "cpu.shares" // v1 without cpu.idle: the least shares
	GroupCPUWeight = "cpu.weight" // v2 without cpu.idle: the least weight
)

// SetGroupIdle makes cgroup d yield the CPU to its sibling groups: an idle
// group where the kernel has cpu.idle, else the least weight. It returns
// which of the Group* it used. d must be in a hierarchy with the cpu
// controller (v1 cpu, or v2 with cpu enabled).
func SetGroupIdle(d cgroup.Dir) (string, error) {
	try := []struct{ file, value, how string }{{"cpu.idle", "1", GroupCPUIdle}}
	if d.V2 {
		try = append(try, struct{ file, value, how string }{"cpu.weight", "1", GroupCPUWeight})
	} else {
		try = append(try, struct{ file, value, how string }{"cpu.shares", "2", GroupCPUShares})
	}
	for _, t := range try {
		path := filepath.Join(d.Path, t.file)
		if _, err := os.Stat(path); err != nil {
			continue
		}
		if err := os.WriteFile(path, []byte(t.value), 0); err != nil {
			return "", fmt.Errorf("qos: %s: %w", path, err)
		}
		return t.how, nil
	}
	return "", fmt.Errorf("qos: %s has neither cpu.idle nor a CPU weight: not a cpu cgroup", d.Path)
}

// GroupIdle reports whether cgroup d is an idle group (cpu.idle 1).
func GroupIdle(d cgroup.Dir) bool {
	b, err := os.ReadFile(filepath.Join(d.Path, "cpu.idle"))
	return err == nil && strings.TrimSpace(string(b)) == "1"
}

// Idle puts every thread of process pid under SCHED_IDLE. A process that
// is gone is no error: it no longer needs it.
func Idle(pid int) error {
	tids, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("qos: %w", err)
	}
	for _, t := range tids {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := idleThread(tid); err != nil {
			return err
		}
	}
	return nil
}

// IdleTree puts every thread in cgroup d and below under SCHED_IDLE (the
// v1 tasks file or v2 cgroup.threads list them all). Threads that end
// meanwhile are no error; ones started meanwhile inherit the policy from
// their parent once it has it, so a second pass (by the caller) catches
// those forked from a parent not yet done.
func IdleTree(d cgroup.Dir) error {
	tree, err := d.Tree()
	if err != nil {
		return fmt.Errorf("qos: %w", err)
	}
	name := "tasks"
	if d.V2 {
		name = "cgroup.threads"
	}
	for _, c := range tree {
		b, err := os.ReadFile(filepath.Join(c.Path, name))
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ENODEV) {
			continue
		}
		if err != nil {
			return fmt.Errorf("qos: %w", err)
		}
		for _, f := range strings.Fields(string(b)) {
			tid, err := strconv.Atoi(f)
			if err != nil {
				continue
			}
			if err := idleThread(tid); err != nil {
				return err
			}
		}
	}
	return nil
}

func idleThread(tid int) error {
	attr := unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_IDLE}
	if err := unix.SchedSetAttr(tid, &attr, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("qos: SCHED_IDLE for thread %d: %w", tid, err)
	}
	return nil
}

// Policy returns the scheduling policy of thread tid (unix.SCHED_*).
func Policy(tid int) (uint32, error) {
	attr, err := unix.SchedGetAttr(tid, 0)
	if err != nil {
		return 0, err
	}
	return attr.Policy, nil
}

// Support is what the host offers the classes.
type Support struct {
	// Group is how a best-effort sandbox's cgroup yields (Group*).
	Group string `json:"group"`
	// CoreScheduling is "on" where the kernel has core scheduling and
	// the CPUs have SMT siblings to keep apart, else why not.
	CoreScheduling string `json:"core_scheduling"`
}

// Probe reports what this host offers.
func Probe() Support {
	var s Support
	l, err := cgroup.Host()
	switch {
	case err != nil:
		s.Group = "unavailable: " + err.Error()
	case l.Mode != cgroup.Unified:
		s.Group = GroupCPUShares
		if d, ok := l.V1Dir("cpu", "/"); ok && fileExists(filepath.Join(d, "cpu.idle")) {
			s.Group = GroupCPUIdle
		}
	default:
		// The unified root has no cpu.idle of its own: the kernel's
		// version says whether its children do.
		s.Group = GroupCPUWeight
		var u unix.Utsname
		if unix.Uname(&u) == nil && kernelAtLeast(unix.ByteSliceToString(u.Release[:]), 5, 15) {
			s.Group = GroupCPUIdle
		}
	}
	s.CoreScheduling = CoreSchedulingOn
	if why := coreScheduling(); why != "" {
		s.CoreScheduling = why
	}
	return s
}

// CoreSchedulingOn is Support.CoreScheduling where best-effort sandboxes
// get core scheduling cookies of their own.
const CoreSchedulingOn = "on"

// prctl(PR_SCHED_CORE, ...) (linux/prctl.h).
const (
	prSchedCore       = 62
	prSchedCoreGet    = 0
	prSchedCoreCreate = 1
	pidtypePID        = 0
	pidtypeTGID       = 1
)

// CoreCookie gives process pid (all its threads) a core scheduling cookie
// of its own, which its children inherit: its threads then share a core
// only with threads holding the same cookie.
func CoreCookie(pid int) error {
	if _, _, errno := unix.Syscall6(unix.SYS_PRCTL, prSchedCore, prSchedCoreCreate, uintptr(pid), pidtypeTGID, 0, 0); errno != 0 {
		return fmt.Errorf("qos: core scheduling cookie for %d: %w", pid, errno)
	}
	return nil
}

// coreScheduling says why core scheduling cannot keep classes apart
// here, or "" if it can: PR_SCHED_CORE answers EINVAL without
// CONFIG_SCHED_CORE, and without SMT there are no sibling threads to keep
// apart.
func coreScheduling() string {
	var cookie uint64
	_, _, errno := unix.Syscall6(unix.SYS_PRCTL, prSchedCore, prSchedCoreGet, 0, pidtypePID, uintptr(unsafe.Pointer(&cookie)), 0)
	if errno != 0 {
		return "unavailable: the kernel has no core scheduling (CONFIG_SCHED_CORE)"
	}
	if b, err := os.ReadFile("/sys/devices/system/cpu/smt/active"); err != nil || strings.TrimSpace(string(b)) != "1" {
		return "not needed: no SMT siblings on this host"
	}
	return ""
}

// kernelAtLeast reports whether release ("6.1.0-48-amd64") is at least
// major.minor.
func kernelAtLeast(release string, major, minor int) bool {
	var ma, mi int
	if _, err := fmt.Sscanf(release, "%d.%d", &ma, &mi); err != nil {
		return false
	}
	return ma > major || ma == major && mi >= minor
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// RunIdle runs f on an OS thread of its own under SCHED_IDLE, which ends
// with it: for the node's own background work whose cost lands in the
// kernel on the caller's time (proactive reclaim walks every shrinker of
// a memory cgroup), so that it never takes CPU from a sandbox that wants
// it.
func RunIdle(f func() error) error {
	return osthread.Run(func() error {
		if err := idleThread(0); err != nil {
			return err
		}
		return f()
	})
}

// StartIdle starts cmd under SCHED_IDLE from its first instruction, so
// that no thread it makes ever runs as normal work: it is forked from an
// OS thread of its own put under SCHED_IDLE (a child inherits the policy
// of the thread that forked it), and that thread ends with its goroutine.
// Not for commands with a Pdeathsig: they would die with that thread.
func StartIdle(cmd *exec.Cmd) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		attr := unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_IDLE}
		if err := unix.SchedSetAttr(0, &attr, 0); err != nil {
			errc <- fmt.Errorf("qos: SCHED_IDLE: %w", err)
			return
		}
		errc <- cmd.Start()
	}()
	return <-errc
}

// Who a host-wide OOM kills first. Admission by real use and the node's
// eviction of best-effort sandboxes under pressure keep the host out of
// it; should memory run out faster than they act (overcommit, a burst),
// the kernel's OOM killer picks the process with the highest badness: its
// share of memory plus oom_score_adj/1000 of all of it. Every process of
// a sandbox gets a positive adjustment, a best-effort one's the most, so
// that sandboxes go first, best-effort before latency, and the agent and
// the node's own daemons last. A sandbox cannot lower its own below the
// floor (oom_score_adj_min) the process that set it left: its value where
// that process had CAP_SYS_RESOURCE (root on most hosts; a sandbox never
// has it in the host's user namespace), else the floor it inherited, 0
// from the host's init (then a sandbox can come down to 0, no lower: the
// agent's own where it cannot lower that either).
const (
	OOMScoreLatency    = 500
	OOMScoreBestEffort = 1000
	// OOMScoreAgent is what the agent asks for itself (ProtectSelf): as
	// kubelet's, not -1000, which would make it unkillable outright.
	OOMScoreAgent = -999
)

// OOMScoreAdj is the oom_score_adj of a sandbox's processes.
func OOMScoreAdj(bestEffort bool) int {
	if bestEffort {
		return OOMScoreBestEffort
	}
	return OOMScoreLatency
}

// SetOOMScoreAdj sets process pid's oom_score_adj.
func SetOOMScoreAdj(pid, adj int) error {
	if err := os.WriteFile("/proc/"+strconv.Itoa(pid)+"/oom_score_adj", []byte(strconv.Itoa(adj)), 0); err != nil {
		return fmt.Errorf("oom_score_adj of %d: %w", pid, err)
	}
	return nil
}

// ReadOOMScoreAdj returns process pid's oom_score_adj.
func ReadOOMScoreAdj(pid int) (int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/oom_score_adj")
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// ProtectSelf lowers this process's oom_score_adj to OOMScoreAgent, and
// returns what it has after: unchanged where it lacks CAP_SYS_RESOURCE
// (then err says so). Processes it starts inherit it; those that run a
// sandbox's work get theirs (OOMScoreAdj).
func ProtectSelf() (int, error) {
	err := SetOOMScoreAdj(os.Getpid(), OOMScoreAgent)
	if err != nil {
		err = fmt.Errorf("%w (lowering it takes CAP_SYS_RESOURCE)", err)
	}
	adj, rerr := ReadOOMScoreAdj(os.Getpid())
	if rerr != nil && err == nil {
		err = rerr
	}
	return adj, err
}

// OOMOrder describes the kill order in force for node status, given the
// agent's own oom_score_adj.
func OOMOrder(agent int) string {
	return fmt.Sprintf("best-effort %d, latency %d, agent %d", OOMScoreBestEffort, OOMScoreLatency, agent)
}
