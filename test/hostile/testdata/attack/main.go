// attack is what a hostile agent would run inside a sandbox: each
// subcommand tries one thing against the kernel or the platform and
// prints one line, "NAME: ok" or "NAME: ERRNO" (EPERM, ENOSYS, ...), for
// test/hostile to check. It is built static and copied in.
package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: attack NAME [ARGS...]")
		os.Exit(2)
	}
	for _, name := range strings.Split(os.Args[1], ",") {
		fmt.Printf("%s: %s\n", name, run(name, os.Args[2:]))
	}
}

// ioctl requests (amd64).
const (
	ficlone      = 0x40049409 // _IOW(0x94, 9, int)
	ficlonerange = 0x4020940d // _IOW(0x94, 13, struct file_clone_range)
	fidedupe     = 0xc0189436 // _IOWR(0x94, 54, struct file_dedupe_range)
	btrfsSubvol  = 0x5000940e // _IOW(0x94, 14, struct btrfs_ioctl_vol_args)
	xfsSwapext   = 0xc0c0586d // _IOWR('X', 109, struct xfs_swapext)
	ext4MoveExt  = 0xc028660f // _IOWR('f', 15, struct move_extent)
	tiocsti      = 0x5412
)

func run(name string, args []string) string {
	switch name {
	case "ficlone", "ficlone-high", "ficlonerange", "fidedupe", "btrfs-subvol", "swapext", "moveext", "tiocsti":
		req := map[string]uintptr{"ficlone": ficlone, "ficlone-high": 0xdead000000000000 | ficlone,
			"ficlonerange": ficlonerange, "fidedupe": fidedupe, "btrfs-subvol": btrfsSubvol,
			"swapext": xfsSwapext, "moveext": ext4MoveExt, "tiocsti": tiocsti}[name]
		src, err := os.CreateTemp("", "src")
		if err != nil {
			return "setup " + err.Error()
		}
		defer os.Remove(src.Name())
		src.WriteString("data")
		dst, err := os.CreateTemp("", "dst")
		if err != nil {
			return "setup " + err.Error()
		}
		defer os.Remove(dst.Name())
		// A zeroed argument of the largest size any of these reads: the
		// kernel may reject it as malformed (EINVAL, EBADF), but only
		// after the filter let it through, which is what is checked.
		var arg [256]byte
		*(*int32)(unsafe.Pointer(&arg[0])) = int32(src.Fd())
		p := uintptr(unsafe.Pointer(&arg[0]))
		if name == "ficlone" || name == "ficlone-high" {
			p = src.Fd()
		}
		_, _, e := unix.Syscall(unix.SYS_IOCTL, dst.Fd(), req, p)
		return errno(e)
	case "ksm-madvise", "ksm-madvise-high", "madvise-dontneed":
		// Opting its own memory into KSM, to probe by write timing for
		// pages of other sandboxes (guard's deniedArgs); junk in the
		// upper half of the int argument changes nothing.
		m, err := unix.Mmap(-1, 0, 1<<16, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			return "setup " + err.Error()
		}
		defer unix.Munmap(m)
		advice := map[string]uintptr{"ksm-madvise": unix.MADV_MERGEABLE, "ksm-madvise-high": 0xdead000000000000 | unix.MADV_MERGEABLE,
			"madvise-dontneed": unix.MADV_DONTNEED}[name]
		_, _, e := unix.Syscall(unix.SYS_MADVISE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), advice)
		return errno(e)
	case "ksm-prctl": // PR_SET_MEMORY_MERGE: every page of the process
		_, _, e := unix.Syscall6(unix.SYS_PRCTL, 67, 1, 0, 0, 0, 0)
		return errno(e)
	case "unshare-user":
		return errno(unix.Unshare(unix.CLONE_NEWUSER))
	case "unshare-net":
		return errno(unix.Unshare(unix.CLONE_NEWNET))
	case "clone-user": // a child in a new user namespace, as unshare -U would make
		cmd := exec.Command("/proc/self/exe", "caps")
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWUSER}
		return errno(cmd.Run())
	case "bpf":
		var attr [128]byte // BPF_MAP_CREATE with a zeroed attr
		_, _, e := unix.Syscall(unix.SYS_BPF, 0, uintptr(unsafe.Pointer(&attr[0])), uintptr(len(attr)))
		return errno(e)
	case "perf":
		attr := unix.PerfEventAttr{Type: unix.PERF_TYPE_SOFTWARE, Config: unix.PERF_COUNT_SW_CPU_CLOCK}
		attr.Size = uint32(unsafe.Sizeof(attr))
		fd, err := unix.PerfEventOpen(&attr, 0, -1, -1, 0)
		if err == nil {
			unix.Close(fd)
		}
		return errno(err)
	case "keyctl":
		_, _, e := unix.Syscall(unix.SYS_ADD_KEY, uintptr(unsafe.Pointer(&[]byte("user\x00")[0])), uintptr(unsafe.Pointer(&[]byte("k\x00")[0])), 0)
		return errno(e)
	case "userfaultfd":
		fd, _, e := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC, 0, 0)
		if e == 0 {
			unix.Close(int(fd))
		}
		return errno(e)
	case "kexec":
		_, _, e := unix.Syscall6(unix.SYS_KEXEC_LOAD, 0, 0, 0, 0, 0, 0)
		return errno(e)
	case "module":
		_, _, e := unix.Syscall(unix.SYS_FINIT_MODULE, ^uintptr(0), 0, 0)
		return errno(e)
	case "mount":
		return errno(unix.Mount("none", "/tmp", "tmpfs", 0, ""))
	case "packet", "raw", "vsock", "netlink-audit":
		t := map[string][3]int{
			"packet":        {unix.AF_PACKET, unix.SOCK_RAW, 0x300},
			"raw":           {unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP},
			"vsock":         {unix.AF_VSOCK, unix.SOCK_STREAM, 0},
			"netlink-audit": {unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_AUDIT},
		}[name]
		fd, err := unix.Socket(t[0], t[1], t[2])
		if err == nil {
			unix.Close(fd)
		}
		return errno(err)
	case "vsock-high", "packet-high": // the family with junk in the register's upper half
		fam := map[string]uintptr{"vsock-high": unix.AF_VSOCK, "packet-high": unix.AF_PACKET}[name]
		fd, _, e := unix.RawSyscall(unix.SYS_SOCKET, 0xdead000000000000|fam, unix.SOCK_STREAM, 0)
		if e == 0 {
			unix.Close(int(fd))
		}
		return errno(e)
	case "tcgets": // an ordinary ioctl: must keep working
		var ws unix.Winsize
		_, _, e := unix.Syscall(unix.SYS_IOCTL, 0, unix.TIOCGWINSZ, uintptr(unsafe.Pointer(&ws)))
		return errno(e)
	case "inet", "unix": // ordinary sockets: must keep working
		fam := map[string]int{"inet": unix.AF_INET, "unix": unix.AF_UNIX}[name]
		fd, err := unix.Socket(fam, unix.SOCK_STREAM, 0)
		if err == nil {
			unix.Close(fd)
		}
		return errno(err)
	case "policy": // this process's scheduling policy (5: SCHED_IDLE)
		attr, err := unix.SchedGetAttr(0, 0)
		if err != nil {
			return errno(err)
		}
		return strconv.Itoa(int(attr.Policy))
	case "policies": // every process's policy here, "pid=policy ..."
		return perProcess("stat", func(b string) (string, bool) {
			// Fields after the command (in parentheses): the policy is
			// field 41, the 39th after it.
			f := strings.Fields(b[strings.LastIndexByte(b, ')')+1:])
			if len(f) > 38 {
				return f[38], true
			}
			return "", false
		})
	case "sched-normal", "sched-fifo", "sched-nice": // leave SCHED_IDLE, or get ahead
		attr := unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_NORMAL}
		switch name {
		case "sched-fifo":
			attr.Policy, attr.Priority = unix.SCHED_FIFO, 1
		case "sched-nice":
			attr.Nice = -5 // int32 in the struct: a nice below 0
		}
		return errno(unix.SchedSetAttr(0, &attr, 0))
	case "setpriority":
		return errno(unix.Setpriority(unix.PRIO_PROCESS, 0, -5))
	case "oom-protect", "oom-protect-init": // leave the front of a host-wide OOM's kill order
		pid := "self"
		if name == "oom-protect-init" {
			pid = "1"
		}
		return errno(os.WriteFile("/proc/"+pid+"/oom_score_adj", []byte("-1000"), 0))
	case "oom-adjs": // every process's oom_score_adj here, "pid=adj ..."
		return perProcess("oom_score_adj", func(b string) (string, bool) { return strings.TrimSpace(b), true })
	case "cpu-idle": // the sandbox's own cgroup out of the idle class
		var errs []string
		for _, f := range []string{"/sys/fs/cgroup/cpu/cpu.idle", "/sys/fs/cgroup/cpu,cpuacct/cpu.idle", "/sys/fs/cgroup/cpu.idle", "/sys/fs/cgroup/cpu/cpu.shares"} {
			if _, err := os.Stat(f); err != nil {
				continue
			}
			errs = append(errs, errno(os.WriteFile(f, []byte("0"), 0)))
		}
		if len(errs) == 0 {
			return "absent" // no cgroup file in sight (cgroup v1 hosts mount none in sandboxes)
		}
		return strings.Join(errs, ",")
	case "caps":
		// The capabilities in the effective and bounding sets, by name.
		b, err := os.ReadFile("/proc/self/status")
		if err != nil {
			return err.Error()
		}
		var out []string
		for _, l := range strings.Split(string(b), "\n") {
			k, v, _ := strings.Cut(l, ":")
			if k == "CapEff" || k == "CapBnd" || k == "CapPrm" {
				out = append(out, k+"="+strings.TrimSpace(v))
			}
		}
		return strings.Join(out, " ")
	case "ptrace":
		pid, _ := strconv.Atoi(args[0])
		err := unix.PtraceAttach(pid)
		if err == nil {
			unix.PtraceDetach(pid)
		}
		return errno(err)
	case "procmem", "procroot": // the sandbox's init, through /proc
		path := map[string]string{"procmem": "/proc/1/mem", "procroot": "/proc/1/root/"}[name]
		f, err := os.Open(path)
		if err == nil {
			f.Close()
		}
		return errno(err)
	case "kill":
		pid, _ := strconv.Atoi(args[0])
		return errno(unix.Kill(pid, 0))
	case "hello": // hello ADDR SNI: a TLS ClientHello naming SNI to ADDR
		c, err := net.DialTimeout("tcp", args[0], 2*time.Second)
		if err != nil {
			return errno(err)
		}
		defer c.Close()
		tc := tls.Client(c, &tls.Config{ServerName: args[1], InsecureSkipVerify: true})
		tc.SetDeadline(time.Now().Add(3 * time.Second))
		if err := tc.Handshake(); err != nil {
			return "handshake failed"
		}
		return "ok"
	case "exerace":
		return exeRace(args)
	case "connect":
		// connect ADDR...: how many of the addresses accepted a TCP
		// connection within a second each.
		n := 0
		for _, a := range args {
			c, err := net.DialTimeout("tcp", a, time.Second)
			if err == nil {
				n++
				c.Close()
			}
		}
		return strconv.Itoa(n) + " connected"
	}
	return "unknown attack"
}

func errno(err error) string {
	if err == nil {
		return "ok"
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		if e == 0 {
			return "ok"
		}
		return unix.ErrnoName(e)
	}
	return err.Error()
}

// exeRace watches the sandbox's /proc for new processes for args[0]
// seconds and goes after each as CVE-2019-5736 did runc: open its
// /proc/<pid>/exe for writing (the platform's launcher or its trusted
// shell would be host files), and ptrace it (a launcher half-way into
// the sandbox holds the host's privileges). A process of the sandbox's
// own is fair game (its binaries are the agent's); what counts is
// "platform": a process whose exe the agent may not even read (the
// launcher is non-dumpable) or that names the platform's shell. It
// prints "seen N, scans M, platform P, breaches B".
func exeRace(args []string) string {
	secs, _ := strconv.Atoi(args[0])
	me := os.Getpid()
	done := map[int]bool{}
	seen, scans, platform, breaches := 0, 0, 0, 0
	for end := time.Now().Add(time.Duration(secs) * time.Second); time.Now().Before(end); scans++ {
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == 1 || pid == me || done[pid] {
				continue
			}
			done[pid] = true
			seen++
			exe := fmt.Sprintf("/proc/%d/exe", pid)
			target, err := os.Readlink(exe)
			ours := errors.Is(err, unix.EACCES) || strings.Contains(target, "warren")
			if ours {
				platform++
			}
			if f, err := os.OpenFile(exe, os.O_WRONLY, 0); err == nil {
				f.Close()
				if ours {
					breaches++
				}
			}
			if err := unix.PtraceSeize(pid); err == nil {
				unix.PtraceDetach(pid)
				if ours {
					breaches++
				}
			}
		}
	}
	return fmt.Sprintf("seen %d, scans %d, platform %d, breaches %d", seen, scans, platform, breaches)
}

// perProcess reads file of every process in sight (/proc/PID/file) and
// returns "pid=value ..." for those value gives one.
func perProcess(file string, value func(string) (string, bool)) string {
	var out []string
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		if _, err := strconv.Atoi(d.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + d.Name() + "/" + file)
		if err != nil {
			continue
		}
		if v, ok := value(string(b)); ok {
			out = append(out, d.Name()+"="+v)
		}
	}
	return strings.Join(out, " ")
}
