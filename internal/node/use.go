package node

import (
	"bufio"
	"math"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/cgroup"
	"github.com/warrenhq/warren/internal/qos"
)

// What the node's sandboxes really use, measured: the node admits by it
// (admit), reports it (Status: api.Node.InUse) and placement ranks nodes
// by it. About 90% of agent sandboxes use 5% or less of the CPU they ask
// for, so a node that admitted by requests alone would sit idle.
//
//   - CPU: the cores busy in the node's cgroup (Config.Cgroup, which holds
//     every sandbox, FnCall pool and layer server of the node), split into
//     best-effort work (the class groups, qos.ClassGroup, below it) and the
//     rest; an average over the last ~10 s, sampled every useInterval.
//   - Memory: the host's memory in use (MemTotal - MemAvailable, which
//     counts what the kernel can reclaim at once as free), and swap.

// useInterval is how often the meter samples; useWindow the time constant
// of its CPU averages.
const (
	useInterval = 2 * time.Second
	useWindow   = 10 * time.Second
)

// meter measures what the node uses. Its zero value measures nothing
// until started; its methods are safe for concurrent use.
type meter struct {
	cgroup  string                  // the node's cgroup path; "": no CPU measure
	readMem func() (memInfo, error) // nil: readMemInfo (tests put pressure on)

	mu       sync.Mutex
	sampled  bool
	at       time.Time
	all, be  time.Duration // CPU used so far: the node's cgroup, its class groups
	cpu      float64       // cores busy, not best-effort (average)
	cpuBE    float64       // cores busy, best-effort (average)
	mem      memInfo
	cpuKnown bool

	classGroups []string  // the node's best-effort class groups, as last found
	foundAt     time.Time // when
}

// classFindEvery is how often the meter looks for the node's best-effort
// class groups (one per backend: <node>/best-effort, <node>/microvm/
// best-effort, ...): finding them lists the node's cgroup, whose children
// are mostly its sandboxes, thousands of them.
const classFindEvery = 30 * time.Second

// classes returns the node's best-effort class groups. m.mu not held.
func (m *meter) classes(l *cgroup.Layout, now time.Time) []string {
	m.mu.Lock()
	groups, at := m.classGroups, m.foundAt
	m.mu.Unlock()
	if !at.IsZero() && now.Sub(at) < classFindEvery {
		return groups
	}
	groups = append(l.Glob(path.Join(m.cgroup, qos.ClassGroup)), l.Glob(path.Join(m.cgroup, "*", qos.ClassGroup))...)
	m.mu.Lock()
	m.classGroups, m.foundAt = groups, now
	m.mu.Unlock()
	return groups
}

// memInfo is /proc/meminfo's figures, in bytes.
type memInfo struct {
	Total, Available, SwapTotal, SwapFree int64
}

// used is the memory in use: what the kernel cannot hand out at once.
func (m memInfo) used() int64 { return m.Total - m.Available }

// readMemInfo reads /proc/meminfo.
func readMemInfo() (memInfo, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return memInfo{}, err
	}
	defer f.Close()
	var m memInfo
	fields := map[string]*int64{"MemTotal": &m.Total, "MemAvailable": &m.Available, "SwapTotal": &m.SwapTotal, "SwapFree": &m.SwapFree}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if p := fields[k]; ok && p != nil {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			*p = kb << 10
		}
	}
	return m, sc.Err()
}

// sample takes one measurement and folds it into the averages.
func (m *meter) sample(now time.Time) {
	m.mu.Lock()
	readMem := m.readMem
	m.mu.Unlock()
	if readMem == nil {
		readMem = readMemInfo
	}
	mem, merr := readMem()
	var all, be time.Duration
	allOK := false
	if m.cgroup != "" {
		if l, err := cgroup.Host(); err == nil {
			all, allOK = l.CPUUsage(m.cgroup)
			for _, g := range m.classes(l, now) {
				if u, ok := l.CPUUsage(g); ok {
					be += u
				}
			}
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if merr == nil {
		m.mem = mem
	}
	if !allOK {
		return
	}
	if m.sampled && now.After(m.at) && all >= m.all && be >= m.be {
		dt := now.Sub(m.at)
		cores := float64(all-m.all-(be-m.be)) / float64(dt)
		coresBE := float64(be-m.be) / float64(dt)
		w := 1 - math.Exp(-float64(dt)/float64(useWindow))
		if !m.cpuKnown {
			w = 1
		}
		m.cpu += (max(cores, 0) - m.cpu) * w
		m.cpuBE += (coresBE - m.cpuBE) * w
		m.cpuKnown = true
	}
	m.sampled, m.at, m.all, m.be = true, now, all, be
}

// useLoop samples what the node uses every useInterval, and relieves
// memory pressure (pressure.go), until the agent closes.
func (a *Agent) useLoop() {
	defer a.wg.Done()
	t := time.NewTicker(useInterval)
	defer t.Stop()
	for {
		select {
		case <-a.stop:
			return
		case now := <-t.C:
			a.meter.sample(now)
			a.relievePressure(a.closing)
		}
	}
}

// read returns the latest figures: CPU (cores busy outside and inside
// the best-effort class; ok false until two samples are in) and memory.
func (m *meter) read() (cpu, cpuBE float64, cpuOK bool, mem memInfo) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cpu, m.cpuBE, m.cpuKnown, m.mem
}

// recentCreates remembers the memory that sandboxes created in the last
// recentWindow may still grow into, which the host's memory in use does
// not show yet: a burst of creates would otherwise all be admitted
// against the memory the first of them have not touched yet.
type recentCreates struct {
	entries []recentCreate // oldest first
	total   int64
}

type recentCreate struct {
	at    time.Time
	bytes int64
}

// recentWindow is how long a create's expected growth is held.
const recentWindow = 30 * time.Second

// expire drops what is older than recentWindow.
func (r *recentCreates) expire(now time.Time) {
	i := 0
	for i < len(r.entries) && now.Sub(r.entries[i].at) > recentWindow {
		r.total -= r.entries[i].bytes
		i++
	}
	r.entries = r.entries[i:]
}

func (r *recentCreates) add(now time.Time, bytes int64) {
	r.entries = append(r.entries, recentCreate{now, bytes})
	r.total += bytes
}

// inUse reports the measured figures for Status.
func (a *Agent) inUse(reclaim *api.NodeReclaim) *api.NodeInUse {
	cpu, cpuBE, cpuOK, mem := a.meter.read()
	u := &api.NodeInUse{
		Memory:      api.Quantity(mem.used()),
		MemoryTotal: api.Quantity(mem.Total),
		MemoryLimit: api.Quantity(mem.Total - a.cfg.Limits.Reserve),
		Swap:        api.Quantity(mem.SwapTotal),
		Cores:       a.cfg.Limits.Cores,
		Overcommit:  api.NodeOvercommit{CPU: a.cfg.Limits.CPUOvercommit, Memory: a.cfg.Limits.MemoryOvercommit},
		Reclaim:     reclaim,
	}
	switch {
	case cpuOK:
		u.CPU, u.CPUBestEffort = round2(cpu), round2(cpuBE)
	case a.cfg.Cgroup == "":
		u.CPUUnmeasured = "the node has no cgroup of its own to measure"
	default:
		u.CPUUnmeasured = "not measured yet, or no CPU accounting for cgroup " + a.cfg.Cgroup
	}
	return u
}

func round2(x float64) float64 { return math.Round(x*100) / 100 }
