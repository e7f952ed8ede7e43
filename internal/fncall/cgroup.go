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

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/errdefs"
)

// cgroupRoot is where the v1 hierarchies are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// controllers every box has a cgroup of its own in, one v1 hierarchy each.
// Not cpu: a box gets its own cgroup there only when its runtime caps its
// CPU bandwidth (setCPUs); uncapped, its processes stay in the launcher's
// cpu cgroup, the daemon's. A cgroup per box in the cpu hierarchy (a
// scheduling entity and bandwidth state per box and level, enqueues
// through every level at each switch) cost 4-10% of the calls/s at
// saturation, A/B-measured, and one shared cgroup a few levels down about
// half of that. Where cpu and cpuacct are one hierarchy, the box's cpuacct
// cgroup is its cpu cgroup too.
var controllers = []string{"memory", "cpuacct", "pids"}

// cgroup is one box's cgroups: its memory, CPU and pid limits, and the
// counters a run's accounting reads. The files a call touches stay open
// (one pread or pwrite each, no path walk), and the limits last written are
// remembered so that only changes are written. cgroups are recycled between
// boxes (cgroupPool): nothing of a call is kept in one but counters, which
// every run reads as differences. cgroup v1 only so far: on a v2 host
// checkCgroups says so and FnCall is unavailable (the container backend,
// through runc, works on both).
type cgroup struct {
	dirs map[string]string // controller -> directory

	cpuUsage, memUsage, memMax, memFailcnt, memLimit, memswLimit, oomControl ctlFile
	pidsCurrent, pidsMax, pidsEvents                                         ctlFile
	cpuPeriod, cpuQuota                                                      ctlFile
	procs                                                                    []int // cgroup.procs of each controller, for the launcher
	cpuProcs                                                                 int   // the box's own cpu cgroup's, once made (and not the cpuacct one); -1 before
	path                                                                     string

	// last are the counters the previous run ended with: nothing between
	// two runs (a box's teardown, the next one's setup by pid 1 alone)
	// can move the OOM, failure or refused-fork counts, so the next run
	// starts from them without reading them again.
	last counters

	limit, pids int64   // last written memory limit and pids.max (0: unknown)
	cpus        float64 // last written CPU bandwidth
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

// newCgroup makes parent/name under every controller and opens its files.
func newCgroup(parent, name string) (*cgroup, error) {
	cg := &cgroup{dirs: map[string]string{}, path: filepath.Join(parent, name), cpuProcs: -1}
	cg.clearFiles()
	for _, c := range controllers {
		d := filepath.Join(cgroupRoot, c, parent, name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			cg.remove()
			return nil, fmt.Errorf("cgroup %s: %w", c, err)
		}
		cg.dirs[c] = d
	}
	var err error
	open := func(ctrl, name string, flag int) ctlFile {
		if err != nil {
			return -1
		}
		var f ctlFile
		f, err = openCtl(cg.dirs[ctrl], name, flag)
		return f
	}
	cg.cpuUsage = open("cpuacct", "cpuacct.usage", os.O_RDONLY)
	cg.memUsage = open("memory", "memory.usage_in_bytes", os.O_RDONLY)
	cg.memMax = open("memory", "memory.max_usage_in_bytes", os.O_RDWR)
	cg.memFailcnt = open("memory", "memory.failcnt", os.O_RDWR)
	cg.memLimit = open("memory", "memory.limit_in_bytes", os.O_RDWR)
	cg.oomControl = open("memory", "memory.oom_control", os.O_RDONLY)
	cg.pidsCurrent = open("pids", "pids.current", os.O_RDONLY)
	cg.pidsMax = open("pids", "pids.max", os.O_WRONLY)
	cg.pidsEvents = open("pids", "pids.events", os.O_RDONLY)
	for _, c := range controllers {
		if f := open(c, "cgroup.procs", os.O_WRONLY); f >= 0 {
			cg.procs = append(cg.procs, int(f))
		}
	}
	if err != nil {
		cg.remove()
		return nil, fmt.Errorf("cgroup files: %w", err)
	}
	// Where the kernel accounts swap (swapaccount=1); -1 elsewhere.
	cg.memswLimit, _ = openCtl(cg.dirs["memory"], "memory.memsw.limit_in_bytes", os.O_RDWR)
	return cg, nil
}

// openCtl opens a control file of the cgroup directory dir; -1 on error.
func openCtl(dir, name string, flag int) (ctlFile, error) {
	path := filepath.Join(dir, name)
	fd, err := unix.Open(path, flag|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return ctlFile(fd), nil
}

// ctlFile is an open cgroup control file: a plain descriptor (kernfs files
// need no poller), read and written at offset 0 in one system call.
type ctlFile int

func writeInt(f ctlFile, v int64) error {
	_, err := unix.Pwrite(int(f), []byte(strconv.FormatInt(v, 10)), 0)
	return err
}

func readInt(f ctlFile) (int64, error) {
	var b [32]byte
	n, err := unix.Pread(int(f), b[:], 0)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b[:n])), 10, 64)
}

// setCPUs caps the box at cores CPUs of bandwidth; 0 lifts the cap. The
// box's cpu cgroup is made on first use.
func (cg *cgroup) setCPUs(cores float64) error {
	if cores == cg.cpus {
		return nil
	}
	if cg.cpuQuota < 0 {
		if err := cg.openCPU(); err != nil {
			return err
		}
	}
	const period = 100_000
	quota := int64(-1)
	if cores > 0 {
		quota = int64(cores * period)
		if err := writeInt(cg.cpuPeriod, period); err != nil {
			return err
		}
	}
	if err := writeInt(cg.cpuQuota, quota); err != nil {
		return err
	}
	cg.cpus = cores
	return nil
}

// openCPU makes the box's cpu cgroup (where cpu has a hierarchy of its own)
// and opens its bandwidth files.
func (cg *cgroup) openCPU() (err error) {
	dir, err := cpuDir(cg.path)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil { // none half-open: the next setCPUs tries again
			for _, fd := range []*int{&cg.cpuProcs, (*int)(&cg.cpuPeriod), (*int)(&cg.cpuQuota)} {
				if *fd >= 0 {
					unix.Close(*fd)
				}
				*fd = -1
			}
			err = fmt.Errorf("cgroup cpu: %w", err)
		}
	}()
	if dir != cg.dirs["cpuacct"] { // else joined with cpuacct already
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		cg.dirs["cpu"] = dir
		procs, err := openCtl(dir, "cgroup.procs", os.O_WRONLY)
		if err != nil {
			return err
		}
		cg.cpuProcs = int(procs)
	}
	if cg.cpuPeriod, err = openCtl(dir, "cpu.cfs_period_us", os.O_WRONLY); err != nil {
		return err
	}
	cg.cpuQuota, err = openCtl(dir, "cpu.cfs_quota_us", os.O_WRONLY)
	return err
}

// cpuDir is path's directory in the cpu hierarchy: in cpuacct's where the
// two are one mount.
func cpuDir(path string) (string, error) {
	cpu, err := os.Stat(filepath.Join(cgroupRoot, "cpu"))
	if err != nil {
		return "", errdefs.Unavailable("a CPU cap needs the cgroup v1 cpu hierarchy at %s/cpu", cgroupRoot)
	}
	if acct, err := os.Stat(filepath.Join(cgroupRoot, "cpuacct")); err == nil && os.SameFile(cpu, acct) {
		return filepath.Join(cgroupRoot, "cpuacct", path), nil
	}
	return filepath.Join(cgroupRoot, "cpu", path), nil
}

// join is the cgroup.procs descriptors a box's pid 1 writes itself into:
// its own cpu cgroup's too when capped.
func (cg *cgroup) join(capped bool) []int {
	if capped && cg.cpuProcs >= 0 {
		return append(slices.Clip(cg.procs), cg.cpuProcs)
	}
	return cg.procs
}

// setMemory sets the limit, for swap too where the kernel accounts it, so a
// run never swaps its way past it. Limits only ever get set above current
// usage (the caller adds to it), which the kernel accepts.
func (cg *cgroup) setMemory(limit int64) error {
	if limit == cg.limit {
		return nil
	}
	old := cg.limit
	if old == 0 {
		var err error
		if old, err = readInt(cg.memLimit); err != nil {
			return err
		}
	}
	// memsw must stay >= the memory limit: raise it first, lower it last.
	if cg.memswLimit >= 0 && limit > old {
		if err := writeInt(cg.memswLimit, limit); err != nil {
			return err
		}
	}
	if err := writeInt(cg.memLimit, limit); err != nil {
		return err
	}
	if cg.memswLimit >= 0 && limit <= old {
		if err := writeInt(cg.memswLimit, limit); err != nil {
			return err
		}
	}
	cg.limit = limit
	return nil
}

// setPids sets pids.max.
func (cg *cgroup) setPids(n int64) error {
	if n == cg.pids {
		return nil
	}
	if err := writeInt(cg.pidsMax, n); err != nil {
		return err
	}
	cg.pids = n
	return nil
}

// counters are read before and after a run; the accounting is their
// differences, so a recycled cgroup's history does not matter.
type counters struct {
	cpuNs     int64 // cpuacct.usage
	memory    int64 // usage_in_bytes (before a run)
	peak      int64 // max_usage_in_bytes (after a run; reset before it)
	failcnt   int64
	oomKill   int64
	forkFails int64 // pids.events "max": forks refused at pids.max
}

// before reads what a run's accounting starts from.
func (cg *cgroup) before() (c counters, err error) {
	c = cg.last
	if c.cpuNs, err = readInt(cg.cpuUsage); err != nil {
		return c, err
	}
	c.memory, err = readInt(cg.memUsage)
	return c, err
}

// after reads the counters a run changed. (memory.failcnt alone does not
// tell an OOM kill: this kernel leaves it at 0 through one.)
func (cg *cgroup) after() (c counters, err error) {
	if c.cpuNs, err = readInt(cg.cpuUsage); err != nil {
		return c, err
	}
	if c.peak, err = readInt(cg.memMax); err != nil {
		return c, err
	}
	if c.failcnt, err = readInt(cg.memFailcnt); err != nil {
		return c, err
	}
	if c.oomKill, err = event(cg.oomControl, "oom_kill"); err != nil {
		return c, err
	}
	if c.forkFails, err = event(cg.pidsEvents, "max"); err != nil {
		return c, err
	}
	cg.last = c
	return c, nil
}

// cpuNs is the CPU time used by every process of the box so far.
func (cg *cgroup) cpuNs() (int64, error) { return readInt(cg.cpuUsage) }

// resetPeak starts max_usage_in_bytes afresh at the current usage.
func (cg *cgroup) resetPeak() error { return writeInt(cg.memMax, 0) }

// empty reports whether no process is left in the cgroup.
func (cg *cgroup) empty() bool {
	n, err := readInt(cg.pidsCurrent)
	return err == nil && n == 0
}

// event reads one "key value" line of a flat keyed file; a key the kernel
// does not have reads as 0 (old kernels lack oom_kill: failcnt still tells).
func event(f ctlFile, key string) (int64, error) {
	var b [512]byte
	n, err := unix.Pread(int(f), b[:], 0)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b[:n]), "\n") {
		if v, ok := strings.CutPrefix(line, key+" "); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, nil
}

// removeParent deletes a service's parent cgroups once its containers are
// gone; one still in use (or never made) stays, silently.
func removeParent(parent string) {
	for _, c := range append(controllers, "cpu") {
		_ = os.Remove(filepath.Join(cgroupRoot, c, parent))
	}
}

func (cg *cgroup) files() []*ctlFile {
	return []*ctlFile{&cg.cpuUsage, &cg.memUsage, &cg.memMax, &cg.memFailcnt, &cg.memLimit, &cg.memswLimit,
		&cg.oomControl, &cg.pidsCurrent, &cg.pidsMax, &cg.pidsEvents, &cg.cpuPeriod, &cg.cpuQuota}
}

// clearFiles marks every file not open.
func (cg *cgroup) clearFiles() {
	for _, f := range cg.files() {
		*f = -1
	}
}

func (cg *cgroup) closeFiles() {
	for _, f := range cg.files() {
		if *f >= 0 {
			unix.Close(int(*f))
		}
	}
	cg.clearFiles()
	for _, fd := range append(cg.procs, cg.cpuProcs) {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	cg.procs, cg.cpuProcs = nil, -1
}

// remove deletes the cgroups, waiting briefly for exiting processes to
// leave them (a dying pid namespace empties asynchronously).
func (cg *cgroup) remove() error {
	cg.closeFiles()
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

// cgroupPool recycles the cgroups of destroyed boxes: making and removing
// the four directories of a box cost more than the rest of the agent's
// work for a call. A cgroup comes back only once empty.
type cgroupPool struct {
	parent string
	idle   int64 // a new cgroup's memory limit until its first run sets one
	list   freeList[*cgroup]
}

func newCgroupPool(parent string, max int, idle int64) *cgroupPool {
	return &cgroupPool{parent: parent, idle: idle, list: freeList[*cgroup]{max: max}}
}

// get returns a recycled cgroup or makes one. A recycled one keeps the
// memory limit of its last run (at most the usage then plus the largest
// limit a call may ask for) until the next run sets its own: pid 1's setup
// needs little, and lowering a limit may make the kernel reclaim.
func (p *cgroupPool) get() (*cgroup, error) {
	if cg, ok := p.list.pop(); ok {
		return cg, nil
	}
	cg, err := newCgroup(p.parent, "fn-"+randomHex(6))
	if err != nil {
		return nil, err
	}
	if err := cg.setMemory(p.idle); err != nil {
		cg.remove()
		return nil, err
	}
	return cg, nil
}

// put takes back a cgroup whose box is gone: kept if it is empty and there
// is room, else removed.
func (p *cgroupPool) put(cg *cgroup) error {
	if cg.empty() && p.list.push(cg) {
		return nil
	}
	return cg.remove()
}

// close removes every free cgroup; later puts remove theirs.
func (p *cgroupPool) close() {
	for _, cg := range p.list.close() {
		_ = cg.remove()
	}
}
