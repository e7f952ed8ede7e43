package container

import (
	"bufio"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/guard"
)

// This file is the agent's side of warren-enter (cmd/warren-enter), the
// launcher every exec goes through: what it is told, and what it answers.

// enterMagic opens every request ("WEN5"): the format's version, raised
// with every change to it; keep in step with enter.c.
const enterMagic = 0x354e4557

// execUmask is the umask of exec'd commands, as runc and a login set it.
const execUmask = 0o022

// enterRequest is one exec as warren-enter carries it out.
type enterRequest struct {
	uid, gid                  uint32
	groups                    []uint32
	capEff, capPerm, capBound uint64
	rlimits                   []rlimit
	cwd                       string
	argv, env                 []string
	execFd                    int // -1: argv[0] looked up in env's PATH
	filters                   [][]byte
	cgroupFds                 []int
	landlockHandled           uint64 // 0: no Landlock
	landlockAllowed           uint64
	userns                    bool   // join the init's user namespace too
	apparmor                  string // the AppArmor profile to exec under; "": none
	schedIdle                 bool   // run under SCHED_IDLE (a best-effort sandbox)
	coreShare                 bool   // share the init's core scheduling cookie
	memoryMerge               bool   // opted into KSM (Spec.MemoryMerge), as the init is
	oomScoreAdj               int    // the sandbox's (qos.OOMScoreAdj), as the init's
}

type rlimit struct{ resource, soft, hard uint64 }

// encode returns the request in enter.c's format: little-endian u64s,
// strings as a u64 length and bytes, lists as a u64 count and items.
func (r *enterRequest) encode() []byte {
	var b []byte
	u := func(v uint64) { b = binary.LittleEndian.AppendUint64(b, v) }
	str := func(s string) { u(uint64(len(s))); b = append(b, s...) }
	strs := func(v []string) {
		u(uint64(len(v)))
		for _, s := range v {
			str(s)
		}
	}
	u(enterMagic)
	u(uint64(r.uid))
	u(uint64(r.gid))
	u(uint64(len(r.groups)))
	for _, g := range r.groups {
		u(uint64(g))
	}
	u(r.capEff)
	u(r.capPerm)
	u(r.capBound)
	u(uint64(len(r.rlimits)))
	for _, l := range r.rlimits {
		u(l.resource)
		u(l.soft)
		u(l.hard)
	}
	u(execUmask)
	str(r.cwd)
	strs(r.argv)
	strs(r.env)
	u(uint64(int64(r.execFd)))
	u(uint64(len(r.filters)))
	for _, f := range r.filters {
		str(string(f))
	}
	u(uint64(len(r.cgroupFds)))
	for _, fd := range r.cgroupFds {
		u(uint64(fd))
	}
	flag := func(v bool) {
		if v {
			u(1)
		} else {
			u(0)
		}
	}
	u(r.landlockHandled)
	u(r.landlockAllowed)
	flag(r.userns)
	str(r.apparmor)
	flag(r.schedIdle)
	flag(r.coreShare)
	flag(r.memoryMerge)
	u(uint64(int64(r.oomScoreAdj)))
	return b
}

// memfdOf returns b in a memfd (made with flags besides MFD_CLOEXEC): the
// request, read by warren-enter with one mmap, or the trusted shell.
func memfdOf(name string, b []byte, flags int) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|flags)
	if errors.Is(err, unix.EINVAL) && flags&unix.MFD_EXEC != 0 { // kernels before 6.3
		fd, err = unix.MemfdCreate(name, unix.MFD_CLOEXEC|flags&^unix.MFD_EXEC)
	}
	if err != nil {
		return nil, fmt.Errorf("memfd: %w", err)
	}
	f := os.NewFile(uintptr(fd), name)
	if _, err := f.Write(b); err != nil {
		f.Close()
		return nil, fmt.Errorf("memfd: %w", err)
	}
	return f, nil
}

// rlimitNumbers are the rlimits the backend sets, by their OCI names.
var rlimitNumbers = map[string]uint64{
	"RLIMIT_NOFILE": unix.RLIMIT_NOFILE, "RLIMIT_NPROC": unix.RLIMIT_NPROC,
	"RLIMIT_CORE": unix.RLIMIT_CORE, "RLIMIT_STACK": unix.RLIMIT_STACK,
	"RLIMIT_MEMLOCK": unix.RLIMIT_MEMLOCK, "RLIMIT_NICE": unix.RLIMIT_NICE,
}

// enterStatus is how warren-enter said the exec ended.
type enterStatus struct {
	exited   bool   // "exit N"
	signaled bool   // "signal N"
	stage    string // "error STAGE N": the command never ran
	n        int
}

// readEnterStatus parses warren-enter's one line.
func readEnterStatus(r io.Reader) (enterStatus, error) {
	line, err := bufio.NewReader(io.LimitReader(r, 128)).ReadString('\n')
	if err != nil {
		return enterStatus{}, fmt.Errorf("warren-enter said nothing (%w)", err)
	}
	f := strings.Fields(line)
	var st enterStatus
	switch {
	case len(f) == 2 && f[0] == "exit":
		st.exited = true
	case len(f) == 2 && f[0] == "signal":
		st.signaled = true
	case len(f) == 3 && f[0] == "error":
		st.stage = f[1]
	default:
		return st, fmt.Errorf("warren-enter: unexpected status %q", line)
	}
	st.n, err = strconv.Atoi(f[len(f)-1])
	if err != nil {
		return st, fmt.Errorf("warren-enter: unexpected status %q", line)
	}
	return st, nil
}

// initFilters returns the seccomp filters the sandbox's init runs under,
// oldest first, exactly as the kernel holds them: what runc compiled from
// the sandbox's profile. Every exec loads these, so the two cannot drift
// apart and warren needs no seccomp compiler of its own. The init is
// stopped for the few system calls this takes (PTRACE_SECCOMP_GET_FILTER
// needs a stopped tracee; the kernel needs CONFIG_CHECKPOINT_RESTORE);
// nothing in the sandbox can add to its filters or remove one (the init is
// non-dumpable and has no capabilities), so what is read is what runs.
//
// runc loads the filter just before it execs the init, after Start has
// returned, so a call right after Start waits (up to wait) for the init
// to be catatonit and filtered: a multi-threaded runc init in the middle
// of its execve is no process to stop and read.
func initFilters(p initProc, wait time.Duration) ([][]byte, error) {
	deadline := time.Now().Add(wait)
	for {
		n, err := seccompFilterCount(p.pid)
		if err != nil {
			return nil, err
		}
		comm, err := os.ReadFile("/proc/" + strconv.Itoa(p.pid) + "/comm")
		if err != nil {
			return nil, err
		}
		if n > 0 && !strings.HasPrefix(string(comm), "runc:") {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the init (pid %d, %q) is not running under its seccomp filter yet", p.pid, strings.TrimSpace(string(comm)))
		}
		time.Sleep(time.Millisecond)
	}

	runtime.LockOSThread() // a tracer is a thread
	defer runtime.UnlockOSThread()
	pid := p.pid
	if err := unix.PtraceSeize(pid); err != nil {
		return nil, fmt.Errorf("ptrace init %d: %w (a Yama ptrace_scope of 3 forbids it)", pid, err)
	}
	var sig uintptr // a signal the stop took from the init, given back
	defer func() { unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_DETACH, uintptr(pid), 0, sig, 0, 0) }()
	if !p.alive() {
		return nil, fmt.Errorf("init %d exited", pid)
	}
	if err := unix.PtraceInterrupt(pid); err != nil {
		return nil, fmt.Errorf("ptrace init %d: %w", pid, err)
	}
	// The stop comes at once; never wait for it without bound.
	stopBy := time.Now().Add(2 * time.Second)
	for d := 20 * time.Microsecond; ; d = min(2*d, 10*time.Millisecond) {
		var ws unix.WaitStatus
		wpid, err := unix.Wait4(pid, &ws, unix.WALL|unix.WNOHANG, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("wait for init %d: %w", pid, err)
		}
		if wpid == 0 {
			if time.Now().After(stopBy) {
				return nil, fmt.Errorf("init %d did not stop for ptrace", pid)
			}
			time.Sleep(d)
			continue
		}
		if !ws.Stopped() {
			return nil, fmt.Errorf("init %d exited", pid)
		}
		if int(ws)>>16 != unix.PTRACE_EVENT_STOP {
			// A signal-delivery stop: the signal is given back on detach.
			sig = uintptr(ws.StopSignal())
		}
		break
	}
	var filters [][]byte
	for i := uintptr(0); ; i++ {
		n, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_SECCOMP_GET_FILTER, uintptr(pid), i, 0, 0, 0)
		if e == unix.ENOENT {
			break
		}
		if e == unix.EINVAL && i == 0 {
			return nil, errors.New("this kernel cannot read a process's seccomp filters (PTRACE_SECCOMP_GET_FILTER needs CONFIG_CHECKPOINT_RESTORE)")
		}
		if e != 0 {
			return nil, fmt.Errorf("read the init's seccomp filter: %w", e)
		}
		f := make([]byte, n*8) // struct sock_filter
		if _, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_SECCOMP_GET_FILTER, uintptr(pid), i, uintptr(unsafe.Pointer(&f[0])), 0, 0); e != 0 {
			return nil, fmt.Errorf("read the init's seccomp filter: %w", e)
		}
		filters = append(filters, f)
	}
	if len(filters) == 0 {
		return nil, fmt.Errorf("the init (pid %d) runs no seccomp filter", pid)
	}
	slices.Reverse(filters) // index 0 is the newest
	return filters, nil
}

// seccompFilterCount reads Seccomp_filters from /proc/<pid>/status.
func seccompFilterCount(pid int) (int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Seccomp_filters:"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	// Kernels before 5.9 do not say; the filter is there or ptrace finds
	// none.
	return 1, nil
}

// trustedShell is the platform's own shell for `exec --sh`: a static
// binary from the host (bash-static), loaded once into a sealed memfd that
// warren-enter runs by descriptor. Nothing in a sandbox can change it: it
// is not in the sandbox's filesystem, the seal forbids writes, and, being
// static, it loads no library from the sandbox.
type trustedShell struct {
	file *os.File
	err  error // why there is none
}

// loadTrustedShell copies path into a sealed memfd. The binary must be
// statically linked: a dynamic one would take its loader and libc from the
// sandbox.
func loadTrustedShell(path string) trustedShell {
	fail := func(err error) trustedShell {
		return trustedShell{err: fmt.Errorf("trusted shell %s: %w (install bash-static: scripts/setup)", path, err)}
	}
	ef, err := elf.Open(path)
	if err != nil {
		return fail(err)
	}
	for _, p := range ef.Progs {
		if p.Type == elf.PT_INTERP {
			ef.Close()
			return fail(errors.New("not statically linked"))
		}
	}
	ef.Close()
	b, err := os.ReadFile(path)
	if err != nil {
		return fail(err)
	}
	f, err := memfdOf("warren-sh", b, unix.MFD_ALLOW_SEALING|unix.MFD_EXEC)
	if err != nil {
		return fail(err)
	}
	seals := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, seals); err != nil {
		f.Close()
		return fail(err)
	}
	return trustedShell{file: f}
}

// cgroupProcsFiles opens the cgroup.procs files an exec's process joins:
// the exec's own cgroup sub in the hierarchy that has it (execCgroup), and
// the sandbox's cgroup in every other v1 hierarchy, so that its memory,
// pids and CPU limits hold for the exec as for the init.
func (c *Container) cgroupProcsFiles(s *sandbox, sub string) ([]*os.File, error) {
	paths := []string{s.cg.path(sub)}
	for _, p := range s.cgPath {
		if p != s.cg.base.Path && !slices.Contains(paths, p) {
			paths = append(paths, p)
		}
	}
	var files []*os.File
	for _, p := range paths {
		f, err := os.OpenFile(filepath.Join(p, "cgroup.procs"), os.O_WRONLY, 0)
		if err != nil {
			closeAll(files)
			return nil, err
		}
		files = append(files, f)
	}
	return files, nil
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// capMasks returns the effective, permitted and bounding sets for uid.
func capMasks(uid uint32) (eff, perm, bound uint64, err error) {
	caps := guard.Capabilities(uid)
	if eff, err = guard.CapMask(caps.Effective); err != nil {
		return
	}
	if perm, err = guard.CapMask(caps.Permitted); err != nil {
		return
	}
	bound, err = guard.CapMask(caps.Bounding)
	return
}
