package apiserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/fleet"
	"github.com/warrenhq/warren/internal/node"
	"github.com/warrenhq/warren/internal/node/nodeapi"
	"github.com/warrenhq/warren/internal/placement"
)

// Fleet is the view of nodes the Router places on and routes by;
// *fleet.Watcher and *fleet.Static implement it.
type Fleet interface {
	placement.Fleet
	// Node returns one node's view; false if it is not registered.
	Node(id string) (fleet.NodeView, bool)
	// Lost reports whether the sandboxes of node id are lost: it is
	// unreachable, or no longer registered.
	Lost(id string) bool
}

var (
	_ Fleet = (*fleet.Watcher)(nil)
	_ Fleet = (*fleet.Static)(nil)
)

// Resolver resolves what a create starts from, so that nodes never read
// the image registry; *image.Registry is one.
type Resolver interface {
	Get(ctx context.Context, name string) (api.Image, error)
	ResolveLayers(ctx context.Context, refs []string) (api.Image, error)
}

// RouterConfig builds a Router. Zero fields take the defaults.
type RouterConfig struct {
	Fleet   Fleet
	Clients *nodeapi.Clients
	// Placement configures the placer; its Fleet is set to Fleet, and its
	// Retryable, if nil, retries refusals (429) and creates that never
	// reached their node.
	Placement placement.Config
	// Images, if set, resolves images for creates; without it nodes must
	// resolve them themselves.
	Images Resolver
	// ImageTTL is how long an image name or layer stack, once resolved,
	// is reused for further creates (default DefaultImageTTL; negative:
	// resolve on every create). ImagesChanged forgets them all.
	ImageTTL time.Duration
	// Known reports whether a node not registered now ever was; its
	// sandboxes are then lost rather than unknown (fleet.Known). Nil: no
	// node that left is known.
	Known func(ctx context.Context, id string) (bool, error)
	// ListTimeout bounds one node's answer to a fanned-out list (default
	// 10 s); a node slower than that is listed from the cache.
	ListTimeout time.Duration
	// Refresh is how often Run reads what changed on every reachable node
	// (node.Changes: the first time a whole list, then what changed
	// since), to keep the cache of what each node holds (what a list shows
	// for a node that stopped answering) and quota usage (Usage) in step
	// with what other apiservers and the nodes themselves did (default 2 s).
	Refresh time.Duration
	// Usage, if set, is quota admission's usage source: every refresh
	// brings each node's figures up to date with its changes, and forgets
	// lost nodes.
	Usage *Usage
	// Defaults are the resources placement counts for a create that leaves
	// CPU or memory out; keep them equal to the nodes' defaults (default 1
	// core, 512Mi).
	Defaults api.Resources
	Log      *slog.Logger
}

// Router is the Cluster of many node agents: it places creates with
// power-of-k choices over the fleet view (retrying on another node when
// one refuses), routes every call on a sandbox to the node its id names,
// fans lists out to every node, and reports the sandboxes of a node that
// stopped answering as lost.
//
// The apiserver keeps no record of sandboxes, so what a lost node held is
// known only from what it last said: the Router caches each node's
// sandboxes from its complete lists (the first refresh, and every
// unfiltered list a caller makes) and the changes it reads every Refresh
// after that (node.Changes), adds the ones it creates and drops the ones
// it deletes. A list shows a lost node's cached sandboxes in state
// "lost" (until their TTL would have ended them); a GET of any sandbox on
// a lost node answers "lost", cached or not. An apiserver that starts
// after a node died has no cache of it: its sandboxes are then reported
// lost by GET only.
type Router struct {
	cfg    RouterConfig
	placer *placement.Placer
	log    *slog.Logger
	images Resolver    // cfg.Images, through cache when there is one
	cache  *imageCache // nil without Images or with a negative ImageTTL

	mu     sync.Mutex
	cached map[string]*nodeCache // node id -> what it last said it holds
	known  map[string]bool       // nodes Known said were in the fleet once
	// unknown holds, until when, the node ids Known said were never in
	// the fleet.
	unknown map[string]time.Time
	synced  map[string]bool         // nodes whose usage Usage holds (refresh only)
	alive   map[string]*aliveSignal // per node, canceled when it turns lost
	// cursors is how far refresh has read each node's changes.
	cursors map[string]nodeCursor

	fn fnLoad // FnCalls in flight and refusals per node (fn.go)
}

type nodeCache struct {
	at        time.Time
	sandboxes map[string]api.Sandbox
}

var (
	_ Cluster   = (*Router)(nil)
	_ LayerUser = (*Router)(nil)
)

// NewRouter returns a Router; Run keeps its cache fresh.
func NewRouter(cfg RouterConfig) (*Router, error) {
	if cfg.Fleet == nil || cfg.Clients == nil {
		return nil, errdefs.Invalid("router: needs a fleet and node clients")
	}
	if cfg.ListTimeout <= 0 {
		cfg.ListTimeout = 10 * time.Second
	}
	if cfg.Refresh <= 0 {
		cfg.Refresh = 2 * time.Second
	}
	if cfg.Defaults.CPU <= 0 {
		cfg.Defaults.CPU = 1
	}
	if cfg.Defaults.Memory <= 0 {
		cfg.Defaults.Memory = 512 << 20
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	pc := cfg.Placement
	pc.Fleet = cfg.Fleet
	if pc.Retryable == nil {
		pc.Retryable = func(err error) bool { return errors.Is(err, errdefs.ErrExhausted) || nodeapi.NotSent(err) }
	}
	p, err := placement.New(pc)
	if err != nil {
		return nil, err
	}
	r := &Router{
		cfg: cfg, placer: p, log: cfg.Log.With("component", "router"), images: cfg.Images,
		cached: map[string]*nodeCache{}, known: map[string]bool{}, synced: map[string]bool{}, unknown: map[string]time.Time{},
		alive: map[string]*aliveSignal{}, cursors: map[string]nodeCursor{},
	}
	if cfg.Images != nil && cfg.ImageTTL >= 0 {
		if cfg.ImageTTL == 0 {
			cfg.ImageTTL = DefaultImageTTL
		}
		r.cache = newImageCache(cfg.Images, cfg.ImageTTL)
		r.images = r.cache
	}
	return r, nil
}

// ImagesChanged forgets the images resolved so far: layers or environments
// changed through this apiserver, and its next creates should see it.
func (r *Router) ImagesChanged() {
	if r.cache != nil {
		r.cache.invalidate()
	}
}

// Image resolves an image as the Router's creates do: through its cache
// when it has one.
func (r *Router) Image(ctx context.Context, name string) (api.Image, error) {
	if r.images == nil {
		return api.Image{}, errdefs.New(errdefs.ErrNotFound, api.CodeImageNotFound, "this apiserver resolves no images")
	}
	return r.images.Get(ctx, name)
}

// Run refreshes what every reachable node holds, at once and then every
// Refresh, and ends the calls in flight to nodes that turn lost, until ctx
// is done. Start it once the fleet view is ready.
func (r *Router) Run(ctx context.Context) error {
	go r.watchLost(ctx)
	t := time.NewTicker(r.cfg.Refresh)
	defer t.Stop()
	for {
		r.refresh(ctx)
		r.expire(time.Now())
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// refresh reads what changed on every reachable node, at most 16 at a
// time, into the cache and quota usage; lost nodes count for no usage.
func (r *Router) refresh(ctx context.Context) {
	nodes := r.cfg.Fleet.Snapshot()
	live := make(map[string]bool, len(nodes))
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for _, v := range nodes {
		if r.cfg.Fleet.Lost(v.ID) {
			continue
		}
		live[v.ID] = true
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			lctx, cancel := context.WithTimeout(ctx, r.cfg.ListTimeout)
			defer cancel()
			changes := func() (node.Changes, error) {
				start := time.Now()
				cur := r.cursorOf(v.ID)
				ch, err := r.cfg.Clients.Node(v.ID, v.Address, v.Secret).Changes(lctx, cur.epoch, cur.rev)
				if err == nil {
					r.update(v.ID, ch, start)
				}
				return ch, err
			}
			if r.cfg.Usage == nil {
				changes()
				return
			}
			if r.cfg.Usage.Update(v.ID, changes) == nil {
				r.mu.Lock()
				r.synced[v.ID] = true
				r.mu.Unlock()
			}
		}()
	}
	wg.Wait()
	r.mu.Lock()
	var gone []string
	for id := range r.synced {
		if !live[id] {
			gone = append(gone, id)
			delete(r.synced, id)
		}
	}
	for id := range r.cursors {
		if !live[id] {
			delete(r.cursors, id)
		}
	}
	r.mu.Unlock()
	if r.cfg.Usage == nil {
		return
	}
	for _, id := range gone {
		r.cfg.Usage.RemoveNode(id)
	}
}

// client returns the node API client of a registered node.
func (r *Router) client(id string) (*nodeapi.Client, error) {
	v, ok := r.cfg.Fleet.Node(id)
	if !ok {
		return nil, errdefs.New(errdefs.ErrUnavailable, api.CodeNodeUnreachable, "node %s is not registered", id)
	}
	return r.cfg.Clients.Node(id, v.Address, v.Secret), nil
}

// Create places the sandbox and creates it on the chosen node, on
// another if that one refuses (429) or cannot be reached.
func (r *Router) Create(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error) {
	switch req.Backend {
	case "", api.BackendFnCall, api.BackendContainer, api.BackendMicroVM, api.BackendVM:
	default:
		// Said here, as a node would: placement would only find no node.
		return api.Sandbox{}, errdefs.Invalid("unknown backend %q", req.Backend)
	}
	if req.Runtime == api.RuntimeRunc {
		// The default: every container node runs it, also one that
		// predates runtimes (and would refuse the field).
		req.Runtime = ""
	}
	var img *api.Image
	if r.images != nil && (req.Image == "") != (len(req.Layers) == 0) {
		// Exactly one of them: resolve here, once for every try. The node
		// validates the rest (and both or neither).
		var im api.Image
		var err error
		if len(req.Layers) > 0 {
			im, err = r.images.ResolveLayers(ctx, req.Layers)
		} else {
			im, err = r.images.Get(ctx, req.Image)
		}
		if err != nil {
			return api.Sandbox{}, err
		}
		img = &im
	}
	res := req.Resources
	if res.CPU <= 0 {
		res.CPU = r.cfg.Defaults.CPU
	}
	if res.Memory <= 0 {
		res.Memory = r.cfg.Defaults.Memory
	}
	preq := placement.Request{Backend: req.Backend, Resources: placement.Demand(res), Labels: req.NodeSelector, Pool: req.Pool,
		Disk: res.Disk > 0, DiskInodes: res.DiskInodes > 0, Network: req.Network.Networked(), Runtime: req.Runtime,
		MergeGroup: req.MemoryMergeGroup}
	if preq.Backend == "" {
		preq.Backend = api.BackendContainer
	}
	preq.Prefer, _ = ctx.Value(preferKey{}).(string)
	var sb api.Sandbox
	_, err := r.placer.Do(ctx, preq, func(ctx context.Context, id string) error {
		c, err := r.client(id)
		if err != nil {
			return err
		}
		if img != nil {
			im := *img
			if v, _ := r.cfg.Fleet.Node(id); !v.LayerPrefetch {
				im.PrefetchTraces = nil // it would refuse them, or has no use for them
			}
			sb, err = c.CreateFrom(ctx, req, im)
		} else {
			sb, err = c.Create(ctx, req)
		}
		if err != nil && errors.Is(err, errdefs.ErrExhausted) {
			r.log.Debug("node refused a create", "node", id, "err", err)
		}
		return err
	})
	if err != nil {
		return api.Sandbox{}, err
	}
	r.remember(sb)
	return sb, nil
}

// preferKey is the context key of withPreferredNode.
type preferKey struct{}

// withPreferredNode asks a Cluster to place the creates made with ctx on
// node id when it can take them, elsewhere only when it cannot: forks go
// where their parent's layers are.
func withPreferredNode(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, preferKey{}, id)
}

// Route returns the node that owns sandbox id.
func (r *Router) Route(ctx context.Context, id string) (Node, error) {
	nid, err := node.NodeOf(id)
	if err != nil {
		return nil, errdefs.New(errdefs.ErrNotFound, api.CodeSandboxNotFound, "sandbox %q not found (malformed id)", id)
	}
	v, registered := r.cfg.Fleet.Node(nid)
	if !r.cfg.Fleet.Lost(nid) {
		if !registered {
			// The view is still being read: nothing is lost yet, but
			// nothing can be routed either.
			return nil, errdefs.New(errdefs.ErrUnavailable, api.CodeNodeUnreachable, "node %s: the fleet view is not ready", nid)
		}
		return &routed{Client: r.cfg.Clients.Node(nid, v.Address, v.Secret), r: r}, nil
	}
	if registered {
		return r.lostNode(nid, fmt.Sprintf("node %s is unreachable (missed %d polls)", nid, v.Missed)), nil
	}
	if r.wasKnown(ctx, nid) {
		return r.lostNode(nid, fmt.Sprintf("node %s left the fleet", nid)), nil
	}
	return nil, errdefs.New(errdefs.ErrNotFound, api.CodeSandboxNotFound, "sandbox %s not found (no node %s)", id, nid)
}

// wasKnown reports whether an unregistered node was ever in the fleet.
// Yes is remembered; no is asked again next time (the node may register).
func (r *Router) wasKnown(ctx context.Context, id string) bool {
	now := time.Now()
	r.mu.Lock()
	known := r.known[id] || r.cached[id] != nil
	askedNo := now.Before(r.unknown[id])
	r.mu.Unlock()
	if known || askedNo || r.cfg.Known == nil {
		return known
	}
	kctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ok, err := r.cfg.Known(kctx, id)
	if err != nil {
		r.log.Warn("cannot tell whether a node was in the fleet", "node", id, "err", err)
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if ok {
		r.known[id] = true
	} else {
		// Ids that name no node cost one store read per unknownTTL, not
		// one per request.
		if len(r.unknown) >= maxUnknown {
			clear(r.unknown)
		}
		r.unknown[id] = now.Add(unknownTTL)
	}
	return ok
}

const (
	unknownTTL = 5 * time.Second
	maxUnknown = 10000
)

// routed is a reachable node's client for the calls on one sandbox. A
// call ends as soon as the fleet view declares the node lost: a node that
// vanished (a cut link, a dead host) often leaves connections hanging
// rather than refused, and the caller should hear "lost" within the
// watcher's few seconds, not a TCP timeout later. It also keeps the cache
// in step with the deletes it routes.
type routed struct {
	*nodeapi.Client
	r *Router
}

// call runs fn with ctx canceled when the node turns lost; lostMidway
// reports whether that is why fn failed.
func (n *routed) call(ctx context.Context, fn func(ctx context.Context) error) (lostMidway bool, err error) {
	nctx := n.r.nodeContext(n.ID())
	cctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(nctx, cancel)
	defer func() { stop(); cancel() }()
	err = fn(cctx)
	return err != nil && nctx.Err() != nil && ctx.Err() == nil, err
}

func (n *routed) lost() lost {
	return lost{r: n.r, node: n.ID(), reason: fmt.Sprintf("node %s became unreachable", n.ID())}
}

func (n *routed) Get(ctx context.Context, id string) (sb api.Sandbox, err error) {
	l, err := n.call(ctx, func(ctx context.Context) error { sb, err = n.Client.Get(ctx, id); return err })
	if l {
		return n.lost().Get(ctx, id)
	}
	return sb, err
}

func (n *routed) Delete(ctx context.Context, id string) error {
	l, err := n.call(ctx, func(ctx context.Context) error { return n.Client.Delete(ctx, id) })
	switch {
	case l:
		return n.lost().err(id)
	case err != nil:
		return err
	}
	n.r.forget(n.ID(), id)
	return nil
}

// Forward forwards a call on one of the node's sandboxes; a node lost
// midway ends it as lost: an error if nothing was written yet, else an
// answer cut short by that error.
func (n *routed) Forward(w http.ResponseWriter, r *http.Request, id string) error {
	l, err := n.call(r.Context(), func(ctx context.Context) error { return n.Client.Forward(w, r.WithContext(ctx)) })
	if !l {
		return err
	}
	var cut *nodeapi.CutShort
	if errors.As(err, &cut) {
		return &nodeapi.CutShort{Err: n.lost().err(id)}
	}
	return n.lost().err(id)
}

// nodeContext returns a context canceled once node id is lost (watchLost
// cancels it); a new one is made after that, for when the node is back.
func (r *Router) nodeContext(id string) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.alive[id]
	if s == nil {
		ctx, cancel := context.WithCancel(context.Background())
		s = &aliveSignal{ctx: ctx, cancel: cancel}
		r.alive[id] = s
	}
	return s.ctx
}

type aliveSignal struct {
	ctx    context.Context
	cancel context.CancelFunc
}

// lostCheck is how often watchLost looks for nodes that turned lost.
const lostCheck = 50 * time.Millisecond

// watchLost cancels the calls in flight to nodes that turn lost.
func (r *Router) watchLost(ctx context.Context) {
	t := time.NewTicker(lostCheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.mu.Lock()
		for id, s := range r.alive {
			if r.cfg.Fleet.Lost(id) {
				s.cancel()
				delete(r.alive, id)
			}
		}
		r.mu.Unlock()
	}
}

// remember adds a sandbox just created to its node's cache.
func (r *Router) remember(sb api.Sandbox) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.cached[sb.Node]
	if c == nil {
		c = &nodeCache{sandboxes: map[string]api.Sandbox{}}
		r.cached[sb.Node] = c
	}
	c.sandboxes[sb.ID] = slim(sb)
}

func (r *Router) forget(nodeID, id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c := r.cached[nodeID]; c != nil {
		delete(c.sandboxes, id)
	}
}

// slim is what the cache keeps of a sandbox: everything but its env,
// which can be large and is not needed to list or route it.
func slim(sb api.Sandbox) api.Sandbox {
	sb.Env = nil
	return sb
}

// nodeCursor is a point in a node's changes (node.Changes).
type nodeCursor struct {
	epoch string
	rev   uint64
}

func (r *Router) cursorOf(nodeID string) nodeCursor {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cursors[nodeID]
}

// update applies a node's changes to its cache and moves its cursor.
func (r *Router) update(nodeID string, ch node.Changes, at time.Time) {
	if ch.Full {
		r.store(nodeID, ch.Sandboxes, at)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cursors[nodeID] = nodeCursor{epoch: ch.Epoch, rev: ch.Rev}
	if ch.Full {
		return
	}
	c := r.cached[nodeID]
	if c == nil {
		c = &nodeCache{sandboxes: map[string]api.Sandbox{}}
		r.cached[nodeID] = c
	}
	c.at = at
	for _, sb := range ch.Sandboxes {
		c.sandboxes[sb.ID] = slim(sb)
	}
	for _, id := range ch.Deleted {
		delete(c.sandboxes, id)
	}
}

// store replaces a node's cache with a complete list.
func (r *Router) store(nodeID string, list []api.Sandbox, at time.Time) {
	c := &nodeCache{at: at, sandboxes: make(map[string]api.Sandbox, len(list))}
	for _, sb := range list {
		c.sandboxes[sb.ID] = slim(sb)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if old := r.cached[nodeID]; old != nil {
		// Creates that answered after the list started are not in it.
		for id, sb := range old.sandboxes {
			if _, ok := c.sandboxes[id]; !ok && sb.CreatedAt.After(at.Add(-r.cfg.ListTimeout)) {
				c.sandboxes[id] = sb
			}
		}
	}
	r.cached[nodeID] = c
}

// expire drops cached sandboxes whose TTL has ended (their node, if it
// comes back, reaps them), and nodes left with none that are not
// registered.
func (r *Router) expire(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for nid, c := range r.cached {
		for id, sb := range c.sandboxes {
			if sb.ExpiresAt != nil && now.After(*sb.ExpiresAt) {
				delete(c.sandboxes, id)
			}
		}
		if _, ok := r.cfg.Fleet.Node(nid); !ok && len(c.sandboxes) == 0 {
			delete(r.cached, nid)
			r.known[nid] = true // it was here: its ids are lost, not unknown
		}
	}
}

// cachedList returns a node's cached sandboxes that match f, marked lost
// with reason if it is not empty; ok is false if nothing is cached.
func (r *Router) cachedList(nodeID string, f node.Filter, reason string) (list []api.Sandbox, ok bool) {
	r.mu.Lock()
	c := r.cached[nodeID]
	if c == nil {
		r.mu.Unlock()
		return nil, false
	}
	all := make([]api.Sandbox, 0, len(c.sandboxes))
	for _, sb := range c.sandboxes {
		all = append(all, sb)
	}
	r.mu.Unlock()
	for _, sb := range all {
		if reason != "" {
			sb.State, sb.Reason = api.StateLost, reason
		}
		if f.Match(sb) {
			sb.Labels = maps.Clone(sb.Labels)
			list = append(list, sb)
		}
	}
	return list, true
}

func (r *Router) cachedSandbox(nodeID, id string) (api.Sandbox, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c := r.cached[nodeID]; c != nil {
		sb, ok := c.sandboxes[id]
		return sb, ok
	}
	return api.Sandbox{}, false
}

// List fans the list out to every registered node, at most 32 at a time;
// lost nodes are listed from the cache.
func (r *Router) List(ctx context.Context, f node.Filter) ([]api.Sandbox, error) {
	list, _ := r.list(ctx, f, false)
	return list, nil
}

// LiveLayers implements LayerUser: it fails when a node's sandboxes are
// not known for sure (a node that did not answer and has no cache).
func (r *Router) LiveLayers(ctx context.Context) (map[string][]string, error) {
	list, err := r.list(ctx, node.Filter{}, true)
	if err != nil {
		return nil, err
	}
	live := map[string][]string{}
	for _, sb := range list {
		for _, d := range sb.Layers {
			live[d] = append(live[d], sb.ID)
		}
	}
	return live, nil
}

// list is List; with strict, a node whose sandboxes are unknown (it did
// not answer and nothing is cached) is an ErrUnavailable.
func (r *Router) list(ctx context.Context, f node.Filter, strict bool) ([]api.Sandbox, error) {
	nodes := r.cfg.Fleet.Snapshot()
	results := make([][]api.Sandbox, len(nodes))
	var unknown []string
	var mu sync.Mutex
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	for i, v := range nodes {
		if r.cfg.Fleet.Lost(v.ID) {
			l, ok := r.cachedList(v.ID, f, fmt.Sprintf("node %s is unreachable", v.ID))
			if !ok {
				mu.Lock()
				unknown = append(unknown, v.ID)
				mu.Unlock()
			}
			results[i] = l
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			lctx, cancel := context.WithTimeout(ctx, r.cfg.ListTimeout)
			defer cancel()
			start := time.Now()
			l, err := r.cfg.Clients.Node(v.ID, v.Address, v.Secret).List(lctx, f)
			if err == nil {
				if f.State == "" && len(f.Labels) == 0 {
					r.store(v.ID, l, start)
				}
				results[i] = l
				return
			}
			if ctx.Err() != nil {
				return
			}
			// Not lost yet (the watcher decides that within a few polls):
			// show what it last said, as it said it.
			r.log.Warn("node did not answer a list; showing its cached sandboxes", "node", v.ID, "err", err)
			l, ok := r.cachedList(v.ID, f, "")
			if !ok {
				mu.Lock()
				unknown = append(unknown, v.ID)
				mu.Unlock()
			}
			results[i] = l
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// Nodes that left the fleet but whose sandboxes are cached: lost.
	registered := make(map[string]bool, len(nodes))
	for _, v := range nodes {
		registered[v.ID] = true
	}
	r.mu.Lock()
	var gone []string
	for nid := range r.cached {
		if !registered[nid] {
			gone = append(gone, nid)
		}
	}
	r.mu.Unlock()
	var out []api.Sandbox
	for _, nid := range gone {
		l, _ := r.cachedList(nid, f, fmt.Sprintf("node %s left the fleet", nid))
		out = append(out, l...)
	}
	for _, l := range results {
		out = append(out, l...)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	if out == nil {
		out = []api.Sandbox{}
	}
	if strict && len(unknown) > 0 {
		sort.Strings(unknown)
		return out, errdefs.Unavailable("the sandboxes of nodes %v are not known: they did not answer", unknown)
	}
	return out, nil
}

// Nodes returns every registered node as the fleet sees it.
func (r *Router) Nodes(ctx context.Context) ([]api.Node, error) {
	nodes := r.cfg.Fleet.Snapshot()
	out := make([]api.Node, 0, len(nodes))
	for _, v := range nodes {
		n := v.Node
		n.Problems = append([]string(nil), n.Problems...)
		switch {
		case v.Unreachable:
			last := "never"
			if !v.LastPoll.IsZero() {
				last = v.LastPoll.UTC().Format(time.RFC3339)
			}
			n.Problems = append(n.Problems, fmt.Sprintf("unreachable: missed %d polls, last answer %s", v.Missed, last))
		case !v.Polled:
			n.Problems = append(n.Problems, "not polled yet")
		}
		out = append(out, n)
	}
	return out, nil
}

// lostNode answers for the sandboxes of a lost node.
func (r *Router) lostNode(nodeID, reason string) Node {
	return lost{r: r, node: nodeID, reason: reason}
}

type lost struct {
	r      *Router
	node   string
	reason string
}

func (l lost) err(id string) error {
	return &errdefs.Error{Kind: errdefs.ErrUnavailable, Code: api.CodeSandboxLost, RetryAfter: 5 * time.Second,
		Msg: fmt.Sprintf("sandbox %s is lost: %s", id, l.reason)}
}

func (l lost) ID() string { return l.node }

func (l lost) Create(context.Context, api.CreateSandboxRequest) (api.Sandbox, error) {
	return api.Sandbox{}, errdefs.Unavailable("node %s is lost: %s", l.node, l.reason)
}

// Get answers the sandbox as last seen, in state lost.
func (l lost) Get(_ context.Context, id string) (api.Sandbox, error) {
	sb, ok := l.r.cachedSandbox(l.node, id)
	if !ok {
		sb = api.Sandbox{ID: id, Node: l.node}
	}
	sb.State, sb.Reason = api.StateLost, l.reason
	return sb, nil
}

func (l lost) List(ctx context.Context, f node.Filter) ([]api.Sandbox, error) {
	list, _ := l.r.cachedList(l.node, f, l.reason)
	return list, nil
}

func (l lost) Delete(_ context.Context, id string) error { return l.err(id) }

func (l lost) Forward(_ http.ResponseWriter, _ *http.Request, id string) error { return l.err(id) }
