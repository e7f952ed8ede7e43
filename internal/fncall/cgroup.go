package fncall

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	hostcg "github.com/warrenhq/warren/internal/cgroup"
	"github.com/warrenhq/warren/internal/errdefs"
)

// ctlFile is an open cgroup control file (package cgroup's File).
type ctlFile = hostcg.File

// controllers every box has a cgroup of its own in, one v1 hierarchy each.
// Not cpu: a box gets its own cgroup there only when its runtime caps its
// CPU bandwidth (setCPUs); uncapped, its processes stay in the launcher's
// cpu cgroup, the daemon's. A cgroup per box in the cpu hierarchy (a
// scheduling entity and bandwidth state per box and level, enqueues
// through every level at each switch) cost 4-10% of the calls/s at
// saturation, A/B-measured, and one shared cgroup a few levels down about
// half of that. Where cpu and cpuacct are one hierarchy, the box's cpuacct
// cgroup is its cpu cgroup too.
//
// On cgroup v2 a box has one cgroup, with the memory and pids controllers
// and the core cpu.stat (CPU time needs no cpu controller there). The cpu
// controller, when a controller is enabled in a cgroup all its children
// get it: so uncapped boxes live in <parent>/shared, one cgroup that does
// not pass cpu on (they share its scheduling entity, or an ancestor's),
// and capped boxes directly in <parent>, which does.
var controllers = []string{"memory", "cpuacct", "pids"}

// v2Controllers are enabled down to a v2 box's parent; v2CPU too for
// capped ones.
var v2Controllers = []string{"memory", "pids"}

// sharedDir is the v2 parent of uncapped boxes, below the service's.
const sharedDir = "shared"

// cgroupMode is how FnCall uses this host's cgroups: v1 where memory,
// cpuacct and pids have v1 hierarchies (legacy and hybrid hosts, these
// machines), else v2 where the unified hierarchy offers memory and pids.
// An error says why neither works.
var cgroupMode = sync.OnceValues(func() (v2 bool, err error) {
	l, err := hostcg.Host()
	if err != nil {
		return false, errdefs.Unavailable("fncall: %v", err)
	}
	return chooseMode(l, l.UnifiedControllers(), func(dir string) bool { return exists(filepath.Join(dir, "cgroup.procs")) })
})

// chooseMode is cgroupMode's choice for layout l, whose unified hierarchy
// offers unified; usable says whether a v1 hierarchy's root is usable.
func chooseMode(l *hostcg.Layout, unified []string, usable func(dir string) bool) (v2 bool, err error) {
	var missing []string
	for _, c := range controllers {
		if d, ok := l.V1Dir(c, "/"); !ok || !usable(d) {
			missing = append(missing, c)
		}
	}
	if len(missing) == 0 {
		return false, nil
	}
	for _, c := range v2Controllers {
		if !slices.Contains(unified, c) {
			return false, errdefs.Unavailable("fncall needs the %v controllers in cgroup v1 hierarchies or %v in the unified (v2) hierarchy; this host (%s) has v1 without %v and v2 with %v",
				controllers, v2Controllers, l.Mode, missing, unified)
		}
	}
	return true, nil
}

// cgroupV1Dir is path's directory in the v1 hierarchy of controller.
func cgroupV1Dir(controller, path string) (string, error) {
	l, err := hostcg.Host()
	if err != nil {
		return "", err
	}
	d, ok := l.V1Dir(controller, path)
	if !ok {
		return "", errdefs.Unavailable("no cgroup v1 %s hierarchy", controller)
	}
	return d, nil
}

// cgroupV2Dir is path's directory in the unified hierarchy.
func cgroupV2Dir(path string) (string, error) {
	l, err := hostcg.Host()
	if err != nil {
		return "", err
	}
	if l.Unified == "" {
		return "", errdefs.Unavailable("no cgroup v2 hierarchy")
	}
	return filepath.Join(l.Unified, path), nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// cgroup is one box's cgroups: its memory, CPU and pid limits, and the
// counters a run's accounting reads. The files a call touches stay open
// (one pread or pwrite each, no path walk), and the limits last written are
// remembered so that only changes are written. cgroups are recycled between
// boxes (cgroupPool): nothing of a call is kept in one but counters, which
// every run reads as differences.
//
// The same fields serve v1 and v2, with the file each version has:
//
//	field       v1                              v2
//	cpuUsage    cpuacct.usage (ns)              cpu.stat usage_usec
//	memUsage    memory.usage_in_bytes           memory.current
//	memMax      memory.max_usage_in_bytes       memory.peak (reset per fd, Linux >= 6.12)
//	memFailcnt  memory.failcnt                  (memory.events "max")
//	memLimit    memory.limit_in_bytes           memory.max
//	memswLimit  memory.memsw.limit_in_bytes     memory.swap.max (0: never swaps)
//	oomControl  memory.oom_control oom_kill     memory.events oom_kill
//	pids*       pids.current, .max, .events     the same
//	cpuQuota    cpu.cfs_quota_us (+ period)     cpu.max
type cgroup struct {
	v2   bool
	dirs map[string]string // controller -> directory (v2: "" -> the one)

	cpuUsage, memUsage, memMax, memFailcnt, memLimit, memswLimit, oomControl ctlFile
	pidsCurrent, pidsMax, pidsEvents                                         ctlFile
	cpuPeriod, cpuQuota                                                      ctlFile
	procs                                                                    []int // cgroup.procs of each controller, for the launcher
	cpuProcs                                                                 int   // the box's own cpu cgroup's, once made (and not the cpuacct one); -1 before
	path                                                                     string

	// v2: capped boxes' cgroups have the cpu controller (cpu.max); the
	// peak resets (memory.peak writable, Linux >= 6.12), else the cgroup
	// is not recycled, so that its lifetime peak is its own box's.
	capped, peakResets bool
	// v2 without a resettable peak: the lifetime memory.peak before the
	// run, and the most memory.current the run was seen at (sample).
	peakBefore, sampled int64

	// last are the counters the previous run ended with: nothing between
	// two runs (a box's teardown, the next one's setup by pid 1 alone)
	// can move the OOM, failure or refused-fork counts, so the next run
	// starts from them without reading them again.
	last counters

	limit, pids int64   // last written memory limit and pids.max (0: unknown)
	cpus        float64 // last written CPU bandwidth
}

// checkCgroups reports whether this host has the cgroups FnCall needs.
func checkCgroups() error {
	_, err := cgroupMode()
	return err
}

// newCgroup makes parent/name under every controller and opens its files.
func newCgroup(parent, name string) (*cgroup, error) {
	cg := &cgroup{dirs: map[string]string{}, path: filepath.Join(parent, name), cpuProcs: -1}
	cg.clearFiles()
	for _, c := range controllers {
		d, err := cgroupV1Dir(c, cg.path)
		if err == nil {
			err = os.MkdirAll(d, 0o755)
		}
		if err != nil {
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
		f, err = hostcg.Open(cg.dirs[ctrl], name, flag)
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
	cg.memswLimit, _ = hostcg.Open(cg.dirs["memory"], "memory.memsw.limit_in_bytes", os.O_RDWR)
	return cg, nil
}

// newCgroupV2 makes the v2 cgroup dir and opens its files.
func newCgroupV2(dir string, capped bool) (*cgroup, error) {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	return openCgroupV2(dir, capped)
}

// openCgroupV2 opens the files of the v2 cgroup dir; on error it is
// removed.
func openCgroupV2(dir string, capped bool) (*cgroup, error) {
	cg := &cgroup{v2: true, dirs: map[string]string{"": dir}, path: dir, cpuProcs: -1, capped: capped}
	cg.clearFiles()
	var err error
	open := func(name string, flag int) ctlFile {
		if err != nil {
			return -1
		}
		var f ctlFile
		f, err = hostcg.Open(dir, name, flag)
		return f
	}
	cg.cpuUsage = open("cpu.stat", os.O_RDONLY)
	cg.memUsage = open("memory.current", os.O_RDONLY)
	cg.memLimit = open("memory.max", os.O_RDWR)
	cg.oomControl = open("memory.events", os.O_RDONLY)
	cg.pidsCurrent = open("pids.current", os.O_RDONLY)
	cg.pidsMax = open("pids.max", os.O_WRONLY)
	cg.pidsEvents = open("pids.events", os.O_RDONLY)
	if capped {
		cg.cpuQuota = open("cpu.max", os.O_WRONLY)
	}
	if f := open("cgroup.procs", os.O_WRONLY); f >= 0 {
		cg.procs = append(cg.procs, int(f))
	}
	if err != nil {
		cg.remove()
		return nil, fmt.Errorf("cgroup files: %w", err)
	}
	// memory.peak: resettable through its descriptor since Linux 6.12,
	// read-only since 5.19 (a lifetime peak), absent before: see sample.
	if cg.memMax, err = hostcg.Open(dir, "memory.peak", os.O_RDWR); err == nil {
		cg.peakResets = cg.memMax.WriteString("0") == nil
	} else {
		cg.memMax, _ = hostcg.Open(dir, "memory.peak", os.O_RDONLY)
	}
	// A run never swaps its way past its limit (absent without swap).
	if f, err := hostcg.Open(dir, "memory.swap.max", os.O_WRONLY); err == nil {
		werr := f.WriteInt(0)
		f.Close()
		if werr != nil {
			cg.remove()
			return nil, fmt.Errorf("cgroup memory.swap.max: %w", werr)
		}
	}
	return cg, nil
}

func writeInt(f ctlFile, v int64) error { return f.WriteInt(v) }

func readInt(f ctlFile) (int64, error) { return f.ReadInt() }

// setCPUs caps the box at cores CPUs of bandwidth; 0 lifts the cap. The
// box's cpu cgroup is made on first use (v1; a v2 box is capped from its
// making, cgroupPool.get).
func (cg *cgroup) setCPUs(cores float64) error {
	if cores == cg.cpus {
		return nil
	}
	const period = 100_000
	if cg.v2 {
		if !cg.capped {
			return fmt.Errorf("cgroup %s: no cpu controller for a CPU cap", cg.path)
		}
		quota := "max"
		if cores > 0 {
			quota = strconv.FormatInt(int64(cores*period), 10)
		}
		if err := cg.cpuQuota.WriteString(quota + " " + strconv.Itoa(period)); err != nil {
			return fmt.Errorf("cgroup cpu.max: %w", err)
		}
		cg.cpus = cores
		return nil
	}
	if cg.cpuQuota < 0 {
		if err := cg.openCPU(); err != nil {
			return err
		}
	}
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

// openCPU makes the box's v1 cpu cgroup (where cpu has a hierarchy of its
// own) and opens its bandwidth files.
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
		procs, err := hostcg.Open(dir, "cgroup.procs", os.O_WRONLY)
		if err != nil {
			return err
		}
		cg.cpuProcs = int(procs)
	}
	if cg.cpuPeriod, err = hostcg.Open(dir, "cpu.cfs_period_us", os.O_WRONLY); err != nil {
		return err
	}
	cg.cpuQuota, err = hostcg.Open(dir, "cpu.cfs_quota_us", os.O_WRONLY)
	return err
}

// cpuDir is path's directory in the v1 cpu hierarchy: in cpuacct's where
// the two are one mount.
func cpuDir(path string) (string, error) {
	l, err := hostcg.Host()
	if err != nil {
		return "", err
	}
	cpu, ok := l.V1["cpu"]
	if !ok {
		return "", errdefs.Unavailable("a CPU cap needs the cgroup v1 cpu hierarchy")
	}
	if acct, ok := l.V1["cpuacct"]; ok {
		c, err1 := os.Stat(cpu)
		a, err2 := os.Stat(acct)
		if err1 == nil && err2 == nil && os.SameFile(c, a) {
			return filepath.Join(acct, path), nil
		}
	}
	return filepath.Join(cpu, path), nil
}

// join is the cgroup.procs descriptors a box's pid 1 writes itself into:
// its own cpu cgroup's too when capped (v1).
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
	if cg.v2 { // swap is capped at 0 once and for all (newCgroupV2)
		if err := writeInt(cg.memLimit, limit); err != nil {
			return err
		}
		cg.limit = limit
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
	failcnt   int64 // v2: memory.events "max"
	oomKill   int64
	forkFails int64 // pids.events "max": forks refused at pids.max
}

// before reads what a run's accounting starts from.
func (cg *cgroup) before() (c counters, err error) {
	c = cg.last
	if c.cpuNs, err = cg.cpuNs(); err != nil {
		return c, err
	}
	if c.memory, err = readInt(cg.memUsage); err != nil {
		return c, err
	}
	if cg.v2 && !cg.peakResets {
		cg.sampled, cg.peakBefore = c.memory, 0
		if cg.memMax >= 0 {
			cg.peakBefore, err = readInt(cg.memMax)
		}
	}
	return c, err
}

// sample notes the memory in use during a run, where the kernel keeps no
// resettable peak (v2 before Linux 6.12): the run's peak is then the
// lifetime memory.peak if the run raised it, else the most seen here.
func (cg *cgroup) sample() {
	if cg.v2 && !cg.peakResets {
		if v, err := readInt(cg.memUsage); err == nil {
			cg.sampled = max(cg.sampled, v)
		}
	}
}

// v2Peak is a v2 run's peak memory.
func (cg *cgroup) v2Peak() (int64, error) {
	if cg.peakResets {
		return readInt(cg.memMax)
	}
	cg.sample()
	if cg.memMax >= 0 {
		lifetime, err := readInt(cg.memMax)
		if err != nil {
			return 0, err
		}
		if lifetime > cg.peakBefore { // reached during this run
			return lifetime, nil
		}
	}
	return cg.sampled, nil
}

// after reads the counters a run changed. (memory.failcnt alone does not
// tell an OOM kill: this kernel leaves it at 0 through one.)
func (cg *cgroup) after() (c counters, err error) {
	if c.cpuNs, err = cg.cpuNs(); err != nil {
		return c, err
	}
	if cg.v2 {
		if c.peak, err = cg.v2Peak(); err != nil {
			return c, err
		}
		if c.failcnt, c.oomKill, err = cg.oomControl.Keyed2("max", "oom_kill"); err != nil {
			return c, err
		}
	} else {
		if c.peak, err = readInt(cg.memMax); err != nil {
			return c, err
		}
		if c.failcnt, err = readInt(cg.memFailcnt); err != nil {
			return c, err
		}
		if c.oomKill, err = cg.oomControl.Keyed("oom_kill"); err != nil {
			return c, err
		}
	}
	if c.forkFails, err = cg.pidsEvents.Keyed("max"); err != nil {
		return c, err
	}
	cg.last = c
	return c, nil
}

// cpuNs is the CPU time used by every process of the box so far.
func (cg *cgroup) cpuNs() (int64, error) {
	if cg.v2 {
		us, err := cg.cpuUsage.Keyed("usage_usec")
		return us * 1000, err
	}
	return readInt(cg.cpuUsage)
}

// resetPeak starts the high-water mark afresh at the current usage; a v2
// kernel that cannot (before 6.12) keeps the cgroup's, which is its box's
// own (such cgroups are not recycled).
func (cg *cgroup) resetPeak() error {
	if cg.v2 {
		if !cg.peakResets {
			return nil
		}
		return cg.memMax.WriteString("0")
	}
	return writeInt(cg.memMax, 0)
}

// empty reports whether no process is left in the cgroup.
func (cg *cgroup) empty() bool {
	n, err := readInt(cg.pidsCurrent)
	return err == nil && n == 0
}

// recyclable reports whether a cgroup can serve another box.
func (cg *cgroup) recyclable() bool { return (!cg.v2 || cg.peakResets) && cg.empty() }

// removeParent deletes a service's parent cgroups once its containers are
// gone; one still in use (or never made) stays, silently.
func removeParent(parent string) {
	for _, c := range append(controllers, "cpu") {
		if d, err := cgroupV1Dir(c, parent); err == nil {
			_ = os.Remove(d)
		}
	}
	if d, err := cgroupV2Dir(parent); err == nil {
		_ = os.Remove(filepath.Join(d, sharedDir))
		_ = os.Remove(d)
	}
}

func (cg *cgroup) files() []*ctlFile {
	return []*ctlFile{&cg.cpuUsage, &cg.memUsage, &cg.memMax, &cg.memFailcnt, &cg.memLimit, &cg.memswLimit,
		&cg.oomControl, &cg.pidsCurrent, &cg.pidsMax, &cg.pidsEvents, &cg.cpuPeriod, &cg.cpuQuota}
}

// clearFiles marks every file not open.
func (cg *cgroup) clearFiles() {
	for _, f := range cg.files() {
		*f = hostcg.NoFile
	}
}

func (cg *cgroup) closeFiles() {
	for _, f := range cg.files() {
		f.Close()
	}
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
// work for a call. A cgroup comes back only once empty. On v2 capped and
// uncapped cgroups live in different parents, so each has its list.
type cgroupPool struct {
	parent string
	idle   int64 // a new cgroup's memory limit until its first run sets one
	list   freeList[*cgroup]

	v2          bool
	capped      freeList[*cgroup] // v2 only
	v2Once      [2]sync.Once      // the v2 parents, uncapped and capped, made once
	v2ParentErr [2]error
}

func newCgroupPool(parent string, max int, idle int64) *cgroupPool {
	v2, _ := cgroupMode() // an error is Available's to report
	return &cgroupPool{parent: parent, idle: idle, v2: v2,
		list: freeList[*cgroup]{max: max}, capped: freeList[*cgroup]{max: max}}
}

// get returns a recycled cgroup or makes one; capped says whether the box
// will have a CPU cap (v2 makes those elsewhere). A recycled one keeps the
// memory limit of its last run (at most the usage then plus the largest
// limit a call may ask for) until the next run sets its own: pid 1's setup
// needs little, and lowering a limit may make the kernel reclaim.
func (p *cgroupPool) get(capped bool) (*cgroup, error) {
	list := &p.list
	if p.v2 && capped {
		list = &p.capped
	}
	if cg, ok := list.pop(); ok {
		return cg, nil
	}
	var cg *cgroup
	var err error
	if p.v2 {
		cg, err = p.newV2(capped)
	} else {
		cg, err = newCgroup(p.parent, "fn-"+randomHex(6))
	}
	if err != nil {
		return nil, err
	}
	if err := cg.setMemory(p.idle); err != nil {
		cg.remove()
		return nil, err
	}
	return cg, nil
}

// newV2 makes a v2 box cgroup, and its parent the first time: the parent
// passes memory and pids on (and cpu, for capped boxes), uncapped boxes
// sit one level down in shared, which passes on no cpu.
func (p *cgroupPool) newV2(capped bool) (*cgroup, error) {
	l, err := hostcg.Host()
	if err != nil {
		return nil, err
	}
	i := 0
	if capped {
		i = 1
	}
	p.v2Once[i].Do(func() {
		if capped {
			p.v2ParentErr[i] = hostcg.EnableControllers(l.Unified, p.parent, append([]string{"cpu"}, v2Controllers...)...)
			return
		}
		if err := hostcg.EnableControllers(l.Unified, p.parent, v2Controllers...); err != nil {
			p.v2ParentErr[i] = err
			return
		}
		p.v2ParentErr[i] = hostcg.EnableControllers(l.Unified, filepath.Join(p.parent, sharedDir), v2Controllers...)
	})
	if err := p.v2ParentErr[i]; err != nil {
		return nil, errdefs.Unavailable("fncall cgroups: %v", err)
	}
	dir := filepath.Join(l.Unified, p.parent)
	if !capped {
		dir = filepath.Join(dir, sharedDir)
	}
	return newCgroupV2(filepath.Join(dir, "fn-"+randomHex(6)), capped)
}

// put takes back a cgroup whose box is gone: kept if it is empty and there
// is room, else removed.
func (p *cgroupPool) put(cg *cgroup) error {
	list := &p.list
	if cg.v2 && cg.capped {
		list = &p.capped
	}
	if cg.recyclable() && list.push(cg) {
		return nil
	}
	return cg.remove()
}

// close removes every free cgroup; later puts remove theirs.
func (p *cgroupPool) close() {
	for _, cg := range append(p.list.close(), p.capped.close()...) {
		_ = cg.remove()
	}
}
