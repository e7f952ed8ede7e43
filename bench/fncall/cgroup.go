package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// cpuGroup is a cpuacct cgroup (v1, or v2's cpu.stat) this process moves
// itself into, so that every process a local peer starts is charged to
// it wherever it goes below: bwrap's pid 1 and program (which bwrap does
// not reap, so getrusage would miss them), runc's per-container cgroups
// (runc puts a container without cgroupsPath under its own cgroup), and
// podman's conmon and containers (--cgroup-parent). Peers run one at a
// time, so a cell's CPU is the peer's plus this driver's.
type cpuGroup struct {
	base    string // the hierarchy's mount, e.g. /sys/fs/cgroup/cpuacct
	dir     string // e.g. /sys/fs/cgroup/cpuacct/wbench-fncall-123
	rel     string // /wbench-fncall-123, as a --cgroup-parent
	v2      bool
	oldProc string // cgroup.procs to move back into
}

func newCPUGroup() (*cpuGroup, error) {
	name := fmt.Sprintf("wbench-fncall-%d", os.Getpid())
	g := &cpuGroup{rel: "/" + name}
	base, self, err := cpuacctMount()
	if err != nil {
		return nil, err
	}
	g.base, g.v2 = base, base == "/sys/fs/cgroup"
	g.dir = filepath.Join(base, name)
	g.oldProc = filepath.Join(base, self, "cgroup.procs")
	if err := os.Mkdir(g.dir, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(g.dir, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		os.Remove(g.dir)
		return nil, fmt.Errorf("move into %s: %w", g.dir, err)
	}
	return g, nil
}

// cpuacctMount finds where CPU accounting lives (cgroup v1's cpuacct
// hierarchy, else the v2 unified one) and this process's cgroup there.
func cpuacctMount() (base, self string, err error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", "", err
	}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(l, ":", 3)
		if len(f) != 3 {
			continue
		}
		for _, c := range strings.Split(f[1], ",") {
			if c == "cpuacct" {
				if _, err := os.Stat("/sys/fs/cgroup/" + f[1]); err == nil {
					return "/sys/fs/cgroup/" + f[1], f[2], nil
				}
				return "/sys/fs/cgroup/cpuacct", f[2], nil
			}
		}
	}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if strings.HasPrefix(l, "0::") {
			return "/sys/fs/cgroup", strings.TrimPrefix(l, "0::"), nil
		}
	}
	return "", "", fmt.Errorf("no cpuacct cgroup in /proc/self/cgroup")
}

// usage is the CPU charged to the group and everything below it so far.
func (g *cpuGroup) usage() time.Duration { return cgroupCPU(g.dir, g.v2) }

func cgroupCPU(dir string, v2 bool) time.Duration {
	if v2 {
		b, err := os.ReadFile(filepath.Join(dir, "cpu.stat"))
		if err != nil {
			return 0
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "usage_usec "); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return time.Duration(n) * time.Microsecond
			}
		}
		return 0
	}
	b, err := os.ReadFile(filepath.Join(dir, "cpuacct.usage"))
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return time.Duration(n)
}

// close moves this process back and removes the group and whatever
// runtimes left below it, in every hierarchy.
func (g *cpuGroup) close() {
	os.WriteFile(g.oldProc, []byte(strconv.Itoa(os.Getpid())), 0o644)
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*" + g.rel)
	dirs = append(dirs, "/sys/fs/cgroup"+g.rel)
	for _, top := range dirs {
		var all []string
		filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				all = append(all, p)
			}
			return nil
		})
		sort.Slice(all, func(i, j int) bool { return len(all[i]) > len(all[j]) })
		for _, d := range all {
			os.Remove(d) // rmdir; a cgroup's files go with it
		}
	}
}

// procCgroup is pid's cgroup in the hierarchy g accounts in, or "".
func (g *cpuGroup) procCgroup(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(l, ":", 3)
		if len(f) != 3 {
			continue
		}
		if g.v2 && f[0] == "0" {
			return f[2]
		}
		for _, c := range strings.Split(f[1], ",") {
			if !g.v2 && c == "cpuacct" {
				return f[2]
			}
		}
	}
	return ""
}
