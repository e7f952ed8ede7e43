package main

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/guest/boot"
	"github.com/warrenhq/warren/guest/proto"
	"github.com/warrenhq/warren/internal/errdefs"
)

// startSandbox limits the sandbox's cgroup and starts its reaper in new
// namespaces. Starting a started sandbox is no error.
func (a *agent) startSandbox(req proto.StartRequest) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.started {
		return nil
	}
	if req.Hostname == "" || len(req.Hostname) > 64 {
		return errdefs.Invalid("start: hostname %q", req.Hostname)
	}
	if req.Memory > 0 {
		if err := os.WriteFile(filepath.Join(sandboxCg, "memory.max"), []byte(strconv.FormatInt(req.Memory, 10)), 0); err != nil {
			return fmt.Errorf("memory limit: %w", err)
		}
		os.WriteFile(filepath.Join(sandboxCg, "memory.swap.max"), []byte("0"), 0)
	}
	if req.PIDs > 0 {
		if err := os.WriteFile(filepath.Join(sandboxCg, "pids.max"), []byte(strconv.FormatInt(req.PIDs, 10)), 0); err != nil {
			return fmt.Errorf("pid limit: %w", err)
		}
	}
	if len(req.DNS) > 0 {
		writeResolvConf(req.DNS)
	}
	// The reaper's namespaces are made by clone; its mounts by itself.
	// It says it is ready (its root is the sandbox's) on the pipe.
	readyR, readyW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer readyR.Close()
	null := devNull()
	defer unix.Close(int(null))
	pid, err := syscall.ForkExec(selfExe, []string{roleReaper, req.Hostname}, &syscall.ProcAttr{
		Env:   []string{},
		Files: []uintptr{null, null, 2, readyW.Fd()},
		Sys: &syscall.SysProcAttr{
			Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC,
			Setsid:     true,
		},
	})
	readyW.Close()
	if err != nil {
		return fmt.Errorf("start the sandbox's init: %w", err)
	}
	exited := a.reaps.watch(pid)
	readyR.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := readyR.Read(make([]byte, 1)); err != nil {
		unix.Kill(pid, unix.SIGKILL)
		<-exited
		return fmt.Errorf("the sandbox's init did not start (see the console)")
	}
	if a.ns, err = openNamespaces(pid); err != nil {
		unix.Kill(pid, unix.SIGKILL)
		return err
	}
	a.reaper, a.started, a.start = pid, true, req
	return nil
}

func devNull() uintptr {
	fd, _ := unix.Open("/dev/null", unix.O_RDWR|unix.O_CLOEXEC, 0)
	return uintptr(fd)
}

// writeResolvConf points the sandbox at the node's DNS proxy.
func writeResolvConf(servers []string) {
	var b strings.Builder
	for _, s := range servers {
		fmt.Fprintf(&b, "nameserver %s\n", s)
	}
	os.MkdirAll(filepath.Join(rootDir, "etc"), 0o755)
	os.WriteFile(filepath.Join(rootDir, "etc/resolv.conf"), []byte(b.String()), 0o644)
}

// signalAll sends sig to every process of the sandbox.
func signalAll(sig unix.Signal) {
	filepath.WalkDir(sandboxCg, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		b, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		for _, f := range strings.Fields(string(b)) {
			if pid, _ := strconv.Atoi(f); pid > 0 {
				unix.Kill(pid, sig)
			}
		}
		return nil
	})
}

// reaper is pid 1 of the sandbox's pid namespace: it mounts the
// sandbox's /proc, /sys and /dev, makes the overlay its root, and then
// reaps orphans forever, ignoring every signal it can.
func reaper() {
	// Ignored, not handled: a handled signal would reach pid 1 of the
	// namespace from inside it, an ignored one does nothing.
	signal.Ignore(syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2,
		syscall.SIGPIPE, syscall.SIGALRM, syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU, syscall.SIGWINCH, syscall.SIGURG)
	unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	os.WriteFile("/proc/self/oom_score_adj", []byte("-1000"), 0)
	if err := enterRoot(os.Args[1]); err != nil {
		boot.Logf("sandbox init: %v", err)
		os.Exit(1)
	}
	ready := os.NewFile(3, "ready")
	ready.Write([]byte{1})
	ready.Close()
	for {
		var ws unix.WaitStatus
		if _, err := unix.Wait4(-1, &ws, 0, nil); err == unix.ECHILD {
			time.Sleep(time.Second)
		}
	}
}

// enterRoot builds the sandbox's view: its own /proc, a read-only /sys
// with /sys/firmware masked, a small /dev, then pivots into the overlay.
func enterRoot(hostname string) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return err
	}
	r := rootDir
	type m struct {
		src, dst, typ string
		flags         uintptr
		opts          string
	}
	for _, x := range []m{
		{"proc", r + "/proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		{"sysfs", r + "/sys", "sysfs", unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		{"tmpfs", r + "/sys/firmware", "tmpfs", unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, "size=0"},
		{"tmpfs", r + "/dev", "tmpfs", unix.MS_NOSUID, "mode=0755,size=64k"},
	} {
		if err := boot.Mount(x.src, x.dst, x.typ, x.flags, x.opts); err != nil {
			return err
		}
	}
	for _, d := range []struct {
		name       string
		major, min uint32
	}{{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}} {
		p := r + "/dev/" + d.name
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(d.major, d.min))); err != nil {
			return fmt.Errorf("mknod %s: %w", p, err)
		}
		unix.Chmod(p, 0o666)
	}
	for name, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2", "ptmx": "pts/ptmx"} {
		os.Symlink(target, r+"/dev/"+name)
	}
	for _, x := range []m{
		{"devpts", r + "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"},
		{"shm", r + "/dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
		{"mqueue", r + "/dev/mqueue", "mqueue", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
	} {
		if err := boot.Mount(x.src, x.dst, x.typ, x.flags, x.opts); err != nil {
			return err
		}
	}
	if err := unix.Sethostname([]byte(hostname)); err != nil {
		return err
	}
	if err := unix.Chdir(r); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the old root: %w", err)
	}
	return unix.Chdir("/")
}

// reaps collects the exit statuses of the agent's children: the agent is
// the guest's pid 1, so it reaps every one of them in one loop, and
// whoever started a child waits for its status here.
type reaps struct {
	mu      sync.Mutex
	waiters map[int]chan unix.WaitStatus
	early   map[int]unix.WaitStatus // exited before anyone asked
}

func newReaps() *reaps {
	return &reaps{waiters: map[int]chan unix.WaitStatus{}, early: map[int]unix.WaitStatus{}}
}

// watch returns a channel that receives pid's exit status.
func (r *reaps) watch(pid int) <-chan unix.WaitStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	ch := make(chan unix.WaitStatus, 1)
	if ws, ok := r.early[pid]; ok {
		delete(r.early, pid)
		ch <- ws
		return ch
	}
	r.waiters[pid] = ch
	return ch
}

func (r *reaps) loop() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		r.mu.Lock()
		if ch, ok := r.waiters[pid]; ok {
			delete(r.waiters, pid)
			ch <- ws
		} else if len(r.early) < 4096 {
			r.early[pid] = ws
		}
		r.mu.Unlock()
	}
}

// namespaces are the sandbox's, which every exec joins.
type namespaces struct {
	pid, mnt, uts, ipc *os.File
}

func openNamespaces(pid int) (namespaces, error) {
	var ns namespaces
	for _, x := range []struct {
		f    **os.File
		name string
	}{{&ns.pid, "pid"}, {&ns.mnt, "mnt"}, {&ns.uts, "uts"}, {&ns.ipc, "ipc"}} {
		f, err := os.Open(fmt.Sprintf("/proc/%d/ns/%s", pid, x.name))
		if err != nil {
			return ns, err
		}
		*x.f = f
	}
	return ns, nil
}
