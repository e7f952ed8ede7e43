package benchup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/client"
	"github.com/warrenhq/warren/internal/cgroup"
	"github.com/warrenhq/warren/internal/daemon"
	"github.com/warrenhq/warren/internal/hostbin"
)

// Start runs daemon.Up(cfg) in this process as Run does, and also returns
// a wait that blocks until that Up has returned once ctx ended: what a
// benchmark calls before the next `warren up` of the same run, or before
// Reap.
func Start(ctx context.Context, cfg daemon.UpConfig, opts ...client.Option) (*client.Client, func() error, error) {
	if err := FindHelpers(); err != nil {
		return nil, nil, err
	}
	ready := make(chan string, 1)
	done := make(chan error, 1)
	cfg.Ready = func(addr string) { ready <- addr }
	go func() { done <- daemon.Up(ctx, cfg) }()
	var addr string
	select {
	case addr = <-ready:
	case err := <-done:
		return nil, nil, fmt.Errorf("warren up: %w", err)
	}
	wait := func() error {
		select {
		case err := <-done:
			if errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		case <-time.After(2 * time.Minute):
			return fmt.Errorf("warren up on %s did not stop within 2 minutes", cfg.DataDir)
		}
	}
	tok, err := os.ReadFile(filepath.Join(cfg.DataDir, daemon.AdminTokenFile))
	if err != nil {
		return nil, wait, err
	}
	return client.New("http://"+addr, strings.TrimSpace(string(tok)), opts...), wait, nil
}

// GuestAgent builds warren-guest (the microvm backend's guest agent)
// from ./guest/agent into dir and puts dir first on PATH, where the
// backend looks for it, so that the guests run this tree's agent and not
// an older build on PATH or in ./bin. It fails if a warren-guest beside
// this program's executable would still win (the backend looks there
// first): run the benchmark with `go run`, or from a directory of its own.
func GuestAgent(dir string) (string, error) {
	if err := FindHelpers(); err != nil {
		return "", err
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out := filepath.Join(dir, "warren-guest")
	cmd := exec.Command(goBin, "build", "-trimpath", "-ldflags=-s", "-o", out, "./guest/agent")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build warren-guest from ./guest/agent (run from the repository's root): %v: %s", err, b)
	}
	if err := os.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH")); err != nil {
		return "", err
	}
	if p := hostbin.Find("warren-guest"); p != out {
		return "", fmt.Errorf("the microvm backend would run %s, not this tree's warren-guest: move this program away from it", p)
	}
	return out, nil
}

// NodeID is the node id `warren up` on dataDir made for itself.
func NodeID(dataDir string) string {
	b, _ := os.ReadFile(filepath.Join(dataDir, "node-id"))
	return strings.TrimSpace(string(b))
}

// Reap removes what a `warren up` on dataDir may have left running once
// it has returned (or this program failed): processes whose command line
// names a path under dataDir (microVMs' QEMU, which runs detached from
// the agent), the node's cgroups (/warren/<node-id> in every hierarchy)
// and every mount below dataDir. It reports what it had to remove.
func Reap(dataDir string) []string {
	var did []string
	dataDir = filepath.Clean(dataDir)
	if dataDir == "." || dataDir == "/" {
		return nil
	}
	if n := killUnder(dataDir); n > 0 {
		did = append(did, fmt.Sprintf("killed %d process(es) under %s", n, dataDir))
	}
	if node := NodeID(dataDir); node != "" {
		if l, err := cgroup.Host(); err == nil {
			for _, d := range l.Paths("/warren/" + node) {
				if d.Exists() {
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					if err := d.Destroy(ctx); err != nil {
						did = append(did, fmt.Sprintf("cgroup %s: %v", d.Path, err))
					}
					cancel()
				}
			}
		}
	}
	if n := unmountUnder(dataDir); n > 0 {
		did = append(did, fmt.Sprintf("unmounted %d mount(s) under %s", n, dataDir))
	}
	return did
}

// QEMUUnder lists the pids of the QEMU processes whose command line names
// a path under dir; every QEMU process on the host if dir is "".
func QEMUUnder(dir string) []int {
	var pids []int
	for _, p := range procsUnder(dir) {
		if strings.HasPrefix(filepath.Base(p.argv0), "qemu-system") {
			pids = append(pids, p.pid)
		}
	}
	return pids
}

type proc struct {
	pid   int
	argv0 string
}

// procsUnder lists the processes (but this one) whose command line names
// a path under dir; every process if dir is "".
func procsUnder(dir string) []proc {
	if dir != "" {
		dir = filepath.Clean(dir) + "/"
	}
	ents, _ := os.ReadDir("/proc")
	var ps []proc
	self := os.Getpid()
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || len(b) == 0 {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		for _, a := range args {
			if strings.Contains(a, dir) {
				ps = append(ps, proc{pid: pid, argv0: args[0]})
				break
			}
		}
	}
	return ps
}

func killUnder(dir string) int {
	if dir == "" || dir == "/" {
		return 0
	}
	ps := procsUnder(dir)
	for _, p := range ps {
		unix.Kill(p.pid, unix.SIGKILL)
	}
	for deadline := time.Now().Add(10 * time.Second); len(procsUnder(dir)) > 0 && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}
	return len(ps)
}

func unmountUnder(dir string) int {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return 0
	}
	var mnts []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			mnts = append(mnts, f[4])
		}
	}
	sort.Slice(mnts, func(i, j int) bool { return len(mnts[i]) > len(mnts[j]) })
	n := 0
	for _, m := range mnts {
		if unix.Unmount(m, unix.MNT_DETACH) == nil {
			n++
		}
	}
	return n
}

// QEMUSizes reads a QEMU process's command line for the size of its
// guest's RAM (-m) and of TCG's translation cache (-accel tcg,tb-size=;
// 0 under KVM or when QEMU's default is kept), in bytes.
func QEMUSizes(pid int) (guestRAM, tcgCache int64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return 0, 0
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	for i := 0; i+1 < len(args); i++ {
		v := args[i+1]
		switch args[i] {
		case "-m":
			mem, _, _ := strings.Cut(v, ",")
			if n, err := strconv.ParseInt(strings.TrimSuffix(mem, "M"), 10, 64); err == nil {
				guestRAM = n << 20
			}
		case "-accel":
			for _, o := range strings.Split(v, ",") {
				if s, ok := strings.CutPrefix(o, "tb-size="); ok {
					if n, err := strconv.ParseInt(s, 10, 64); err == nil {
						tcgCache = n << 20
					}
				}
			}
		}
	}
	return guestRAM, tcgCache
}

// Charged is the memory charged to cgroup rel ("/warren/<node>": a node's
// sandboxes), memory.usage_in_bytes on v1 or memory.current on v2: its
// processes' memory and the page cache and kernel memory they caused.
func Charged(rel string) (int64, error) {
	l, err := cgroup.Host()
	if err != nil {
		return 0, err
	}
	path := filepath.Join(l.Unified, rel, "memory.current")
	if d, ok := l.V1Dir("memory", rel); ok && l.Mode != cgroup.Unified {
		path = filepath.Join(d, "memory.usage_in_bytes")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}
