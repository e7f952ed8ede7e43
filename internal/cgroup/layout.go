// Package cgroup is warren's one host package for control groups, v1 and
// v2 alike: where the hierarchies are mounted (legacy, hybrid or unified,
// detected at run time), control files opened once and read or written in
// one system call each (File), and whole trees frozen, thawed, killed and
// removed with bounded waits (Dir). The container backend (exec
// sub-cgroups, deletes) and FnCall (limits and accounting of its boxes)
// both use it; the start-up sweep of a node can use Paths and
// Dir.Destroy to remove what a dead agent left in every hierarchy.
package cgroup

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Mode is how a host lays out its cgroups.
type Mode int

const (
	// Legacy hosts have cgroup v1 hierarchies only.
	Legacy Mode = iota + 1
	// Hybrid hosts have v1 hierarchies and a cgroup2 mount beside them
	// (often /sys/fs/cgroup/unified, sometimes with no controller in it).
	Hybrid
	// Unified hosts have cgroup v2 only, at /sys/fs/cgroup.
	Unified
)

func (m Mode) String() string {
	switch m {
	case Legacy:
		return "legacy"
	case Hybrid:
		return "hybrid"
	case Unified:
		return "unified"
	}
	return "none"
}

// Layout says where a host's cgroup hierarchies are mounted.
type Layout struct {
	Mode Mode
	// Unified is the cgroup2 mount point; "" if there is none.
	Unified string
	// V1 maps each v1 controller (and named hierarchies such as
	// "name=systemd") to its mount point. Controllers that share a
	// hierarchy (cpu,cpuacct) map to the same mount point.
	V1 map[string]string
}

// Host is this host's layout, read from /proc/self/mountinfo once.
func Host() (*Layout, error) { return host() }

var host = sync.OnceValues(func() (*Layout, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("cgroup layout: %w", err)
	}
	defer f.Close()
	l, err := parseMountinfo(bufio.NewScanner(f))
	if err != nil {
		return nil, fmt.Errorf("cgroup layout: %w", err)
	}
	return l, nil
})

// parseMountinfo reads a mountinfo table (proc(5)). The first mount of a
// hierarchy wins: later ones are bind mounts of it.
func parseMountinfo(sc *bufio.Scanner) (*Layout, error) {
	l := &Layout{V1: map[string]string{}}
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if sep < 5 || len(fields) < sep+4 {
			continue
		}
		mnt, fstype, opts := unescape(fields[4]), fields[sep+1], fields[sep+3]
		switch fstype {
		case "cgroup2":
			if l.Unified == "" || mnt == "/sys/fs/cgroup" {
				l.Unified = mnt
			}
		case "cgroup":
			for _, o := range strings.Split(opts, ",") {
				switch o {
				case "rw", "ro", "clone_children", "noprefix", "xattr", "nsdelegate", "favordynmods":
					continue
				}
				if strings.HasPrefix(o, "release_agent=") {
					continue
				}
				if _, ok := l.V1[o]; !ok {
					l.V1[o] = mnt
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	switch {
	case len(l.V1) == 0 && l.Unified != "":
		l.Mode = Unified
	case len(l.V1) > 0 && l.Unified != "":
		l.Mode = Hybrid
	case len(l.V1) > 0:
		l.Mode = Legacy
	default:
		return nil, fmt.Errorf("no cgroup hierarchy is mounted")
	}
	return l, nil
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &v); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// V1Dir is path's directory in the v1 hierarchy of controller; false if
// the controller has no v1 hierarchy.
func (l *Layout) V1Dir(controller, path string) (string, bool) {
	mnt, ok := l.V1[controller]
	if !ok {
		return "", false
	}
	return filepath.Join(mnt, path), true
}

// UnifiedControllers lists the controllers the cgroup2 hierarchy offers
// (its root's cgroup.controllers): every one on a unified host, those not
// bound to v1 on a hybrid one.
func (l *Layout) UnifiedControllers() []string {
	if l.Unified == "" {
		return nil
	}
	b, err := os.ReadFile(filepath.Join(l.Unified, "cgroup.controllers"))
	if err != nil {
		return nil
	}
	return strings.Fields(string(b))
}

// Paths is path's directory in every mounted hierarchy (one per
// hierarchy, v1 ones first), whether it exists or not: what a sweep
// removes to leave nothing of path behind.
func (l *Layout) Paths(path string) []Dir {
	var dirs []Dir
	seen := map[string]bool{}
	keys := make([]string, 0, len(l.V1))
	for k := range l.V1 {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		mnt := l.V1[k]
		if seen[mnt] {
			continue
		}
		seen[mnt] = true
		dirs = append(dirs, Dir{Path: filepath.Join(mnt, path)})
	}
	if l.Unified != "" {
		dirs = append(dirs, Dir{Path: filepath.Join(l.Unified, path), V2: true})
	}
	return dirs
}

// IsUnifiedMount reports whether dir is on a cgroup2 file system.
func IsUnifiedMount(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}
