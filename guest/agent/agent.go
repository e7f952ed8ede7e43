package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/guest/boot"
	"github.com/warrenhq/warren/guest/proto"
)

// Paths in the guest's initial mount namespace.
const (
	layersDir  = "/layers" // /layers/N: layer N, read-only
	rwDir      = "/rw"     // the writable disk: upper/ and work/
	cgroupDir  = "/sys/fs/cgroup"
	fwCfgDir   = "/sys/firmware/qemu_fw_cfg/by_name"
	portsClass = "/sys/class/virtio-ports"
)

// Paths that differ in a vm (vmMain), where the agent is a service of a
// whole machine and the sandbox is that machine.
var (
	rootDir   = "/sandbox"               // the sandbox's root: the overlay
	sandboxCg = "/sys/fs/cgroup/sandbox" // the cgroup execs run under
	shellPath = "/warren/sh"             // the platform's shell (ExecRequest.Shell)
	selfExe   = "/init"                  // this binary, run as the launcher and the reaper
)

// agent is the guest agent's state.
type agent struct {
	cfg    proto.Config
	booted time.Time // when the kernel started (uptime zero)
	ready  time.Duration

	mu      sync.Mutex
	started bool
	start   proto.StartRequest
	reaper  int        // pid of the sandbox's init (in our pid namespace)
	ns      namespaces // the reaper's
	frozen  bool
	reaps   *reaps
	vm      bool // a service of a whole machine (vmMain), not its pid 1
}

func agentMain() {
	a := &agent{reaps: newReaps()}
	if err := a.boot(); err != nil {
		boot.Logf("error: %v", err)
		boot.PowerOff()
	}
	go a.reaps.loop()
	go watchMemory()
	a.serve() // never returns
}

func (a *agent) boot() error {
	if err := boot.Early(); err != nil {
		return err
	}
	if _, err := boot.LoadModules(); err != nil {
		return err
	}
	// Off the initramfs, so that the sandbox's namespace can pivot_root
	// away from the guest's root (and never chroot, which root escapes).
	if err := boot.LeaveRootfs("init", "warren"); err != nil {
		return err
	}
	a.booted = time.Now().Add(-uptime())
	unix.Setsid()
	os.WriteFile("/proc/self/oom_score_adj", []byte("-1000"), 0)
	raw, err := a.readConfig()
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, &a.cfg); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if a.cfg.Secret == "" || a.cfg.Upper == "" {
		return fmt.Errorf("config: no secret or no writable disk")
	}
	if err := a.mountDisks(); err != nil {
		return err
	}
	if err := boot.Mount("cgroup2", cgroupDir, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(cgroupDir, "cgroup.subtree_control"), []byte("+memory +pids +cpu"), 0); err != nil {
		return fmt.Errorf("cgroup controllers: %w", err)
	}
	if err := os.Mkdir(sandboxCg, 0o755); err != nil && !os.IsExist(err) {
		return err
	}
	if err := boot.LoUp(); err != nil {
		return err
	}
	a.ready = uptime()
	return nil
}

func uptime() time.Duration {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts)
	return time.Duration(ts.Nano())
}

// readConfig reads the host's Config from fw_cfg, once the driver shows it.
func (a *agent) readConfig() ([]byte, error) {
	p := filepath.Join(fwCfgDir, proto.ConfigName, "raw")
	if err := boot.WaitFor("fw_cfg "+proto.ConfigName, 30*time.Second, func() bool { _, err := os.Stat(p); return err == nil }); err != nil {
		return nil, err
	}
	return os.ReadFile(p)
}

// blockBySerial returns /dev/vdX of the virtio disk with this serial.
func blockBySerial(serial string) (string, error) {
	var dev string
	err := boot.WaitFor("disk "+serial, 30*time.Second, func() bool {
		ents, _ := os.ReadDir("/sys/block")
		for _, e := range ents {
			b, err := os.ReadFile(filepath.Join("/sys/block", e.Name(), "serial"))
			if err == nil && strings.TrimSpace(string(b)) == serial {
				dev = "/dev/" + e.Name()
				return true
			}
		}
		return false
	})
	return dev, err
}

// pmemDevices returns /dev/pmemN in order, once n have appeared.
func pmemDevices(n int) ([]string, error) {
	var devs []string
	err := boot.WaitFor(fmt.Sprintf("%d pmem devices", n), 30*time.Second, func() bool {
		devs = devs[:0]
		for i := 0; i < n; i++ {
			p := fmt.Sprintf("/dev/pmem%d", i)
			if _, err := os.Stat(p); err != nil {
				return false
			}
			devs = append(devs, p)
		}
		return true
	})
	return devs, err
}

// mountDisks mounts the layers, the writable disk and the overlay.
func (a *agent) mountDisks() error {
	var devs []string
	if a.cfg.DAX {
		var err error
		if devs, err = pmemDevices(len(a.cfg.Layers)); err != nil {
			return err
		}
	} else {
		for _, s := range a.cfg.Layers {
			d, err := blockBySerial(s)
			if err != nil {
				return err
			}
			devs = append(devs, d)
		}
	}
	lowers := make([]string, len(devs))
	for i, d := range devs {
		dir := filepath.Join(layersDir, fmt.Sprint(i))
		opts := ""
		if a.cfg.DAX {
			opts = "dax=always"
		}
		if err := boot.Mount(d, dir, "erofs", unix.MS_RDONLY|unix.MS_NODEV, opts); err != nil {
			return err
		}
		lowers[len(devs)-1-i] = dir // overlayfs wants the top first
	}
	up, err := blockBySerial(a.cfg.Upper)
	if err != nil {
		return err
	}
	if err := boot.Mount(up, rwDir, "ext4", unix.MS_NODEV, ""); err != nil {
		return err
	}
	for _, d := range []string{"upper", "work"} {
		if err := os.MkdirAll(filepath.Join(rwDir, d), 0o755); err != nil {
			return err
		}
	}
	if len(lowers) == 0 {
		return fmt.Errorf("no layers")
	}
	// As containers mount theirs: an upper that stands alone as a layer.
	opts := "lowerdir=" + strings.Join(lowers, ":") + ",upperdir=" + rwDir + "/upper,workdir=" + rwDir + "/work,redirect_dir=off,metacopy=off"
	return boot.Mount("overlay", rootDir, "overlay", 0, opts)
}
