package microvm

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"

	"github.com/warrenhq/warren/internal/cgroup"
	"github.com/warrenhq/warren/internal/qos"
)

// hostCgroup is a sandbox's QEMU's cgroup on the host: one directory per
// hierarchy on cgroup v1 (cpu, memory, pids), one on v2.
type hostCgroup struct {
	dirs []cgroup.Dir
}

// cgroupPaths are the cgroups sandbox id's QEMU has, of either QoS class
// (those that exist).
func (m *MicroVM) cgroupPaths(id string) []cgroup.Dir {
	var dirs []cgroup.Dir
	for _, bestEffort := range []bool{false, true} {
		for _, d := range m.cgroupPathsOf(id, bestEffort) {
			if d.Exists() {
				dirs = append(dirs, d)
			}
		}
	}
	return dirs
}

// cgroupPathsOf are the cgroups of sandbox id's QEMU: <CgroupParent>/<id>,
// or for a best-effort sandbox <CgroupParent>/best-effort/<id>, below the
// class's idle group (internal/qos).
func (m *MicroVM) cgroupPathsOf(id string, bestEffort bool) []cgroup.Dir {
	l, err := cgroup.Host()
	if err != nil {
		return nil
	}
	rel := filepath.Join(m.cfg.CgroupParent, id)
	if bestEffort {
		rel = filepath.Join(m.cfg.CgroupParent, qos.ClassGroup, id)
	}
	var dirs []cgroup.Dir
	for _, ctrl := range []string{"cpu", "memory", "pids"} {
		if d, ok := l.V1Dir(ctrl, rel); ok {
			dirs = append(dirs, cgroup.Dir{Path: d})
		}
	}
	if len(dirs) == 0 && l.Unified != "" {
		dirs = append(dirs, cgroup.Dir{Path: filepath.Join(l.Unified, rel), V2: true})
	}
	return dirs
}

// makeCgroup makes s's QEMU cgroup with its CPU and memory limits: the
// guest's CPU share, and its memory plus QEMU's own.
func (m *MicroVM) makeCgroup(s *sandbox) (hostCgroup, error) {
	r := s.spec.Resources
	mem := r.Memory
	if mem == 0 {
		mem = defaultMemory
	}
	limit := mem + guestOverhead + qemuOverhead
	cg := hostCgroup{dirs: m.cgroupPathsOf(s.spec.ID, s.spec.BestEffort)}
	for _, d := range cg.dirs {
		if d.V2 {
			// Unified: the controllers must be enabled down to the
			// parent (which this makes).
			if l, err := cgroup.Host(); err == nil {
				rel, _ := filepath.Rel(l.Unified, filepath.Dir(d.Path))
				cgroup.EnableControllers(l.Unified, rel, "cpu", "memory", "pids")
			}
		}
		if err := os.MkdirAll(d.Path, 0o755); err != nil {
			return cg, fmt.Errorf("cgroup: %w", err)
		}
		set := func(name, v string) error {
			if _, err := os.Stat(filepath.Join(d.Path, name)); err != nil {
				return nil // not this hierarchy's
			}
			if err := os.WriteFile(filepath.Join(d.Path, name), []byte(v), 0); err != nil {
				return fmt.Errorf("cgroup %s: %w", name, err)
			}
			return nil
		}
		var err error
		if r.CPU > 0 {
			quota := int64(math.Ceil(r.CPU * 100000))
			if d.V2 {
				err = set("cpu.max", fmt.Sprintf("%d 100000", quota))
			} else if err = set("cpu.cfs_period_us", "100000"); err == nil {
				err = set("cpu.cfs_quota_us", strconv.FormatInt(quota, 10))
			}
		}
		if err == nil && s.spec.BestEffort && (d.V2 || exists(filepath.Join(d.Path, "cpu.shares"))) {
			_, err = qos.SetGroupIdle(cgroup.Dir{Path: filepath.Dir(d.Path), V2: d.V2})
		}
		if err == nil {
			if d.V2 {
				err = set("memory.max", strconv.FormatInt(limit, 10))
			} else {
				err = set("memory.limit_in_bytes", strconv.FormatInt(limit, 10))
			}
		}
		if err != nil {
			m.removeCgroup(s.spec.ID)
			return cg, err
		}
	}
	return cg, nil
}

func (cg hostCgroup) join(pid int) error {
	for _, d := range cg.dirs {
		if err := d.Join(pid); err != nil {
			return fmt.Errorf("cgroup: %w", err)
		}
	}
	return nil
}

// removeCgroup removes sandbox id's QEMU cgroup (empty once QEMU ended).
func (m *MicroVM) removeCgroup(id string) {
	for _, d := range m.cgroupPaths(id) {
		d.Destroy(context.Background())
	}
}

// defaultDisk is the writable disk's size when the spec sets no limit: a
// sparse file, so only what the guest writes takes host disk.
const defaultDisk = 16 << 30

// makeDisk makes the sandbox's writable disk: a sparse file of size bytes
// holding an empty ext4 filesystem (inodes of them at most, if set).
func makeDisk(ctx context.Context, path string, size, inodes int64) error {
	if size == 0 {
		size = defaultDisk
	}
	if size < 16<<20 {
		size = 16 << 20
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	f.Close()
	if err != nil {
		return err
	}
	args := []string{"-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0", "-O", "^resize_inode"}
	if inodes > 0 {
		args = append(args, "-N", strconv.FormatInt(inodes, 10))
	}
	out, err := exec.CommandContext(ctx, "mkfs.ext4", append(args, path)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mkfs.ext4: %v: %s", err, out)
	}
	return nil
}
