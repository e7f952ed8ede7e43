package node

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/qemu"
)

// sandbox is the agent's live view of one sandbox.
type sandbox struct {
	backend backend.Backend
	spec    backend.Spec

	log *changeLog // the agent's

	mu       sync.Mutex
	view     api.Sandbox // State, Reason and LastUsedAt change; the rest is fixed
	rev      uint64      // of the view's last change (changes.go)
	deleting bool
	cancel   context.CancelFunc // stops the watcher
	// netMu serialises network policy changes (network.go).
	netMu sync.Mutex
	// calls counts the calls in flight (execs, file transfers): the idle
	// reaper leaves a sandbox with any alone (reaper.go).
	calls int
	// pauseMu serialises pauses and resumes (pause.go); held stands for
	// what the sandbox holds of the node's reservation: its resources,
	// or while paused its memory at its paused size. Guarded by
	// Agent.mu.
	// reclaimedAt is when its memory was last reclaimed as idle
	// (reclaim.go). Guarded by mu.
	reclaimedAt time.Time
	pauseMu     sync.Mutex
	held        api.Resources
	heldPaused  bool
	// ends counts the times the platform set out to end the sandbox, and
	// endReason says why the last time: a call that saw ends change
	// while it ran answers sandbox_gone with the reason, not whatever the
	// destroyed sandbox made of it (an exit 137).
	ends      uint64
	endReason string
}

func (s *sandbox) snapshot() api.Sandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.view
	v.Labels = maps.Clone(v.Labels)
	v.Env = maps.Clone(v.Env)
	v.Layers = slices.Clone(v.Layers)
	if v.Network != nil {
		n := *v.Network
		n.Allow = slices.Clone(n.Allow)
		v.Network = &n
	}
	return v
}

func (s *sandbox) setState(state, reason string) {
	s.mu.Lock()
	s.view.State, s.view.Reason = state, reason
	s.changed()
	s.mu.Unlock()
}

// minMemory is the least memory a sandbox may ask for: runc's init is
// charged to the sandbox's cgroup while it sets the sandbox up, and under
// 16 MiB runc sometimes fails to set the limit below what it already uses
// (bench/density saw it at 8 MiB).
const minMemory = 16 << 20

// validate checks a create request and fills in defaults. Every error is
// ErrInvalid.
func (a *Agent) validate(req *api.CreateSandboxRequest) error {
	if err := api.CheckCreate(req); err != nil {
		return errdefs.Request(err)
	}
	if _, err := a.checkNetwork(req); err != nil {
		return err
	}
	d := a.cfg.Defaults
	if req.Backend == "" {
		req.Backend = api.BackendContainer
	}
	switch {
	case req.Image != "" && len(req.Layers) > 0:
		return errdefs.Invalid("give image or layers, not both")
	case strings.TrimSpace(req.Image) == "" && len(req.Layers) == 0:
		return errdefs.Invalid("image is required")
	}
	switch req.QoS {
	case "":
		req.QoS = api.QoSLatency
	case api.QoSLatency, api.QoSBestEffort:
	default:
		return errdefs.Invalid("qos %q: want %s or %s", req.QoS, api.QoSLatency, api.QoSBestEffort)
	}
	r := &req.Resources
	switch {
	case math.IsNaN(r.CPU) || r.CPU < 0:
		return errdefs.Invalid("resources.cpu %v: must be positive", r.CPU)
	case r.CPU == 0:
		r.CPU = d.CPU
	case r.CPU < 0.01:
		return errdefs.Invalid("resources.cpu %v: at least 0.01 cores", r.CPU)
	case r.CPU > a.cfg.Limits.Cores:
		return errdefs.Invalid("resources.cpu %v: more than the node's %v cores", r.CPU, a.cfg.Limits.Cores)
	}
	switch {
	case r.Memory == 0:
		r.Memory = api.Quantity(d.Memory)
	case r.Memory < minMemory:
		return errdefs.Invalid("resources.memory %v: at least %v (runc's own init is charged to the sandbox while it starts it)", r.Memory, api.Quantity(minMemory))
	case int64(r.Memory) > min(a.cfg.Limits.Memory, a.memTotal):
		return errdefs.Invalid("resources.memory %v: more than the node's %v", r.Memory, api.Quantity(min(a.cfg.Limits.Memory, a.memTotal)))
	}
	switch {
	case r.PIDs == 0:
		r.PIDs = d.PIDs
	case r.PIDs < 8 || r.PIDs > 1<<22:
		return errdefs.Invalid("resources.pids %d: want 8..4194304", r.PIDs)
	}
	switch {
	case req.TTL == 0:
		req.TTL = api.Duration(d.TTL)
	case req.TTL.D() < time.Second || req.TTL.D() > d.MaxTTL:
		return errdefs.Invalid("ttl %v: want 1s..%v", req.TTL, d.MaxTTL)
	}
	if req.IdleTimeout != 0 && req.IdleTimeout.D() < time.Second {
		return errdefs.Invalid("idle_timeout %v: at least 1s", req.IdleTimeout)
	}
	if req.AutoPause != 0 && req.AutoPause.D() < time.Second {
		return errdefs.Invalid("auto_pause %v: at least 1s", req.AutoPause)
	}
	for k := range req.Env {
		if !api.ValidEnvName(k) {
			return errdefs.Invalid("env %q: not a valid variable name", k)
		}
	}
	return nil
}

// placeable checks a create's pool and node_selector against this node:
// ErrUnavailable with code api.CodeNoMatchingNode (503) naming the
// constraint it fails, as placement would have answered.
func (a *Agent) placeable(req *api.CreateSandboxRequest) error {
	if req.Pool != "" && req.Pool != a.cfg.Pool {
		return errdefs.New(errdefs.ErrUnavailable, api.CodeNoMatchingNode,
			"no node matches pool %s (node %s is in pool %s)", req.Pool, a.cfg.ID, a.cfg.Pool)
	}
	keys := slices.Sorted(maps.Keys(req.NodeSelector))
	for _, k := range keys {
		want := req.NodeSelector[k]
		have, ok := a.cfg.Labels[k]
		switch {
		case !ok:
			return errdefs.New(errdefs.ErrUnavailable, api.CodeNoMatchingNode,
				"no node matches node_selector %s=%s (node %s lacks label %s)", k, want, a.cfg.ID, k)
		case have != want:
			return errdefs.New(errdefs.ErrUnavailable, api.CodeNoMatchingNode,
				"no node matches node_selector %s=%s (node %s has %s=%s)", k, want, a.cfg.ID, k, have)
		}
	}
	return nil
}

// admit reserves room for one sandbox or refuses with ErrExhausted
// (429 node_full, saying which limit): what sandboxes ask for must fit the
// overcommitted capacity (Limits), and what they use must leave the
// host's reserve alone (use.go): the memory in use, plus what recent
// creates may still grow into, plus this one's expected growth, within
// the host's memory less Limits.Reserve (plus swap where there is any);
// and for a latency sandbox the cores busy outside the best-effort class
// under Limits.CPUBusy of the node's.
func (a *Agent) admit(r api.Resources, class, mergeGroup string) error {
	now := time.Now()
	cpu, _, cpuOK, mem := a.meter.read()
	a.mu.Lock()
	defer a.mu.Unlock()
	l := a.cfg.Limits
	if a.shuttingDown {
		return errdefs.Unavailable("node %s is shutting down and ending its sandboxes", a.cfg.ID)
	}
	a.recent.expire(now)
	grow := min(int64(r.Memory), l.CreateGrowth)
	inUse := mem.used() + mem.SwapTotal - mem.SwapFree
	var why string
	switch {
	case a.inflight >= l.CreatesInFlight:
		why = fmt.Sprintf("%d creates in flight", a.inflight)
	case a.reserved.sandboxes+1 > l.Sandboxes:
		why = fmt.Sprintf("%d sandboxes, the node's limit", a.reserved.sandboxes)
	case a.reserved.cpu+r.CPU > l.CPU+1e-9:
		why = fmt.Sprintf("cpu %s of %s cores reserved (%gx overcommit)", fmtCores(a.reserved.cpu), fmtCores(l.CPU), l.CPUOvercommit)
	case a.reserved.memory+int64(r.Memory) > l.Memory:
		why = fmt.Sprintf("memory %v of %v reserved", api.Quantity(a.reserved.memory), api.Quantity(l.Memory))
	case mem.Total > 0 && inUse+a.recent.total+grow > mem.Total-l.Reserve+mem.SwapTotal:
		why = fmt.Sprintf("memory in use %v, %v held for recent creates, of %v (the host's less a reserve of %v)",
			api.Quantity(inUse), api.Quantity(a.recent.total), api.Quantity(mem.Total-l.Reserve+mem.SwapTotal), api.Quantity(l.Reserve))
	case class != api.QoSBestEffort && cpuOK && cpu > l.CPUBusy*l.Cores:
		why = fmt.Sprintf("cpu %s of %s cores busy (latency work may keep %g%% busy)", fmtCores(cpu), fmtCores(l.Cores), 100*l.CPUBusy)
	default:
		why = a.mergeConflict(mergeGroup) // merge.go
	}
	if why != "" {
		return errdefs.Exhausted(api.CodeNodeFull, 2*time.Second, "node %s is full: %s", a.cfg.ID, why)
	}
	a.joinMerge(mergeGroup)
	a.inflight++
	a.reserved.add(r, 1)
	a.recent.add(now, grow)
	return nil
}

// fmtCores prints a number of cores to two decimals at most ("8",
// "7.25"), not a float sum's noise ("7.999999999999917").
func fmtCores(c float64) string { return strconv.FormatFloat(math.Round(c*100)/100, 'f', -1, 64) }

func (u *usage) add(r api.Resources, sign int) {
	u.cpu += float64(sign) * r.CPU
	u.memory += int64(sign) * int64(r.Memory)
	u.sandboxes += sign
}

// Create admits, prepares and starts a sandbox, and returns it running.
func (a *Agent) Create(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error) {
	return a.createFrom(ctx, req, nil)
}

// CreateFrom is Create with the image already resolved (by an apiserver
// that reads the image registry), so that the node itself never does:
// img must be what req.Image or req.Layers resolve to.
func (a *Agent) CreateFrom(ctx context.Context, req api.CreateSandboxRequest, img api.Image) (api.Sandbox, error) {
	return a.createFrom(ctx, req, &img)
}

func (a *Agent) createFrom(ctx context.Context, req api.CreateSandboxRequest, resolved *api.Image) (api.Sandbox, error) {
	if err := a.validate(&req); err != nil {
		return api.Sandbox{}, err
	}
	if err := a.placeable(&req); err != nil {
		return api.Sandbox{}, err
	}
	b, ok := a.backends[req.Backend]
	if !ok {
		if a.knownBackend(req.Backend) {
			return api.Sandbox{}, errdefs.New(errdefs.ErrUnavailable, api.CodeBackendUnavailable,
				"backend %q is not available on node %s", req.Backend, a.cfg.ID)
		}
		return api.Sandbox{}, errdefs.Invalid("unknown backend %q", req.Backend)
	}
	rt, specRT, err := a.runtime(b, req.Runtime) // runtime.go
	if err != nil {
		return api.Sandbox{}, err
	}
	req.Runtime = rt
	if err := a.diskLimits(b, &req.Resources); err != nil {
		return api.Sandbox{}, err
	}
	if req.QoS == api.QoSBestEffort && !b.Capabilities().QoS {
		return api.Sandbox{}, errdefs.New(errdefs.ErrInvalid, api.CodeNotSupported, "backend %s runs no best-effort sandboxes", b.Name())
	}
	if _, ok := b.(backend.NetNSer); !ok && req.Network.Networked() {
		return api.Sandbox{}, errdefs.New(errdefs.ErrInvalid, api.CodeNotSupported, "backend %s gives sandboxes no network", b.Name())
	}
	var img api.Image
	if resolved != nil {
		img = *resolved
	} else if img, err = a.resolve(ctx, req); err != nil {
		return api.Sandbox{}, err
	}
	req.MemoryMergeGroup = a.mergeGroupOf(b, &req) // merge.go: "" where it cannot merge
	if err := a.admit(req.Resources, req.QoS, req.MemoryMergeGroup); err != nil {
		return api.Sandbox{}, err
	}
	if req.MemoryMergeGroup != "" {
		if err := a.startKSM(); err != nil {
			a.log.Warn("memory merging: KSM stays off", "err", err)
		}
	}
	sb, err := a.create(ctx, b, req, img, specRT)
	a.mu.Lock()
	a.inflight--
	if err != nil {
		a.reserved.add(req.Resources, -1)
		a.leaveMerge(req.MemoryMergeGroup)
	}
	a.mu.Unlock()
	return sb, err
}

// resolve returns the image a create asks for: an environment by name, or
// an explicit layer stack.
func (a *Agent) resolve(ctx context.Context, req api.CreateSandboxRequest) (api.Image, error) {
	if a.cfg.Images == nil {
		return api.Image{}, errdefs.Unavailable("node %s resolves no images: its apiserver must send them resolved", a.cfg.ID)
	}
	if len(req.Layers) == 0 {
		return a.cfg.Images.Get(ctx, req.Image)
	}
	lr, ok := a.cfg.Images.(LayerResolver)
	if !ok {
		return api.Image{}, errdefs.Invalid("this node cannot start sandboxes from a layer list")
	}
	return lr.ResolveLayers(ctx, req.Layers)
}

func (a *Agent) knownBackend(name string) bool {
	switch name {
	case api.BackendFnCall, api.BackendContainer, api.BackendMicroVM, api.BackendVM:
		return true
	}
	return false
}

// create makes the sandbox req asks for, req.Runtime being the runtime
// it runs under and specRuntime its backend.Spec's.
func (a *Agent) create(ctx context.Context, b backend.Backend, req api.CreateSandboxRequest, img api.Image, specRuntime string) (api.Sandbox, error) {
	layers := make([]backend.Layer, 0, len(img.Layers))
	traced, _ := a.cfg.Layers.(TracedLayers)
	for _, d := range img.Layers {
		var l backend.Layer
		var err error
		if t := img.PrefetchTraces[d]; t != "" && traced != nil {
			l, err = traced.FetchTraced(ctx, d, t)
		} else {
			l, err = a.cfg.Layers.Fetch(ctx, d)
		}
		if err != nil {
			return api.Sandbox{}, fmt.Errorf("image %s: layer %s: %w", img.Name, d, err)
		}
		if b.Name() != api.BackendVM && qemu.IsDiskImage(l.Path) {
			return api.Sandbox{}, errdefs.Invalid("image %s is a disk image: it boots whole, with --backend vm", img.Name)
		}
		layers = append(layers, l)
	}
	now := time.Now().UTC()
	id := a.newID()
	// The image's env is the default; the request's wins.
	env := req.Env
	if len(img.Env) > 0 {
		env = maps.Clone(img.Env)
		maps.Copy(env, req.Env)
	}
	view := api.Sandbox{
		ID:               id,
		Node:             a.cfg.ID,
		Project:          req.Project,
		Build:            req.Build != nil && *req.Build,
		Backend:          b.Name(),
		Runtime:          req.Runtime,
		Image:            img.Name,
		State:            api.StateCreating,
		Resources:        req.Resources,
		QoS:              req.QoS,
		MemoryMergeGroup: req.MemoryMergeGroup,
		Env:              env,
		Labels:           req.Labels,
		Layers:           append([]string(nil), img.Layers...),
		Workdir:          img.Workdir,
		User:             img.User,
		TTL:              req.TTL,
		IdleTimeout:      req.IdleTimeout,
		AutoPause:        req.AutoPause,
		TTLWhilePaused:   req.TTLWhilePaused,
		CreatedAt:        now,
		LastUsedAt:       now,
	}
	exp := now.Add(req.TTL.D())
	view.ExpiresAt = &exp
	spec := backend.Spec{
		ID:      id,
		Layers:  layers,
		Env:     envList(env),
		Workdir: img.Workdir,
		Resources: backend.Resources{
			CPU:        req.Resources.CPU,
			Memory:     int64(req.Resources.Memory),
			PIDs:       req.Resources.PIDs,
			Disk:       int64(req.Resources.Disk),
			DiskInodes: req.Resources.DiskInodes,
		},
		Runtime:     specRuntime,
		BestEffort:  req.QoS == api.QoSBestEffort,
		MemoryMerge: req.MemoryMergeGroup != "",
	}
	if a.cfg.Network != nil {
		spec.DNS = []string{a.cfg.Network.DNS()}
	}
	pol, err := a.checkNetwork(&req)
	if err != nil {
		return api.Sandbox{}, err
	}
	// The record goes to disk first, so that a crash in the middle leaves
	// something recovery can find and clean up.
	if err := a.writeRecord(record{Sandbox: view, Spec: spec}); err != nil {
		return api.Sandbox{}, err
	}
	fail := func(err error) (api.Sandbox, error) {
		// Cleanup must run even if the caller went away.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if a.cfg.Network != nil {
			if derr := a.cfg.Network.Detach(id); derr != nil {
				a.log.Error("network cleanup after failed create", "sandbox", id, "err", derr)
			}
		}
		if derr := b.Destroy(cctx, id); derr != nil {
			a.log.Error("cleanup after failed create", "sandbox", id, "err", derr)
		}
		a.removeRecord(id)
		return api.Sandbox{}, err
	}
	t0 := time.Now()
	if err := b.Create(ctx, spec); err != nil {
		return fail(fmt.Errorf("create sandbox: %w", err))
	}
	t1 := time.Now()
	if err := b.Start(ctx, id); err != nil {
		return fail(fmt.Errorf("start sandbox: %w", err))
	}
	if pol.Networked() {
		n, err := a.attach(ctx, b.(backend.NetNSer), id, pol, netip.Addr{})
		if err != nil {
			return fail(fmt.Errorf("sandbox network: %w", err))
		}
		view.Network = n
	}
	t2 := time.Now()
	view.State = api.StateRunning
	if err := a.writeRecord(record{Sandbox: view, Spec: spec}); err != nil {
		return fail(err)
	}
	s := &sandbox{backend: b, spec: spec, view: view, log: &a.changes, held: view.Resources}
	a.mu.Lock()
	s.rev = a.changes.next()
	a.sandboxes[id] = s
	if spec.BestEffort {
		a.bestEffort++
	}
	a.mu.Unlock()
	a.watch(s)
	a.log.Info("sandbox created", "sandbox", id, "image", img.Name, "backend", b.Name(),
		"prepare", t0.Sub(now).Round(time.Microsecond), "create", t1.Sub(t0).Round(time.Microsecond),
		"start", t2.Sub(t1).Round(time.Microsecond), "total", time.Since(now).Round(time.Microsecond))
	return s.snapshot(), nil
}

func envList(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// watch waits for the sandbox's init to exit on its own and marks it failed.
func (a *Agent) watch(s *sandbox) {
	// One goroutine per sandbox, ended by a delete (cancel) or by Close
	// (closing, the parent).
	ctx, cancel := context.WithCancel(a.closing)
	s.mu.Lock()
	s.cancel = cancel
	s.mu.Unlock()
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		defer cancel()
		st, err := s.backend.Wait(ctx, s.spec.ID)
		if ctx.Err() != nil {
			return // deleted, or the agent is closing
		}
		s.mu.Lock()
		deleting := s.deleting
		s.mu.Unlock()
		if deleting {
			return
		}
		reason := fmt.Sprintf("sandbox init exited with code %d", st.ExitCode)
		if err != nil {
			reason = fmt.Sprintf("lost track of sandbox: %v", err)
		}
		a.log.Warn("sandbox died", "sandbox", s.spec.ID, "reason", reason)
		s.setState(api.StateFailed, reason)
		a.persist(s)
	}()
}

// Get returns one sandbox.
func (a *Agent) Get(ctx context.Context, id string) (api.Sandbox, error) {
	s, err := a.lookup(id)
	if err != nil {
		return api.Sandbox{}, err
	}
	v := s.snapshot()
	if v.Network != nil {
		n := a.networkStatus(v)
		v.Network = &n
	}
	return v, nil
}

// Filter selects sandboxes in List. Zero fields match everything.
type Filter struct {
	Labels map[string]string // all must match
	State  string
}

// Match reports whether sb passes the filter.
func (f Filter) Match(sb api.Sandbox) bool {
	if f.State != "" && sb.State != f.State {
		return false
	}
	for k, want := range f.Labels {
		if got, ok := sb.Labels[k]; !ok || got != want {
			return false
		}
	}
	return true
}

// List returns the node's sandboxes that match f, oldest first.
func (a *Agent) List(ctx context.Context, f Filter) ([]api.Sandbox, error) {
	a.mu.Lock()
	all := make([]*sandbox, 0, len(a.sandboxes))
	for _, s := range a.sandboxes {
		all = append(all, s)
	}
	a.mu.Unlock()
	out := []api.Sandbox{}
	for _, s := range all {
		if v := s.snapshot(); f.Match(v) {
			out = append(out, v)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

// Delete destroys a sandbox and everything it holds. Deleting an unknown
// or already deleted sandbox succeeds: callers may retry freely. Calls in
// flight on it answer sandbox_gone ("deleted").
func (a *Agent) Delete(ctx context.Context, id string) error {
	s, err := a.lookup(id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	_, err = a.end(ctx, s, func(*sandbox) string { return endDeleted })
	return err
}
