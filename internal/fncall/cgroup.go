package fncall

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/warrenhq/warren/internal/errdefs"
)

// cgroupRoot is where the v1 hierarchies are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// controllers a box uses, one v1 hierarchy each (cpu and cpuacct may be
// one mount; the paths then coincide and that is fine).
var controllers = []string{"memory", "cpu", "cpuacct", "pids"}

// cgroup is one box's cgroups: its memory, CPU and pid limits, and the
// counters a run's accounting reads. cgroup v1 only so far: on a v2 host
// checkCgroups says so and FnCall is unavailable (the container backend,
// through runc, works on both).
type cgroup struct {
	dirs map[string]string // controller -> directory
}

// checkCgroups reports whether this host has the v1 hierarchies FnCall
// needs.
func checkCgroups() error {
	for _, c := range controllers {
		if _, err := os.Stat(filepath.Join(cgroupRoot, c, "cgroup.procs")); err != nil {
			return errdefs.Unavailable("fncall needs the cgroup v1 %s hierarchy at %s/%s (cgroup v2 is not supported yet)", c, cgroupRoot, c)
		}
	}
	return nil
}

// newCgroup makes parent/name under every controller.
func newCgroup(parent, name string) (*cgroup, error) {
	cg := &cgroup{dirs: map[string]string{}}
	for _, c := range controllers {
		d := filepath.Join(cgroupRoot, c, parent, name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			cg.remove()
			return nil, fmt.Errorf("cgroup %s: %w", c, err)
		}
		cg.dirs[c] = d
	}
	return cg, nil
}

func (cg *cgroup) file(ctrl, name string) string { return filepath.Join(cg.dirs[ctrl], name) }

func (cg *cgroup) write(ctrl, name string, v int64) error {
	return os.WriteFile(cg.file(ctrl, name), []byte(strconv.FormatInt(v, 10)), 0)
}

func (cg *cgroup) read(ctrl, name string) (int64, error) {
	b, err := os.ReadFile(cg.file(ctrl, name))
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// procsFiles are the cgroup.procs files a process writes itself into to
// join every controller's cgroup (one per distinct directory).
func (cg *cgroup) procsFiles() []string {
	var out []string
	for _, c := range controllers {
		f := cg.file(c, "cgroup.procs")
		if !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	return out
}

// setCPUs caps the box at cores CPUs of bandwidth.
func (cg *cgroup) setCPUs(cores float64) error {
	const period = 100_000
	if err := cg.write("cpu", "cpu.cfs_period_us", period); err != nil {
		return err
	}
	return cg.write("cpu", "cpu.cfs_quota_us", int64(cores*period))
}

// setMemory sets the limit, for swap too where the kernel accounts it, so a
// run never swaps its way past it. Limits only ever get set above current
// usage (the caller adds to it), which the kernel accepts.
func (cg *cgroup) setMemory(limit int64) error {
	// memsw must stay >= the memory limit: raise it first, lower it last.
	sw := cg.file("memory", "memory.memsw.limit_in_bytes")
	_, swErr := os.Stat(sw)
	old, _ := cg.read("memory", "memory.limit_in_bytes")
	if swErr == nil && limit > old {
		if err := cg.write("memory", "memory.memsw.limit_in_bytes", limit); err != nil {
			return err
		}
	}
	if err := cg.write("memory", "memory.limit_in_bytes", limit); err != nil {
		return err
	}
	if swErr == nil && limit <= old {
		return cg.write("memory", "memory.memsw.limit_in_bytes", limit)
	}
	return nil
}

// counters are read before and after a run.
type counters struct {
	cpuNs     int64 // cpuacct.usage
	memory    int64 // usage_in_bytes
	peak      int64 // max_usage_in_bytes
	failcnt   int64
	oomKill   int64
	forkFails int64 // pids.events "max": forks refused at pids.max
}

func (cg *cgroup) counters() (c counters, err error) {
	read := func(ctrl, name string, v *int64) {
		if err == nil {
			*v, err = cg.read(ctrl, name)
		}
	}
	read("cpuacct", "cpuacct.usage", &c.cpuNs)
	read("memory", "memory.usage_in_bytes", &c.memory)
	read("memory", "memory.max_usage_in_bytes", &c.peak)
	read("memory", "memory.failcnt", &c.failcnt)
	if err != nil {
		return c, err
	}
	if c.oomKill, err = cg.event("memory", "memory.oom_control", "oom_kill"); err != nil {
		return c, err
	}
	c.forkFails, err = cg.event("pids", "pids.events", "max")
	return c, err
}

// cpuNs is the CPU time used by every process of the box so far.
func (cg *cgroup) cpuNs() (int64, error) { return cg.read("cpuacct", "cpuacct.usage") }

// resetPeak starts max_usage_in_bytes afresh at the current usage.
func (cg *cgroup) resetPeak() error {
	if err := cg.write("memory", "memory.max_usage_in_bytes", 0); err != nil {
		return err
	}
	return cg.write("memory", "memory.failcnt", 0)
}

// event reads one "key value" line of a flat keyed file; a key the kernel
// does not have reads as 0 (old kernels lack oom_kill: failcnt still tells).
func (cg *cgroup) event(ctrl, file, key string) (int64, error) {
	b, err := os.ReadFile(cg.file(ctrl, file))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, key+" "); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, nil
}

// removeParent deletes a service's parent cgroups once its containers are
// gone; one still in use (or never made) stays, silently.
func removeParent(parent string) {
	for _, c := range controllers {
		_ = os.Remove(filepath.Join(cgroupRoot, c, parent))
	}
}

// remove deletes the cgroups, waiting briefly for exiting processes to
// leave them (a dying pid namespace empties asynchronously).
func (cg *cgroup) remove() error {
	var errs []error
	for c, d := range cg.dirs {
		var err error
		for i := 0; i < 200; i++ {
			if err = os.Remove(d); err == nil || errors.Is(err, os.ErrNotExist) {
				err = nil
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", c, err))
		}
	}
	return errors.Join(errs...)
}
