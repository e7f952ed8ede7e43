package cgroup

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// CPUUsage is the CPU time the tasks of cgroup path (in this layout, and
// below it) have used so far: v1's cpuacct.usage, or v2's cpu.stat
// usage_usec. False if the layout has neither for path (no such cgroup,
// or no CPU accounting).
func (l *Layout) CPUUsage(path string) (time.Duration, bool) {
	if l.Mode != Unified {
		if d, ok := l.V1Dir("cpuacct", path); ok {
			b, err := os.ReadFile(filepath.Join(d, "cpuacct.usage"))
			if err != nil {
				return 0, false
			}
			ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			return time.Duration(ns), err == nil
		}
	}
	if l.Unified == "" {
		return 0, false
	}
	f, err := Open(filepath.Join(l.Unified, path), "cpu.stat", os.O_RDONLY)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	us, err := f.Keyed("usage_usec")
	return time.Duration(us) * time.Microsecond, err == nil
}

// Glob returns the paths (relative to the hierarchy's root, like path
// arguments) of the cgroups matching pattern (filepath.Match syntax)
// in the hierarchy that accounts CPU: v1's cpuacct, or the unified one.
func (l *Layout) Glob(pattern string) []string {
	root := l.Unified
	if l.Mode != Unified {
		if d, ok := l.V1["cpuacct"]; ok {
			root = d
		}
	}
	if root == "" {
		return nil
	}
	matches, _ := filepath.Glob(filepath.Join(root, pattern))
	var out []string
	for _, m := range matches {
		if rel, err := filepath.Rel(root, m); err == nil {
			out = append(out, "/"+rel)
		}
	}
	return out
}
