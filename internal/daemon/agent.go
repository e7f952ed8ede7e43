package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/client"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/backend/container"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/fleet"
	"github.com/warrenhq/warren/internal/fncall"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/node"
	"github.com/warrenhq/warren/internal/node/nodeapi"
	"github.com/warrenhq/warren/internal/store"
	"github.com/warrenhq/warren/internal/swap"
)

// AgentConfig configures `warren agent`: one node agent that serves the
// node API and registers itself in the fleet, through etcd (Etcd) or
// through an apiserver (APIServer).
type AgentConfig struct {
	// DataDir holds the node's state: its id, sandbox records, the
	// container backend's state, runc's root, the layer cache and mounts.
	// Agents on one host need distinct data dirs and nothing else: the
	// node id (from the data dir) also names the cgroup parent
	// /warren/<node id>.
	DataDir string
	// Listen is the node API's address; Advertise is the address
	// apiservers dial (default: Listen, with an unspecified host replaced
	// by this host's address towards the control plane).
	Listen, Advertise string
	// Etcd or APIServers: where the node registers (any apiserver of the
	// list serves, the first that answers is used).
	Etcd       []string
	APIServers []string
	// Token is the node token: an IAM token of role node (`warren token
	// create --role node`, or the first apiserver's <data-dir>/node-token).
	// The agent registers with it, through an apiserver or in etcd (where
	// the agent checks it itself); a revoked token ends the registration.
	// It never opens the node API: that takes a secret the agent draws at
	// every start and registers with the node (fleet.Registration).
	Token string
	// NodeName names the node in the cluster (default: the name the node
	// token is bound to, if any). A bound token registers only its name.
	NodeName string
	// TLS: the node API serves TLS with TLS.Cert and TLS.Key (and the node
	// registers an https address); TLS.CA verifies an https apiserver.
	TLS TLSConfig
	// Pool is api.PoolOnPrem (default) or api.PoolCloud; Labels are
	// matched by placement.
	Pool   string
	Labels map[string]string
	// Blobs is the blob store every node and apiserver share (blob.Open:
	// a directory on a filesystem they all mount, or s3://bucket/prefix).
	// Default <DataDir>/blobs.
	Blobs  string
	Limits node.Limits
	// DefaultDisk limits the writable layer of a sandbox that asks for no
	// disk limit (0: none); Agent fails if no backend can enforce it.
	DefaultDisk int64
	// ReclaimIdle: a sandbox without a call for this long has its memory
	// reclaimed (node.Config.ReclaimIdle); 0 takes DefaultReclaimIdle,
	// negative turns it off.
	ReclaimIdle time.Duration
	// NoMemoryMerge: never merge sandboxes' memory, whatever their
	// project says (node.Config.NoMemoryMerge).
	NoMemoryMerge bool
	// Swap, if set, gives the host a zram swap device of that many bytes
	// when it has no swap at all, so that pausing a sandbox pushes out
	// its anonymous memory too (package swap). It stays when the agent
	// stops: paused sandboxes' memory is in it.
	Swap int64
	// Backend is "container", the default and the only backend a
	// production build has besides the machines (Machines).
	Backend string
	// Machines configures the microvm backend (not on a simulated node).
	Machines MachineConfig
	// Layers says how the node loads layers (eager or lazy).
	Layers LayersConfig
	// Simulated, if set, makes the node's backend instead of the
	// container backend (its argument is a directory for its state): a
	// program that simulates nodes (tests, bench/controlplane) passes
	// the fake backend here, standing in as "container", and the node
	// then runs no FnCall. The warren binary sets it only when built with
	// -tags warrenfake (`warren agent --backend fake`): the fake isolates
	// nothing, so a production build does not contain it.
	Simulated func(dir string) (backend.Backend, error)
	// StopSandboxes ends every sandbox of the node when the agent stops;
	// by default they keep running, for the next agent on the data dir
	// to re-adopt.
	StopSandboxes bool
	// Fn configures FnCall on this node.
	Fn FnConfig
	// Network is the sandboxes' network (none on a simulated node).
	Network NetworkConfig
	// RegistrationTTL is how long the registration outlives the agent
	// (default fleet.DefaultTTL).
	RegistrationTTL time.Duration
	Log             *slog.Logger
	// Ready, if set, is called once the node API serves and the node is
	// registered for the first time, with the node API's address.
	Ready func(addr string)
}

// Agent runs a node agent until ctx ends. Sandboxes outlive it (unless
// StopSandboxes): a later Agent on the same data dir re-adopts them; a
// restart within the registration TTL is not even noticed as a lost node.
func Agent(ctx context.Context, cfg AgentConfig) error {
	log := cfg.Log
	if log == nil {
		log = slog.Default()
	}
	if cfg.Token == "" {
		return errdefs.Invalid("agent: a node token is required (--token)")
	}
	if (len(cfg.Etcd) == 0) == (len(cfg.APIServers) == 0) {
		return errdefs.Invalid("agent: give --etcd or --apiserver (one of them)")
	}
	if cfg.NodeName != "" {
		if err := iam.ValidNodeName(cfg.NodeName); err != nil {
			return err
		}
	}
	tlsClient, err := cfg.TLS.client()
	if err != nil {
		return err
	}
	dir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	start := time.Now()
	nodeID, err := loadOrCreate(filepath.Join(dir, "node-id"), func() string { return "n" + randomHex(4) })
	if err != nil {
		return err
	}
	// The node key proves this is the agent that registered the node
	// (fleet.Claim): it stays in the data dir across restarts.
	nodeKey, err := loadOrCreate(filepath.Join(dir, "node-key"), func() string { return randomHex(32) })
	if err != nil {
		return err
	}

	blobs, err := openBlobs(ctx, cfg.Blobs, dir) // images.go
	if err != nil {
		return err
	}
	nodeDir, err := makeNodeDir(dir)
	if err != nil {
		return err
	}
	cache := image.NewCache(filepath.Join(nodeDir, "cache"), blobs)
	metrics := prometheus.NewRegistry() // the node's, on its node API's /metrics
	layers, err := setupLayers(nodeDir, nodeID, cache, blobsOf(cfg.Blobs, dir), blobs, nil, cfg.Layers, metrics, log)
	if err != nil {
		return err
	}
	defer layers.Close()
	mounts := image.NewMounts(filepath.Join(nodeDir, "layers"))
	var b backend.Backend
	switch {
	case cfg.Backend != "" && cfg.Backend != api.BackendContainer:
		err = errdefs.Invalid("agent: backend %q: want container", cfg.Backend)
	case cfg.Simulated != nil:
		b, err = cfg.Simulated(filepath.Join(nodeDir, "fake"))
		log.Warn("this node is simulated: its sandboxes are not isolated", "node", nodeID)
	default:
		b, err = container.New(container.Config{
			StateDir:     filepath.Join(nodeDir, "container"),
			RuncRoot:     filepath.Join(nodeDir, "runc"),
			CgroupParent: "/warren/" + nodeID,
			Mounts:       mounts,
		})
	}
	if err != nil {
		return err
	}
	backends := []backend.Backend{b}
	if cfg.Simulated == nil {
		backends = append(backends, machineBackends(nodeDir, nodeID, cfg.Machines, mounts, log)...)
	}
	// No Images: the apiserver resolves images and sends them with each
	// create, so the node needs only the blob store.
	var network node.Network
	var netProblem string
	if cfg.Simulated == nil { // a simulated node has no namespaces to network
		var stopNetwork func()
		network, netProblem, stopNetwork = startNetwork(ctx, cfg.Network, filepath.Join(nodeDir, "network"), append(slices.Clone(cfg.APIServers), cfg.Etcd...), log)
		defer stopNetwork()
	}
	if cfg.Swap > 0 && cfg.Simulated == nil {
		ensureSwap(cfg.Swap, log)
	}
	raiseOpenFiles(log)
	agent, err := node.New(ctx, node.Config{
		ID:             nodeID,
		StateDir:       filepath.Join(nodeDir, "sandboxes"),
		Backends:       backends,
		Layers:         cache,
		Packer:         cache,
		Limits:         cfg.Limits,
		Cgroup:         "/warren/" + nodeID,
		Pool:           cfg.Pool,
		Labels:         cfg.Labels,
		Defaults:       node.Defaults{Disk: cfg.DefaultDisk},
		ReclaimIdle:    reclaimIdle(cfg.ReclaimIdle),
		NoMemoryMerge:  cfg.NoMemoryMerge,
		Network:        network,
		NetworkProblem: netProblem,
		Log:            log,
	})
	if err != nil {
		return err
	}
	if err := agent.Start(ctx); err != nil {
		return err
	}
	defer agent.Close()

	var leaser fleet.Leaser
	var peer string // a control-plane address, to find our own
	var envs fncall.Images
	if len(cfg.Etcd) > 0 {
		st, err := store.DialEtcd(cfg.Etcd, "")
		if err != nil {
			return err
		}
		defer st.Close()
		leaser, peer = newTokenLeaser(st, cfg.Token, nodeKey), hostPort(cfg.Etcd[0])
		envs = image.NewRegistry(st, blobs, image.WithLogger(log))
	} else {
		t := nodeapi.NewTransport()
		t.TLSClientConfig = tlsClient
		hc := &http.Client{Transport: nodeKeyTransport{key: nodeKey, next: t}}
		leaser, peer = nodeapi.NewRegistrations(cfg.APIServers, cfg.Token, hc), hostPort(cfg.APIServers[0])
		envs = apiImages{client.New(cfg.APIServers[0], cfg.Token, client.WithTLSConfig(tlsClient))}
	}
	var fn *fncall.Service
	if cfg.Simulated == nil { // a simulated node runs no real containers
		if fn, err = startFn(cfg.Fn, nodeID, nodeDir, envs, cache, mounts, log); err != nil {
			return err
		}
	}
	if fn != nil {
		defer fn.Close()
	}
	go newLayerCollector(nil, agentLayers(agent, fn), cache, log).run(ctx)

	ln, scheme, err := cfg.TLS.listen(cfg.Listen)
	if err != nil {
		return err
	}
	addr := cfg.Advertise
	if addr == "" {
		addr = advertise(ln.Addr().(*net.TCPAddr), peer)
	}
	if scheme == "https" && !strings.Contains(addr, "://") {
		addr = "https://" + addr
	}
	// This node's own secret, new at every start: only the apiservers
	// learn it, from the registration.
	secret := randomHex(32)
	nsrv := nodeapi.NewServer(layers.Node(agent, fn), nodeapi.Secret(secret), log) // the node's problems include its layer server's
	if fn != nil {
		nsrv.ServeFn(fn)
	}
	nsrv.ServeMetrics(promhttp.HandlerFor(metrics, promhttp.HandlerOpts{}))
	httpSrv := startHTTP(ln, nsrv)

	status := agent.Status()
	reg, err := fleet.NewRegistrar(fleet.RegistrarConfig{
		Store: leaser,
		Node: api.Node{ID: nodeID, Name: cfg.NodeName, Address: addr, Pool: cfg.Pool, Labels: cfg.Labels,
			Backends: status.Backends, Capacity: status.Capacity},
		Secret: secret,
		TTL:    cfg.RegistrationTTL,
		Log:    log,
	})
	if err != nil {
		httpSrv.srv.Close()
		return err
	}
	// A registration refused for good (the node token was revoked) ends
	// the agent: serving a node that no apiserver will call helps nobody.
	sctx, refused := context.WithCancelCause(ctx)
	defer refused(nil)
	rctx, stopReg := context.WithCancel(ctx)
	regDone := make(chan struct{})
	go func() {
		defer close(regDone)
		if err := reg.Run(rctx); err != nil {
			refused(fmt.Errorf("node registration refused: %w", err))
		}
	}()
	defer func() { stopReg(); <-regDone }()
	regErr := func() error {
		if err := context.Cause(sctx); ctx.Err() == nil && err != nil {
			return err
		}
		return nil
	}

	// Ready once registered, so that a caller may place on the node.
	for reg.Lease() == 0 {
		select {
		case <-sctx.Done():
			httpSrv.srv.Close()
			return regErr()
		case err := <-httpSrv.errc:
			return err
		case <-time.After(20 * time.Millisecond):
		}
	}
	log.Info("warren agent is up", "node", nodeID, "name", cfg.NodeName, "addr", ln.Addr().String(), "advertise", addr, "data_dir", dir,
		"blobs", blobsOf(cfg.Blobs, dir), "pool", orDefault(cfg.Pool, api.PoolOnPrem), "backends", status.Backends,
		"startup", time.Since(start).Round(time.Millisecond))
	if cfg.Ready != nil {
		cfg.Ready(ln.Addr().String())
	}
	awaitStop(sctx, httpSrv, agent, cfg.StopSandboxes, log)
	if err := httpSrv.wait(sctx); err != nil {
		return err
	}
	return regErr()
}

// awaitStop waits until ctx ends or srv fails. Then, if stop is set, it
// ends every sandbox of a while srv still answers, so that calls in
// flight hear sandbox_gone ("node shutting down"); the caller shuts srv
// down after.
func awaitStop(ctx context.Context, srv *httpServer, a *node.Agent, stop bool, log *slog.Logger) {
	select {
	case <-ctx.Done():
	case err := <-srv.errc:
		srv.errc <- err // for srv.wait
	}
	if !stop {
		return
	}
	ids, err := a.StopSandboxes(context.Background())
	if err != nil {
		log.Error("stopping: some sandboxes could not be ended", "err", err)
	}
	log.Info("stopping: ended the node's sandboxes (--stop-sandboxes)", "count", len(ids))
}

// tokenLeaser is the registration store of an agent that reaches etcd
// itself. It checks the node token with IAM before every registration and
// renewal, as an apiserver does for an agent that registers through it, so
// that either way only a node token registers, and a revoked one's
// registration lapses; and it registers with fleet.Claim, as an apiserver
// does: as the token's bound name only, never over another agent's live
// registration.
//
// These checks run in the agent itself: they keep honest agents from
// clashing (a wrong --node-name, a second agent on a bound token, a copied
// data dir), but they are no defence against whoever holds the node token
// and reaches etcd, since etcd grants every client the whole keyspace (no
// etcd user or role is configured): such a client can write any key. Hosts
// that are not all trusted register through an apiserver (--apiserver),
// and etcd is reachable from apiservers only.
type tokenLeaser struct {
	store.LeaseTxn
	iam   *iam.IAM
	token string
	owner string
}

// tokenRecheck bounds how long a revoked token keeps renewing an etcd
// agent's registration (its lease then runs out). Checks in between are
// answered from IAM's cache: one store read per agent per tokenRecheck.
const tokenRecheck = 30 * time.Second

func newTokenLeaser(st store.LeaseTxn, token, nodeKey string) *tokenLeaser {
	// Never admits anything: it only reads tokens. Node tokens belong to
	// the root project, which is always there: the tree needs no refresh.
	m := iam.New(st, iam.Options{AuthCacheTTL: tokenRecheck, TreeRefresh: time.Hour})
	return &tokenLeaser{LeaseTxn: st, iam: m, token: token, owner: fleet.OwnerOf(nodeKey)}
}

// check: ErrUnauthenticated for a token IAM does not know (or no longer),
// ErrForbidden for a token of another role.
func (l *tokenLeaser) check(ctx context.Context) (iam.Principal, error) {
	p, err := l.iam.Authenticate(ctx, l.token)
	if err != nil {
		return p, fmt.Errorf("node token: %w", err)
	}
	if err := iam.Authorize(p, iam.ActionNode, ""); err != nil {
		return p, fmt.Errorf("node token: %w", err)
	}
	return p, nil
}

func (l *tokenLeaser) PutWithLease(ctx context.Context, key string, value []byte, ttl time.Duration) (store.LeaseID, error) {
	p, err := l.check(ctx)
	if err != nil {
		return 0, err
	}
	var reg fleet.Registration
	if err := json.Unmarshal(value, &reg); err != nil || fleet.Key(reg.ID) != key {
		return 0, errdefs.Invalid("registration at %s: not a registration of that node", key)
	}
	if reg.Name, err = iam.BoundNodeName(p, reg.Name); err != nil {
		return 0, err
	}
	reg.Owner, reg.Token = l.owner, p.TokenID
	return fleet.Claim(ctx, l.LeaseTxn, reg, ttl, true)
}

func (l *tokenLeaser) KeepAlive(ctx context.Context, id store.LeaseID) error {
	if _, err := l.check(ctx); err != nil {
		return err
	}
	return l.LeaseTxn.KeepAlive(ctx, id)
}

// Delete removes the node's registration if this agent holds it.
func (l *tokenLeaser) Delete(ctx context.Context, key string) error {
	id, ok := strings.CutPrefix(key, fleet.Prefix)
	if !ok {
		return errdefs.Invalid("registration key %q", key)
	}
	return fleet.Release(ctx, l.LeaseTxn, id, l.owner)
}

// nodeKeyTransport sends the agent's node key with each call to an
// apiserver's registration endpoint (fleet.NodeKeyHeader).
type nodeKeyTransport struct {
	key  string
	next http.RoundTripper
}

func (t nodeKeyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(fleet.NodeKeyHeader, t.key)
	return t.next.RoundTrip(r)
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// hostPort returns the host:port of an endpoint given as a URL or as
// host:port.
func hostPort(endpoint string) string {
	if u, err := url.Parse(endpoint); err == nil && u.Host != "" {
		if u.Port() == "" {
			if u.Scheme == "https" {
				return net.JoinHostPort(u.Hostname(), "443")
			}
			return net.JoinHostPort(u.Hostname(), "80")
		}
		return u.Host
	}
	return endpoint
}

// advertise is the address apiservers should dial for a listener on l:
// l itself when its host is specific, otherwise this host's address on
// the route to peer (a control-plane endpoint), with l's port.
func advertise(l *net.TCPAddr, peer string) string {
	port := fmt.Sprint(l.Port)
	if !l.IP.IsUnspecified() {
		return net.JoinHostPort(l.IP.String(), port)
	}
	// A UDP "dial" sends nothing: it only picks the route.
	if c, err := net.Dial("udp", peer); err == nil {
		defer c.Close()
		if ua, ok := c.LocalAddr().(*net.UDPAddr); ok {
			return net.JoinHostPort(ua.IP.String(), port)
		}
	}
	if h, err := os.Hostname(); err == nil && !strings.ContainsAny(h, " /") {
		return net.JoinHostPort(h, port)
	}
	return net.JoinHostPort("127.0.0.1", port)
}

// ensureSwap gives the host a zram swap device of size bytes unless it
// swaps already; a failure is logged, and pauses then reclaim file pages
// only (node ls -o json says so: pause_reclaim).
func ensureSwap(size int64, log *slog.Logger) {
	if devs, err := swap.Devices(); err == nil && len(devs) > 0 {
		log.Info("the host swaps already; --swap adds none", "swap", swap.Describe())
		return
	}
	dev, err := swap.Zram(size)
	if err != nil {
		log.Warn("no zram swap: pausing reclaims file pages only", "err", err)
		return
	}
	log.Info("zram swap for paused sandboxes", "device", dev, "size", size)
}

// DefaultReclaimIdle is how long a sandbox goes without a call before a
// node reclaims its memory, unless told otherwise: longer than an agent
// thinks between tool calls, so a working sandbox keeps its page cache.
const DefaultReclaimIdle = 5 * time.Minute

func reclaimIdle(d time.Duration) time.Duration {
	switch {
	case d == 0:
		return DefaultReclaimIdle
	case d < 0:
		return 0
	}
	return d
}

// raiseOpenFiles lifts the agent's open files limit (node.RaiseOpenFiles)
// before the node's sandbox cap is derived from it.
func raiseOpenFiles(log *slog.Logger) {
	if n, err := node.RaiseOpenFiles(); err != nil {
		log.Warn("cannot raise the open files limit: the node's sandbox cap follows it", "limit", n, "err", err)
	}
}
