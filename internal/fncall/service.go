package fncall

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/fncall/proto"
	"github.com/warrenhq/warren/internal/guard"
	"github.com/warrenhq/warren/internal/hostbin"
)

// Runner is what the node API and the apiserver need from FnCall: run one
// call, and list the runtimes with their pools. *Service implements it.
type Runner interface {
	// Run runs one call to completion. Errors (never a program's fault):
	// errdefs.ErrInvalid for a bad request (400), ErrNotFound with code
	// api.CodeRuntimeNotFound (404), ErrUnavailable with
	// api.CodeRuntimeUnavailable (503), ErrExhausted with
	// api.CodeFnOverloaded and a Retry-After (429). A platform fault after
	// the call started is not an error: the result's cases say
	// SandboxError.
	Run(ctx context.Context, req api.FnRunRequest) (api.FnResult, error)
	// Runtimes lists the declared runtimes with their pools' state.
	Runtimes(ctx context.Context) []api.FnRuntime
}

var _ Runner = (*Service)(nil)

// Runtime declares one runtime: an environment, where a call's source goes,
// how to compile it (optional) and run it, and its pool.
type Runtime struct {
	Name string `json:"name"`
	// Env is the environment (name@version) the containers are made of.
	Env    string `json:"env"`
	Source string `json:"source"` // e.g. "main.py", written under /box
	// Compile runs once before the cases, in /box, if set.
	Compile       []string     `json:"compile,omitempty"`
	CompileLimits api.FnLimits `json:"compile_limits,omitempty"`
	Run           []string     `json:"run"`
	// WritableRoot makes the root an overlay over the environment's layers,
	// so a program may write anywhere (in memory, within the scratch
	// cap). By default the environment's files are read-only and a
	// program writes in /box, /tmp and /dev/shm: the root is then the
	// layer's own mount, whose path lookups are warm from every container
	// before (a fresh overlay's are cold: ~1 ms more per python start).
	// An environment of several layers, or one without /box, /tmp, /proc
	// and /dev to mount on, always gets the overlay.
	WritableRoot bool `json:"writable_root,omitempty"`
	// CPUs caps each container's CPU bandwidth, in cores. By default (0)
	// a container has no cap of its own: its CPU time limit bounds each
	// run, and its processes share the daemon's cgroup in the cpu
	// hierarchy (cap the daemon's to cap FnCall as a whole). A cap costs a
	// cpu cgroup per container, ~5% of the calls/s at saturation.
	CPUs float64    `json:"cpus,omitempty"`
	Pool PoolConfig `json:"pool,omitempty"`
}

// DefaultRuntimes are the runtimes a node declares unless configured
// otherwise. Their environments are built by scripts/build-runtime-images
// (debian-python, debian-gcc) or always present (busybox).
var DefaultRuntimes = []Runtime{
	{Name: "python3", Env: "debian-python@12", Source: "main.py", Run: []string{"python3", "-I", "main.py"}},
	{Name: "c", Env: "debian-gcc@12", Source: "main.c",
		Compile: []string{"gcc", "-O2", "-std=gnu17", "-o", "main", "main.c", "-lm"}, Run: []string{"./main"}},
	{Name: "cpp", Env: "debian-gcc@12", Source: "main.cpp",
		Compile: []string{"g++", "-O2", "-std=gnu++17", "-o", "main", "main.cpp"}, Run: []string{"./main"}},
	{Name: "sh", Env: "busybox@1", Source: "main.sh", Run: []string{"sh", "main.sh"}},
}

// Config configures a Service.
type Config struct {
	Runtimes []Runtime
	Images   Images
	Layers   Layers
	Mounts   Mounts
	// StateDir holds the scratch directory fninit mounts over.
	StateDir string
	// CgroupParent is the cgroup path, under each v1 hierarchy, the
	// containers' cgroups are made in, e.g. "/warren/n1a2b/fn".
	CgroupParent string
	// Init is warren-fninit's path (default: next to this executable,
	// then $PATH).
	Init string
	// UID and GID run the programs (default 65534, nobody).
	UID, GID int
	// ScratchBytes caps what a container may write, all files together
	// (default 256 MiB). Writes are in memory charged to the container.
	ScratchBytes int64
	Defaults     api.FnLimits // default DefaultLimits
	Max          api.FnLimits // default MaxLimits
	// MaxRunning is how many calls run at once on this node, all runtimes
	// together (default 2 per CPU); more wait up to QueueWait (at most 32
	// per running call), then get 429. Calls beyond the cores only share
	// them: a judged program's wall time would stretch until a correct one
	// hits its wall limit, and programs time-sliced against each other run
	// slower (2 per CPU against 4: +7% calls/s at saturation, A/B).
	MaxRunning int
	QueueWait  time.Duration // default 5 s
	// MaxRequestBytes caps the files and inputs of one call (default and
	// at most api.MaxFnInput, 32 MiB).
	MaxRequestBytes int64
	Log             *slog.Logger
}

// Images resolves an environment; Layers brings a layer to this host; Mounts
// mounts it read-only, refcounted (image.Registry, image.Cache and
// image.Mounts).
type (
	Images interface {
		Get(ctx context.Context, name string) (api.Image, error)
	}
	Layers interface {
		Fetch(ctx context.Context, digest string) (backend.Layer, error)
	}
	Mounts interface {
		Acquire(ctx context.Context, layer backend.Layer) (string, error)
		Release(digest string) error
	}
)

// Service is a node's FnCall: one pool per runtime.
type Service struct {
	cfg      Config
	runtimes map[string]*runtimeState
	order    []string
	netns    *netnsPool
	slots    *slots
	seccomp  []byte // the containers' filter, assembled once
	apparmor string // the runs' AppArmor profile; "": none (guard.LoadAppArmor)
	cgroups  *cgroupPool

	launchMu sync.Mutex
	launch   *launcher // started on first use, again if it died
	devMade  bool      // the /dev template is mounted (before the first launcher)

	ctx    context.Context
	cancel context.CancelFunc
}

// runtimeState is a runtime and its pool; the environment is resolved and
// its layers mounted on first use, and again after a failure (the
// environment may be published later).
type runtimeState struct {
	Runtime
	pool *pool

	mu      sync.Mutex
	spec    *boxSpec
	image   api.Image
	digests []string
	err     error
	tried   time.Time
	// resolving is closed when the resolve under way ends; nil when none
	// is. The lock is not held while resolving: fetching layers may take
	// minutes, and listing runtimes (every status poll) must not wait.
	resolving chan struct{}
}

// New checks the host and returns a Service; Start starts its pools.
func New(cfg Config) (*Service, error) {
	if cfg.Runtimes == nil {
		cfg.Runtimes = DefaultRuntimes
	}
	if cfg.UID == 0 && cfg.GID == 0 {
		cfg.UID, cfg.GID = 65534, 65534
	}
	if cfg.ScratchBytes == 0 {
		cfg.ScratchBytes = 256 << 20
	}
	if cfg.Defaults == (api.FnLimits{}) {
		cfg.Defaults = DefaultLimits
	}
	if cfg.Max == (api.FnLimits{}) {
		cfg.Max = MaxLimits
	}
	if cfg.MaxRunning <= 0 {
		cfg.MaxRunning = 2 * runtime.NumCPU()
	}
	if cfg.QueueWait <= 0 {
		cfg.QueueWait = 5 * time.Second
	}
	if cfg.MaxRequestBytes == 0 || cfg.MaxRequestBytes > api.MaxFnInput {
		cfg.MaxRequestBytes = api.MaxFnInput
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Init == "" {
		cfg.Init = hostbin.Find("warren-fninit")
	}
	if cfg.StateDir == "" || cfg.CgroupParent == "" || cfg.Images == nil || cfg.Layers == nil || cfg.Mounts == nil {
		return nil, errdefs.Invalid("fncall: state dir, cgroup parent, images, layers and mounts are required")
	}
	if err := os.MkdirAll(filepath.Join(cfg.StateDir, "scratch"), 0o700); err != nil {
		return nil, err
	}
	filter, err := seccompProgram()
	if err != nil {
		return nil, errdefs.Unavailable("%v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Service{cfg: cfg, runtimes: map[string]*runtimeState{}, netns: newNetnsPool(256), seccomp: filter,
		cgroups: newCgroupPool(cfg.CgroupParent, 256, 64<<20),
		slots:   newSlots(cfg.MaxRunning, 32*cfg.MaxRunning, cfg.QueueWait), ctx: ctx, cancel: cancel}
	s.apparmor, _ = guard.LoadAppArmor() // where it fails, node ls says why
	for _, rt := range cfg.Runtimes {
		if rt.Name == "" || rt.Env == "" || rt.Source == "" || len(rt.Run) == 0 {
			cancel()
			return nil, errdefs.Invalid("fncall runtime %q: name, env, source and run are required", rt.Name)
		}
		if rt.CPUs < 0 || rt.CPUs > 1024 {
			cancel()
			return nil, errdefs.Invalid("fncall runtime %q: cpus %v: want 0 (no cap) to 1024 cores", rt.Name, rt.CPUs)
		}
		if _, dup := s.runtimes[rt.Name]; dup {
			cancel()
			return nil, errdefs.Invalid("fncall runtime %q declared twice", rt.Name)
		}
		st := &runtimeState{Runtime: rt}
		st.pool = newPool(rt.Pool, func() (boxSpec, error) { return s.boxSpec(st) }, cfg.Log.Warn)
		s.runtimes[rt.Name] = st
		s.order = append(s.order, rt.Name)
	}
	return s, nil
}

// Available reports whether this host can run FnCall at all.
func (s *Service) Available() error {
	if err := checkCgroups(); err != nil {
		return err
	}
	if _, err := os.Stat(s.cfg.Init); err != nil {
		return errdefs.Unavailable("fncall: %s not found (build it: scripts/setup, or scripts/build-helpers)", s.cfg.Init)
	}
	return nil
}

// launcher returns the node's launcher, starting it on first use and again
// if it died (its containers died with it).
func (s *Service) launcher() (*launcher, error) {
	s.launchMu.Lock()
	defer s.launchMu.Unlock()
	if s.launch != nil && s.launch.alive() {
		return s.launch, nil
	}
	if s.ctx.Err() != nil {
		return nil, errdefs.Unavailable("fncall: shutting down")
	}
	if !s.devMade {
		if err := makeDev(s.devDir()); err != nil {
			return nil, fmt.Errorf("fncall: /dev template: %w", err)
		}
		s.devMade = true
	}
	l, err := startLauncher(s.cfg.Init, s.cfg.Log)
	if err != nil {
		return nil, err
	}
	s.launch = l
	return l, nil
}

// Start starts the pools' makers; runtimes with a minimum pool resolve their
// environment now.
func (s *Service) Start() {
	for _, name := range s.order {
		st := s.runtimes[name]
		st.pool.start(s.ctx)
		if st.pool.cfg.Min > 0 {
			st.pool.wake()
		}
	}
}

// Close destroys every ready container and releases the layers.
func (s *Service) Close() {
	s.cancel()
	defer s.netns.close()
	for _, name := range s.order {
		st := s.runtimes[name]
		st.pool.close()
		st.mu.Lock()
		for st.resolving != nil { // ends soon: s.ctx is cancelled
			ch := st.resolving
			st.mu.Unlock()
			<-ch
			st.mu.Lock()
		}
		for _, d := range st.digests {
			_ = s.cfg.Mounts.Release(d)
		}
		st.digests, st.spec = nil, nil
		st.mu.Unlock()
	}
	s.launchMu.Lock()
	if s.launch != nil {
		s.launch.close()
	}
	if s.devMade {
		removeDev(s.devDir())
		s.devMade = false
	}
	s.launchMu.Unlock()
	s.cgroups.close()
	removeParent(s.cfg.CgroupParent)
}

// LayerDigests are the layers the runtimes hold mounted, for the garbage
// collector's keep set.
func (s *Service) LayerDigests() []string {
	var out []string
	for _, name := range s.order {
		st := s.runtimes[name]
		st.mu.Lock()
		out = append(out, st.digests...)
		st.mu.Unlock()
	}
	return out
}

// retryResolve is how soon a runtime whose environment was missing is
// tried again.
const retryResolve = 5 * time.Second

// boxSpec resolves the runtime's environment and mounts its layers, once;
// a caller that finds a resolve under way waits for it.
func (s *Service) boxSpec(st *runtimeState) (boxSpec, error) {
	st.mu.Lock()
	for st.spec == nil && st.resolving != nil {
		ch := st.resolving
		st.mu.Unlock()
		<-ch
		st.mu.Lock()
	}
	if st.spec != nil {
		defer st.mu.Unlock()
		return *st.spec, nil
	}
	if st.err != nil && time.Since(st.tried) < retryResolve {
		defer st.mu.Unlock()
		return boxSpec{}, st.err
	}
	st.tried, st.resolving = time.Now(), make(chan struct{})
	st.mu.Unlock()

	spec, img, digests, err := s.resolve(s.ctx, st.Runtime)

	st.mu.Lock()
	defer st.mu.Unlock()
	st.err = err
	if err == nil {
		st.spec, st.image, st.digests = &spec, img, digests
	}
	close(st.resolving)
	st.resolving = nil
	return spec, err
}

func (s *Service) resolve(ctx context.Context, rt Runtime) (boxSpec, api.Image, []string, error) {
	img, err := s.cfg.Images.Get(ctx, rt.Env)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			err = errdefs.New(errdefs.ErrUnavailable, api.CodeRuntimeUnavailable,
				"runtime %s: environment %s is not published (scripts/build-runtime-images --register)", rt.Name, rt.Env)
		}
		return boxSpec{}, img, nil, err
	}
	var lower, digests []string
	release := func() {
		for _, d := range digests {
			_ = s.cfg.Mounts.Release(d)
		}
	}
	for _, d := range img.Layers {
		l, err := s.cfg.Layers.Fetch(ctx, d)
		if err != nil {
			release()
			return boxSpec{}, img, nil, fmt.Errorf("runtime %s: layer %s: %w", rt.Name, d, err)
		}
		dir, err := s.cfg.Mounts.Acquire(ctx, l)
		if err != nil {
			release()
			return boxSpec{}, img, nil, fmt.Errorf("runtime %s: mount %s: %w", rt.Name, d, err)
		}
		digests = append(digests, d)
		lower = append([]string{dir}, lower...) // overlayfs wants the top first
	}
	readOnly := !rt.WritableRoot && len(lower) == 1 && hasDirs(lower[0], workdir, "/tmp", "/proc", "/dev")
	return boxSpec{
		launcher: s.launcher,
		cgroups:  s.cgroups,
		cpus:     rt.CPUs,
		netns:    s.netns,
		setup: proto.Setup{
			Lower: lower, Scratch: filepath.Join(s.cfg.StateDir, "scratch"), ScratchBytes: s.cfg.ScratchBytes,
			Hostname: "fn", Workdir: workdir, UID: s.cfg.UID, GID: s.cfg.GID, Seccomp: s.seccomp, Dev: s.devDir(),
			ReadOnly: readOnly, AppArmor: s.apparmor,
		},
	}, img, digests, nil
}

// workdir is where a call's files go and its programs run.
const workdir = "/box"

// hasDirs reports whether every dir exists as a directory (not a symlink)
// under root.
func hasDirs(root string, dirs ...string) bool {
	for _, d := range dirs {
		st, err := os.Lstat(filepath.Join(root, d))
		if err != nil || !st.IsDir() {
			return false
		}
	}
	return true
}

// Runtimes lists the runtimes with their pools.
func (s *Service) Runtimes(ctx context.Context) []api.FnRuntime {
	out := make([]api.FnRuntime, 0, len(s.order))
	for _, name := range s.order {
		st := s.runtimes[name]
		ready, busy := st.pool.stats()
		st.mu.Lock()
		avail, reason, root := st.spec != nil, "", ""
		if avail {
			root = "overlay"
			if st.spec.setup.ReadOnly {
				root = "read-only"
			}
		}
		switch {
		case avail:
		case st.resolving != nil:
			reason = "resolving environment " + st.Env
		case st.err != nil && time.Since(st.tried) < retryResolve:
			reason = st.err.Error()
		default:
			// Never tried, or worth another try: resolve in the
			// background, never in this listing (a status poll).
			reason = "resolving environment " + st.Env
			go s.boxSpec(st)
		}
		st.mu.Unlock()
		out = append(out, api.FnRuntime{
			Name: name, Env: st.Env, Source: st.Source, Compile: st.Compile, Run: slices.Clone(st.Run),
			Available: avail, Reason: reason, Ready: ready, Busy: busy,
			PoolMin: st.pool.cfg.Min, PoolMax: st.pool.cfg.Max, Root: root,
		})
	}
	return out
}
