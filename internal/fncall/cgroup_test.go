package fncall

import (
	"errors"
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
