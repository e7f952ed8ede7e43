// Package node is the node agent: it owns the sandboxes on one host. It is
// the final authority on admission (it refuses a create when the node is
// near its limits, with a retry hint), runs each sandbox's lifecycle on the
// backend the caller chose, reaps sandboxes past their TTL or idle timeout,
// and survives its own restart: sandboxes keep running and are re-adopted
// from versioned records on local disk. Per-sandbox state never goes through
// etcd.
package node

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/guard"
	"github.com/warrenhq/warren/internal/qos"
	"github.com/warrenhq/warren/internal/swap"
)

// Images resolves an image name to its layers; *image.Registry does.
type Images interface {
	Get(ctx context.Context, name string) (api.Image, error)
}

// LayerResolver is what an Images may also do: resolve an explicit stack
// of layer refs, bottom first, for creates that give layers instead of an
// image. *image.Registry does.
type LayerResolver interface {
	ResolveLayers(ctx context.Context, refs []string) (api.Image, error)
}

// Layers makes a layer available on local disk; *image.Cache does.
type Layers interface {
	Fetch(ctx context.Context, digest string) (backend.Layer, error)
}

// TracedLayers is what a Layers may also do: fetch a layer with the
// prefetch trace its image names for it (api.Image.PrefetchTraces), which
// a node that loads layers lazily replays. *image.Cache does.
type TracedLayers interface {
	FetchTraced(ctx context.Context, digest, trace string) (backend.Layer, error)
}

// Limits bound what the node admits (admit). Zero fields take defaults
// from the host. A create must fit both what sandboxes ask for, within
// the overcommit ratios, and what they really use (use.go), within the
// host's limits less a reserve for the host and the agent.
type Limits struct {
	// Cores is the host's CPUs (default: all of them); no sandbox may ask
	// for more.
	Cores float64
	// CPUOvercommit and MemoryOvercommit bound what requests may add up
	// to: CPU to CPUOvercommit x Cores (default 50: ~90% of agent
	// sandboxes use 5% or less of what they ask for), memory to
	// MemoryOvercommit x (the host's memory - Reserve + swap, counted only
	// where there is swap) (default 4: sandboxes must keep what they
	// touch, so memory is overcommitted less).
	CPUOvercommit    float64
	MemoryOvercommit float64
	CPU              float64 // cores requests may add up to (default CPUOvercommit x Cores)
	Memory           int64   // bytes memory limits may add up to (default as above)
	// Reserve is memory kept for the host and the agent (default 10% of
	// the host's, at least 1 GiB): a create is refused once the memory in
	// use (and swap in use), plus what recent creates may still grow
	// into, would pass the host's memory - Reserve (+ swap).
	Reserve int64
	// CreateGrowth is what a new sandbox is expected to grow into in its
	// first 30 s, held against the memory in use until its own use shows
	// (default 32 MiB, at most its memory limit).
	CreateGrowth int64
	// CPUBusy is the fraction of Cores that the node's work outside the
	// best-effort class may keep busy before latency creates are refused
	// (default 0.9). Best-effort creates are not refused for CPU: their
	// work yields to the rest.
	CPUBusy float64
	// Sandboxes caps live sandboxes (default one per 2 MiB of the host's
	// memory: 12,288 at 24 GiB).
	Sandboxes int
	// CreatesInFlight caps concurrent creates; more wait-free get 429.
	CreatesInFlight int
}

// Defaults fill in what a request leaves out.
type Defaults struct {
	CPU         float64
	Memory      int64
	PIDs        int64
	TTL         time.Duration
	MaxTTL      time.Duration
	ExecTimeout time.Duration
	MaxOutput   int64 // per stream
	// Disk is the writable-layer limit of a sandbox that asks for none,
	// on backends that can enforce it; 0 = no limit. New fails if no
	// backend on the node can.
	Disk int64
}

// Config builds an Agent.
type Config struct {
	ID       string // node id; a prefix of every sandbox id here
	StateDir string // versioned sandbox records live here
	Backends []backend.Backend
	Images   Images
	Layers   Layers
	Limits   Limits
	Defaults Defaults
	// Pool (default api.PoolOnPrem) and Labels are what a create's pool
	// and node_selector must match here; Status reports them.
	Pool   string
	Labels map[string]string
	// Network gives sandboxes their network (policies allowlist and
	// open); nil: creates asking for one are refused with
	// network_unavailable, saying NetworkProblem.
	Network        Network
	NetworkProblem string
	// Packer stores snapshots' diff layers (snapshot.go); nil: this node
	// refuses snapshots.
	Packer Packer
	// SpoolDir holds buffered exec output past its in-memory threshold,
	// unlinked while open (default: "spool" next to StateDir).
	SpoolDir string
	// Cgroup is the cgroup path that holds all the node's sandboxes (and
	// its FnCall pools and layer server), "/warren/<node>": the node
	// measures their CPU use there (use.go). Empty: no CPU measure, and
	// admission by requests and memory only.
	Cgroup string
	// ReclaimIdle is how long a running sandbox goes without a call
	// before its memory is reclaimed (reclaim.go); 0: never.
	ReclaimIdle time.Duration
	// NoMemoryMerge: never merge sandboxes' memory (KSM), whatever their
	// project says (merge.go); by default the node merges one project's
	// at a time, and turns the host's KSM on for them.
	NoMemoryMerge bool
	// KSMDir is where the host's KSM controls are (default
	// /sys/kernel/mm/ksm; tests point it elsewhere).
	KSMDir string
	// ReapInterval is how often TTLs and idle timeouts are checked.
	ReapInterval time.Duration
	Log          *slog.Logger
}

// Agent owns the sandboxes of one node. It is safe for concurrent use.
type Agent struct {
	cfg       Config
	backends  map[string]backend.Backend
	problems  []string          // backends unavailable here, and why
	runtimes  []api.NodeRuntime // of the backends with several (runtime.go)
	disk      string            // api.Node.DiskQuota (disk.go)
	security  *api.NodeSecurity
	snapshots *api.NodeSnapshots // snapshot.go
	pauses    bool               // a backend pauses (pause.go)
	log       *slog.Logger
	meter     meter // what the node really uses (use.go)
	memTotal  int64 // the host's memory

	mu        sync.Mutex
	sandboxes map[string]*sandbox
	inflight  int
	// shuttingDown: StopSandboxes is on, and admits no more creates.
	shuttingDown bool
	reserved     usage               // resources of live sandboxes and creates in flight
	paused       int                 // sandboxes paused (pause.go)
	bestEffort   int                 // sandboxes of QoS class best-effort
	merging      map[string]int      // merging sandboxes and creates in flight, by merge group (merge.go)
	mergeHow     string              // how the node merges memory, or why not (fixed at New)
	qos          qos.Support         // how best-effort sandboxes run here (fixed at New)
	oomOrder     string              // a host-wide OOM's kill order (qos.OOMOrder, fixed at New)
	recent       recentCreates       // memory recent creates may still grow into (use.go)
	reclaims     int64               // idle reclaims done (reclaim.go)
	reclaimed    int64               // bytes they freed
	reclaimHow   string              // the last one's mechanism
	journals     map[string]*journal // journal.go
	changes      changeLog           // what Changes tells (changes.go); its tombstones under mu
	graves       graves              // why recently ended sandboxes ended (reaper.go)

	stop chan struct{}
	// closing is canceled by Close: what runs for the agent's lifetime
	// derives from it.
	closing context.Context
	close   context.CancelFunc
	wg      sync.WaitGroup
}

type usage struct {
	cpu       float64
	memory    int64
	sandboxes int
}

// nodeIDPattern: node ids prefix sandbox ids, so they contain no '-'.
var nodeIDPattern = regexp.MustCompile(`^[a-z0-9]{1,20}$`)

// New builds an agent. Call Start to recover earlier sandboxes and start
// the reaper.
func New(ctx context.Context, cfg Config) (*Agent, error) {
	if !nodeIDPattern.MatchString(cfg.ID) {
		return nil, errdefs.Invalid("node id %q: want 1-20 of [a-z0-9]", cfg.ID)
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.KSMDir == "" {
		cfg.KSMDir = ksmDir
	}
	if cfg.ReapInterval == 0 {
		cfg.ReapInterval = time.Second
	}
	cfg.Limits = cfg.Limits.withDefaults()
	cfg.Defaults = cfg.Defaults.withDefaults()
	if cfg.Pool == "" {
		cfg.Pool = api.PoolOnPrem
	}
	cfg.Labels = maps.Clone(cfg.Labels)
	if cfg.SpoolDir == "" {
		cfg.SpoolDir = filepath.Join(filepath.Dir(filepath.Clean(cfg.StateDir)), "spool")
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("node state dir: %w", err)
	}
	if err := os.MkdirAll(cfg.SpoolDir, 0o700); err != nil {
		return nil, fmt.Errorf("node spool dir: %w", err)
	}
	guard.SweepSpool(cfg.SpoolDir)
	a := &Agent{
		cfg:       cfg,
		backends:  map[string]backend.Backend{},
		log:       cfg.Log.With("node", cfg.ID),
		sandboxes: map[string]*sandbox{},
		journals:  map[string]*journal{},
		changes:   newChangeLog(),
		stop:      make(chan struct{}),
		meter:     meter{cgroup: cfg.Cgroup},
	}
	a.closing, a.close = context.WithCancel(context.Background())
	a.meter.sample(time.Now()) // memory figures before the first create
	a.memTotal = a.meter.mem.Total
	for _, b := range cfg.Backends {
		if err := b.Available(ctx); err != nil {
			// A missing host feature disables one backend, not the node.
			a.problems = append(a.problems, fmt.Sprintf("%s: %v", b.Name(), err))
			a.log.Warn("backend unavailable", "backend", b.Name(), "err", err)
			continue
		}
		a.backends[b.Name()] = b
	}
	rts, problems := nodeRuntimes(ctx, a.backends) // runtime.go
	a.runtimes, a.problems = rts, append(a.problems, problems...)
	for _, p := range problems {
		a.log.Warn("sandbox runtime unavailable: creates asking for it are refused", "problem", p)
	}
	if cfg.Network == nil && cfg.NetworkProblem != "" {
		a.problems = append(a.problems, "network: "+cfg.NetworkProblem)
	}
	a.security = nodeSecurity(a.backends)
	a.qos = qos.Probe()
	// Sandboxes before the agent in a host-wide OOM: theirs are raised
	// (qos.OOMScoreAdj), the agent's lowered where the host lets it.
	oom, err := qos.ProtectSelf()
	if err != nil {
		a.log.Warn("the agent's oom_score_adj stays as it was: sandboxes still go first in a host-wide OOM, but one could bring its own down to the agent's", "oom_score_adj", oom, "err", err)
	}
	a.oomOrder = qos.OOMOrder(oom)
	a.mergeHow = a.mergeMechanism()              // merge.go
	a.snapshots = nodeSnapshots(ctx, a.backends) // snapshot.go
	for _, b := range a.backends {
		_, p := b.(backend.Pauser)
		a.pauses = a.pauses || p
	}
	dq, why := nodeDiskQuota(a.backends)
	a.disk = dq.Mechanism
	if why != "" {
		a.problems = append(a.problems, why)
		a.log.Warn("sandbox disk limits unavailable: creates asking for disk are refused", "reason", why)
	} else {
		a.log.Info("sandbox disk limits", "disk_quota", dq.Mechanism, "inodes", dq.Inodes)
	}
	if cfg.Defaults.Disk > 0 && !api.EnforcesDisk(dq.Mechanism, false) {
		if why == "" {
			why = "no backend here limits disk"
		}
		return nil, errdefs.New(errdefs.ErrUnavailable, api.CodeDiskQuotaUnsupported,
			"default disk %v: node %s cannot limit disk (disk_quota %s): %s", api.Quantity(cfg.Defaults.Disk), cfg.ID, dq.Mechanism, why)
	}
	return a, nil
}

// SpoolDir is where buffered exec output past its in-memory threshold
// goes (guard.Spool): files unlinked while open, so nothing outlives the
// call that wrote it.
func (a *Agent) SpoolDir() string { return a.cfg.SpoolDir }

// What an idle sandbox costs the agent in open files (the pidfd its
// exit is watched by: the container backend keeps roots on a mount
// shelf, not in descriptors), and what the agent keeps for
// everything else (etcd, clients, calls in flight and their pipes).
const (
	openFilesPerSandbox = 1
	openFilesSpare      = 2048
)

// RaiseOpenFiles raises the process's open files limit to the most the
// kernel allows (fs.nr_open), soft and hard: an agent holds a few
// descriptors per sandbox, and hosts often cap processes at 20,000 or
// less. Sandboxes get their own limit (their spec's rlimits), not this
// one. Without CAP_SYS_RESOURCE it raises the soft limit to the hard one.
func RaiseOpenFiles() (uint64, error) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return 0, err
	}
	want := rl.Max
	if b, err := os.ReadFile("/proc/sys/fs/nr_open"); err == nil {
		if n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err == nil && n > want {
			want = n
		}
	}
	if rl.Cur >= want && rl.Max >= want {
		return rl.Cur, nil
	}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: want, Max: want}); err != nil {
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: rl.Max, Max: rl.Max}); err != nil {
			return rl.Cur, err
		}
		return rl.Max, nil
	}
	return want, nil
}

func (l Limits) withDefaults() Limits {
	mem, _ := readMemInfo()
	if mem.Total == 0 {
		mem.Total = 1 << 30
	}
	if l.Cores == 0 {
		l.Cores = float64(runtime.NumCPU())
	}
	if l.CPUOvercommit == 0 {
		l.CPUOvercommit = 50
	}
	if l.MemoryOvercommit == 0 {
		l.MemoryOvercommit = 4
	}
	if l.Reserve == 0 {
		l.Reserve = max(1<<30, mem.Total/10)
	}
	if l.CPU == 0 {
		l.CPU = l.CPUOvercommit * l.Cores
	}
	if l.Memory == 0 {
		l.Memory = int64(l.MemoryOvercommit * float64(max(mem.Total-l.Reserve, 0)+mem.SwapTotal))
	}
	if l.CreateGrowth == 0 {
		l.CreateGrowth = 32 << 20
	}
	if l.CPUBusy == 0 {
		l.CPUBusy = 0.9
	}
	if l.Sandboxes == 0 {
		l.Sandboxes = int(min(max(mem.Total/(2<<20), 100), 1<<20))
		// And what the agent's open files allow (RaiseOpenFiles).
		var rl unix.Rlimit
		if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) == nil && rl.Cur < 1<<62 {
			l.Sandboxes = min(l.Sandboxes, max(int(rl.Cur)-openFilesSpare, 0)/openFilesPerSandbox)
		}
	}
	if l.CreatesInFlight == 0 {
		l.CreatesInFlight = 64
	}
	return l
}

func (d Defaults) withDefaults() Defaults {
	if d.CPU == 0 {
		d.CPU = 1
	}
	if d.Memory == 0 {
		d.Memory = 512 << 20
	}
	if d.PIDs == 0 {
		d.PIDs = 1024
	}
	if d.TTL == 0 {
		d.TTL = time.Hour
	}
	if d.MaxTTL == 0 {
		d.MaxTTL = 7 * 24 * time.Hour
	}
	if d.ExecTimeout == 0 {
		d.ExecTimeout = 10 * time.Minute
	}
	if d.MaxOutput == 0 {
		d.MaxOutput = 1 << 20
	}
	return d
}

// ID returns the node's id.
func (a *Agent) ID() string { return a.cfg.ID }

// Start re-adopts the sandboxes an earlier agent process left running,
// removes what the backends hold for sandboxes that have no record
// (sweep.go), ends the sandboxes whose TTL ran out while the agent was
// down, and starts the reaper: by the time it returns, the node holds
// nothing it should not. Sandboxes whose backend lost them are marked
// lost.
func (a *Agent) Start(ctx context.Context) error {
	if err := a.recover(ctx); err != nil {
		return err
	}
	a.sweep(ctx)
	if a.cfg.Network != nil {
		if err := a.cfg.Network.Sweep(); err != nil {
			a.log.Warn("network sweep", "err", err)
		}
	}
	if n := a.reap(time.Now()); n > 0 {
		a.log.Info("ended sandboxes whose ttl expired while the agent was down", "count", n)
	}
	a.wg.Add(2)
	go a.reapLoop()
	go a.useLoop() // use.go
	return nil
}

// Close stops the reaper and the watchers. Sandboxes keep running: a new
// agent re-adopts them (StopSandboxes first ends them instead).
func (a *Agent) Close() error {
	select {
	case <-a.stop:
	default:
		close(a.stop)
	}
	a.close()
	a.wg.Wait()
	// Backends that hold sessions with their sandboxes (microvm's guest
	// agents) let go of them, as this process's exit would.
	for _, b := range a.cfg.Backends {
		if c, ok := b.(io.Closer); ok {
			c.Close()
		}
	}
	return nil
}

// Status reports the node's capacity, usage and problems.
func (a *Agent) Status() api.Node {
	var reclaim string
	if a.pauses { // fixed at New
		reclaim = swap.Describe() // a read of /proc/swaps, not under a.mu
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	n := api.Node{
		ID:     a.cfg.ID,
		Pool:   a.cfg.Pool,
		Labels: maps.Clone(a.cfg.Labels),
		Capacity: api.Capacity{
			CPU:       a.cfg.Limits.CPU,
			Memory:    api.Quantity(a.cfg.Limits.Memory),
			Sandboxes: a.cfg.Limits.Sandboxes,
		},
		Usage: api.Capacity{
			CPU:       math.Round(a.reserved.cpu*1e6) / 1e6, // not a float sum's noise
			Memory:    api.Quantity(a.reserved.memory),
			Sandboxes: a.reserved.sandboxes,
			Paused:    a.paused,
		},
		Healthy:   len(a.backends) > 0,
		Problems:  append([]string(nil), a.problems...),
		UpdatedAt: time.Now().UTC(),
		DiskQuota: a.disk,
		Network:   a.cfg.Network != nil,
		Security:  a.security,
		Snapshots: a.snapshots,
		Runtimes:  slices.Clone(a.runtimes),
		InUse:     a.inUse(a.reclaimStatus()),
		QoS: &api.NodeQoS{
			Latency:        len(a.sandboxes) - a.bestEffort,
			BestEffort:     a.bestEffort,
			Group:          a.qos.Group,
			CoreScheduling: a.qos.CoreScheduling,
			OOMOrder:       a.oomOrder,
		},
		MemoryMerge: a.mergeStatus(),
	}
	n.PauseReclaim = reclaim
	if l, ok := a.cfg.Layers.(interface {
		Loading() (string, *api.LayerCacheStats)
	}); ok {
		n.LayerLoading, n.LayerCache = l.Loading()
	}
	for name, b := range a.backends {
		n.Backends = append(n.Backends, name)
		if ab, ok := b.(backend.Accelerated); ok {
			accel, why := ab.Accel()
			n.Machines = append(n.Machines, api.NodeMachine{Backend: name, Accel: accel, Reason: why})
		}
	}
	sort.Strings(n.Backends)
	sort.Slice(n.Machines, func(i, j int) bool { return n.Machines[i].Backend < n.Machines[j].Backend })
	return n
}

var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// newID returns "<node>-<16 random base32 chars>" (80 bits).
func (a *Agent) newID() string {
	var b [10]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return a.cfg.ID + "-" + idEncoding.EncodeToString(b[:])
}

// SandboxIDPattern matches every well-formed sandbox id: the node id, a
// dash, and a random suffix.
var SandboxIDPattern = regexp.MustCompile(`^[a-z0-9]{1,20}-[a-z2-7]{16}$`)

// NodeOf returns the node id a sandbox id carries, so callers route without
// a lookup.
func NodeOf(id string) (string, error) {
	if !SandboxIDPattern.MatchString(id) {
		return "", errdefs.New(errdefs.ErrInvalid, "", "malformed sandbox id %q", id)
	}
	return id[:strings.IndexByte(id, '-')], nil
}

func (a *Agent) recordPath(id string) string {
	return filepath.Join(a.cfg.StateDir, id+".json")
}

func errSandboxNotFound(id string) error {
	return errdefs.New(errdefs.ErrNotFound, api.CodeSandboxNotFound, "sandbox %s not found", id)
}

// lookup finds a live sandbox by id.
func (a *Agent) lookup(id string) (*sandbox, error) {
	if _, err := NodeOf(id); err != nil {
		return nil, err
	}
	a.mu.Lock()
	s := a.sandboxes[id]
	g, ok := a.graves.get(id)
	a.mu.Unlock()
	if s == nil {
		if ok {
			return nil, errdefs.New(errdefs.ErrNotFound, api.CodeSandboxNotFound,
				"sandbox %s not found: it was ended at %s (%s)", id, g.at.Format(time.RFC3339), g.reason)
		}
		return nil, errSandboxNotFound(id)
	}
	return s, nil
}

var errClosed = errors.New("agent closed")

// nodeSecurity is what the node reports it enforces (package guard's
// measures, applied by every backend that isolates), the host's LSMs, and
// whether container sandboxes get user namespaces.
func nodeSecurity(backends map[string]backend.Backend) *api.NodeSecurity {
	s := &api.NodeSecurity{Enforced: guard.Enforced()}
	for _, l := range guard.LSMs() {
		s.LSMs = append(s.LSMs, api.NodeLSM{Name: l.Name, Active: l.Active, Applied: l.Applied, Note: l.Note})
	}
	if u, ok := backends["container"].(userNSer); ok {
		s.UserNS = "per-sandbox"
		if err := u.UserNS(); err != nil {
			s.UserNS = "off: " + err.Error()
		}
	}
	return s
}

// userNSer is a backend whose sandboxes may run in user namespaces of
// their own; UserNS says why not when they do not.
type userNSer interface{ UserNS() error }
