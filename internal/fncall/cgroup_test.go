package fncall

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	hostcg "github.com/warrenhq/warren/internal/cgroup"
	"github.com/warrenhq/warren/internal/errdefs"
)

// TestChooseMode: FnCall takes v1 where memory, cpuacct and pids have v1
// hierarchies, else v2 where the unified one offers memory and pids: a
// v2-only host is not refused.
func TestChooseMode(t *testing.T) {
	all := map[string]string{"memory": "/sys/fs/cgroup/memory", "cpuacct": "/sys/fs/cgroup/cpu,cpuacct",
		"cpu": "/sys/fs/cgroup/cpu,cpuacct", "pids": "/sys/fs/cgroup/pids"}
	yes := func(string) bool { return true }
	for _, tc := range []struct {
		name    string
		l       hostcg.Layout
		unified []string
		v2      bool
		err     error
	}{
		{"hybrid, all v1 (these machines)", hostcg.Layout{Mode: hostcg.Hybrid, Unified: "/sys/fs/cgroup/unified", V1: all}, []string{"hugetlb"}, false, nil},
		{"legacy", hostcg.Layout{Mode: hostcg.Legacy, V1: all}, nil, false, nil},
		{"unified", hostcg.Layout{Mode: hostcg.Unified, Unified: "/sys/fs/cgroup", V1: map[string]string{}},
			[]string{"cpuset", "cpu", "io", "memory", "hugetlb", "pids", "rdma", "misc"}, true, nil},
		{"hybrid, memory and pids on v2", hostcg.Layout{Mode: hostcg.Hybrid, Unified: "/sys/fs/cgroup/unified", V1: map[string]string{"cpuacct": "/x"}},
			[]string{"memory", "pids"}, true, nil},
		{"unified without memory", hostcg.Layout{Mode: hostcg.Unified, Unified: "/sys/fs/cgroup", V1: map[string]string{}},
			[]string{"cpu", "pids"}, false, errdefs.ErrUnavailable},
		{"v1 without pids, empty v2", hostcg.Layout{Mode: hostcg.Hybrid, Unified: "/u", V1: map[string]string{"memory": "/m", "cpuacct": "/c"}},
			nil, false, errdefs.ErrUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v2, err := chooseMode(&tc.l, tc.unified, yes)
			if v2 != tc.v2 || !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Errorf("got v2 %v, error %v; want %v, %v", v2, err, tc.v2, tc.err)
			}
		})
	}
}

// TestCgroupV2Files drives a v2 box cgroup over a directory of plain files
// shaped like the kernel's: the file names, the formats written (cpu.max,
// memory.max, swap 0) and the counters read (cpu.stat in µs, memory.peak,
// memory.events max and oom_kill, pids.events). The real kernel runs the
// same code in the cgroup v2 guest (scripts/test-cgroup-v2).
func TestCgroupV2Files(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"cpu.stat":        "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\nnr_periods 0\n",
		"memory.current":  "4096\n",
		"memory.max":      "max\n",
		"memory.peak":     "8192\n",
		"memory.events":   "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n",
		"memory.swap.max": "max\n",
		"pids.current":    "1\n",
		"pids.max":        "max\n",
		"pids.events":     "max 0\n",
		"cpu.max":         "max 100000\n",
		"cgroup.procs":    "",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	read := func(name string) string {
		b, _ := os.ReadFile(filepath.Join(dir, name))
		return strings.TrimRight(string(b), "\n")
	}
	cg, err := openCgroupV2(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.closeFiles()
	// Plain files are not truncated by a write at offset 0: prefixes.
	if !cg.peakResets || !strings.HasPrefix(read("memory.swap.max"), "0") {
		t.Errorf("peakResets %v, memory.swap.max %q; want true, 0", cg.peakResets, read("memory.swap.max"))
	}
	if len(cg.join(true)) != 1 {
		t.Errorf("join: %d cgroup.procs, want 1", len(cg.join(true)))
	}
	if err := cg.setCPUs(0.25); err != nil || !strings.HasPrefix(read("cpu.max"), "25000 100000") {
		t.Errorf("setCPUs: %v, cpu.max %q", err, read("cpu.max"))
	}
	if err := cg.setMemory(64 << 20); err != nil || !strings.HasPrefix(read("memory.max"), "67108864") {
		t.Errorf("setMemory: %v, memory.max %q", err, read("memory.max"))
	}
	if err := cg.setPids(17); err != nil || !strings.HasPrefix(read("pids.max"), "17") {
		t.Errorf("setPids: %v, pids.max %q", err, read("pids.max"))
	}
	before, err := cg.before()
	if err != nil || before.cpuNs != 1_500_000 || before.memory != 4096 {
		t.Errorf("before: %+v %v; want 1.5 ms of CPU, 4096 bytes", before, err)
	}
	os.WriteFile(filepath.Join(dir, "cpu.stat"), []byte("usage_usec 9500\nuser_usec 9000\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "memory.peak"), []byte("1048576\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "memory.events"), []byte("low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "pids.events"), []byte("max 3\n"), 0o644)
	after, err := cg.after()
	want := counters{cpuNs: 9_500_000, peak: 1 << 20, failcnt: 7, oomKill: 1, forkFails: 3}
	if err != nil || after != want {
		t.Errorf("after: %+v %v; want %+v", after, err, want)
	}

	// A kernel whose memory.peak does not reset (before 6.12): the run's
	// peak is the lifetime one if the run raised it, else the most
	// memory.current seen during the run.
	cg.peakResets = false
	os.WriteFile(filepath.Join(dir, "memory.current"), []byte("2000000\n"), 0o644)
	if _, err := cg.before(); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "memory.current"), []byte("3000000\n"), 0o644)
	cg.sample()
	os.WriteFile(filepath.Join(dir, "memory.current"), []byte("2500000\n"), 0o644)
	if after, err := cg.after(); err != nil || after.peak != 3000000 {
		t.Errorf("peak below the lifetime one: %d %v, want the sampled 3000000", after.peak, err)
	}
	cg.before()
	os.WriteFile(filepath.Join(dir, "memory.peak"), []byte("5000000\n"), 0o644)
	if after, err := cg.after(); err != nil || after.peak != 5000000 {
		t.Errorf("peak raising the lifetime one: %d %v, want 5000000", after.peak, err)
	}
	if cg.recyclable() {
		t.Error("a cgroup whose peak cannot reset is recycled")
	}

	uncapped, err := openCgroupV2(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	defer uncapped.closeFiles()
	if err := uncapped.setCPUs(0); err != nil {
		t.Errorf("uncapped setCPUs(0): %v", err)
	}
	if err := uncapped.setCPUs(1); err == nil {
		t.Error("uncapped setCPUs(1): no error")
	}
}
