// Command init is pid 1 of a warren QEMU guest: a static binary that
// guest/initramfs installs as /init. It loads the kernel modules the
// initramfs carries, mounts the root disk (read-only, optionally under a
// tmpfs overlay so the guest can write), switches into it, mounts what a
// container host expects (cgroup2 on /sys/fs/cgroup, /tmp, /run, /dev/pts,
// /dev/shm) and the host's 9p shares, runs one program, reaps every
// orphan meanwhile, reports the program's exit status and powers off.
//
// It is configured by the kernel command line only:
//
//	warren.root=DEV          root block device (default /dev/vda)
//	warren.rootfstype=T      its filesystem (default erofs)
//	warren.overlay=1         a tmpfs overlay over the root, so it is writable
//	warren.share=TAG:DIR[:ro]  mount the virtio-9p share TAG on DIR (repeatable)
//	warren.exec=PATH         the program to run (default /bin/sh)
//	warren.status=PATH       write its exit status there (e.g. on a share)
//	warren.hostname=NAME     (default warren-guest)
//
// The status is also printed on the console as "warren-guest: exit status
// N" (internal/qemu's Console finds it); 125 means the guest failed before
// or while starting the program. Nothing else is read or trusted: no
// network, no agent.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/guest/boot"
)

// ExitMarker prefixes the status line on the console.
const ExitMarker = "warren-guest: exit status "

type config struct {
	root, rootType, exec, status, hostname string
	overlay                                bool
	shares                                 []share
}

type share struct {
	tag, dir string
	ro       bool
}

func main() {
	start := time.Now()
	code := 125
	if err := setup(); err != nil {
		logf("error: %v", err)
	} else {
		code = runAndReap()
	}
	logf("ran for %s", time.Since(start).Round(time.Millisecond))
	finish(code)
}

var cfg config

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "warren-guest: "+format+"\n", args...)
}

func setup() error {
	if err := boot.Early(); err != nil {
		return err
	}
	b, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return err
	}
	if cfg, err = parse(string(b)); err != nil {
		return err
	}
	n, err := boot.LoadModules()
	if err != nil {
		return err
	}
	logf("loaded %d modules", n)
	if err := mountRoot(); err != nil {
		return err
	}
	if err := boot.SwitchRoot("/newroot"); err != nil {
		return err
	}
	return setupRoot()
}

func parse(cmdline string) (config, error) {
	c := config{root: "/dev/vda", rootType: "erofs", exec: "/bin/sh", hostname: "warren-guest"}
	for _, w := range strings.Fields(cmdline) {
		k, v, _ := strings.Cut(w, "=")
		switch k {
		case "warren.root":
			c.root = v
		case "warren.rootfstype":
			c.rootType = v
		case "warren.overlay":
			c.overlay = v == "1"
		case "warren.exec":
			c.exec = v
		case "warren.status":
			c.status = v
		case "warren.hostname":
			c.hostname = v
		case "warren.share":
			f := strings.Split(v, ":")
			if len(f) < 2 || len(f) > 3 || f[0] == "" || !filepath.IsAbs(f[1]) || len(f) == 3 && f[2] != "ro" {
				return c, fmt.Errorf("bad warren.share=%s (want TAG:/DIR[:ro])", v)
			}
			c.shares = append(c.shares, share{tag: f[0], dir: f[1], ro: len(f) == 3})
		}
	}
	return c, nil
}

func mountRoot() error {
	// The disk appears once its driver has probed it.
	if err := boot.WaitFor("root device "+cfg.root, 30*time.Second, func() bool { _, err := os.Stat(cfg.root); return err == nil }); err != nil {
		return err
	}
	if !cfg.overlay {
		return mount(cfg.root, "/newroot", cfg.rootType, unix.MS_RDONLY, "")
	}
	for _, d := range []string{"/lower", "/rw"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := mount(cfg.root, "/lower", cfg.rootType, unix.MS_RDONLY, ""); err != nil {
		return err
	}
	if err := mount("tmpfs", "/rw", "tmpfs", 0, "mode=0755"); err != nil {
		return err
	}
	for _, d := range []string{"/rw/upper", "/rw/work"} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	return mount("overlay", "/newroot", "overlay", 0, "lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work")
}

func setupRoot() error {
	for _, m := range []struct {
		src, dst, typ string
		flags         uintptr
		opts          string
	}{
		{"cgroup2", "/sys/fs/cgroup", "cgroup2", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		// AppArmor's interface (and /sys/kernel/security/lsm), as a
		// host's init mounts it.
		{"securityfs", "/sys/kernel/security", "securityfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "ptmxmode=0666,mode=0620,gid=5"},
		{"shm", "/dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
		{"mqueue", "/dev/mqueue", "mqueue", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		{"tmpfs", "/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755"},
		{"tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
	} {
		if err := mount(m.src, m.dst, m.typ, m.flags, m.opts); err != nil {
			return err
		}
	}
	for _, s := range cfg.shares {
		opts := "trans=virtio,version=9p2000.L,msize=512000"
		var flags uintptr
		if s.ro {
			flags, opts = unix.MS_RDONLY, opts+",cache=loose"
		}
		if err := mount(s.tag, s.dir, "9p", flags, opts); err != nil {
			return fmt.Errorf("share %s: %w", s.tag, err)
		}
	}
	if err := unix.Sethostname([]byte(cfg.hostname)); err != nil {
		return err
	}
	return boot.LoUp()
}

func mount(src, dst, typ string, flags uintptr, opts string) error {
	return boot.Mount(src, dst, typ, flags, opts)
}

// runAndReap runs the program and reaps every process reparented to pid 1
// until the program itself has exited; it returns the program's status
// (128+n for a signal, as a shell reports it).
func runAndReap() int {
	if up, err := os.ReadFile("/proc/uptime"); err == nil {
		logf("root ready at %ss uptime; running %s", strings.Fields(string(up))[0], cfg.exec)
	}
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "TERM=dumb", "LANG=C.UTF-8"}
	pid, err := syscall.ForkExec(cfg.exec, []string{cfg.exec}, &syscall.ProcAttr{
		Dir: "/", Env: env, Files: []uintptr{0, 1, 2},
		Sys: &syscall.SysProcAttr{Setsid: true},
	})
	if err != nil {
		logf("error: start %s: %v", cfg.exec, err)
		return 125
	}
	for {
		var ws unix.WaitStatus
		got, err := unix.Wait4(-1, &ws, 0, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			logf("error: wait: %v", err)
			return 125
		}
		if got != pid {
			continue
		}
		if ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ws.ExitStatus()
	}
}

// finish reports code and powers the machine off.
func finish(code int) {
	if cfg.status != "" {
		if err := writeSync(cfg.status, strconv.Itoa(code)+"\n"); err != nil {
			logf("error: status file: %v", err)
		}
	}
	unix.Sync()
	fmt.Fprintf(os.Stderr, "%s%d\n", ExitMarker, code)
	boot.PowerOff()
}

func writeSync(path, s string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(s); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
