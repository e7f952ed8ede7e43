// Package daemon assembles warren's server roles from their parts. Up is the
// embedded default: apiserver, node agent, an embedded etcd member and a
// blob store (a directory, unless told otherwise) in one process, all state
// under one data directory;
// its apiserver serves its in-process node directly (apiserver.SingleNode).
// APIServer and Agent are the roles of a cluster: stateless apiserver
// replicas over etcd that place and route through a fleet watcher
// (apiserver.Router), and node agents that serve the node API and register
// themselves.
package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/apiserver"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/backend/container"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/node"
	"github.com/warrenhq/warren/internal/store"
)

// UpConfig configures a single-process warren.
type UpConfig struct {
	DataDir string // all state lives here
	Listen  string // API address, e.g. 127.0.0.1:7443
	// TLS: plain HTTP unless TLS.Cert and TLS.Key are set.
	TLS TLSConfig
	// Blobs is the blob store (blob.Open: a directory or
	// s3://bucket/prefix). Default <DataDir>/blobs.
	Blobs  string
	Limits node.Limits
	// DefaultDisk limits the writable layer of a sandbox that asks for no
	// disk limit (0: none); Up fails if the data dir's filesystem offers
	// no quota.
	DefaultDisk int64
	// ReclaimIdle: a sandbox without a call for this long has its memory
	// reclaimed (node.Config.ReclaimIdle); 0 takes DefaultReclaimIdle,
	// negative turns it off.
	ReclaimIdle time.Duration
	// NoMemoryMerge: never merge sandboxes' memory, whatever their
	// project says (node.Config.NoMemoryMerge).
	NoMemoryMerge bool
	Log           *slog.Logger
	// Fn configures FnCall; ImageCache is where built runtime images are
	// found and published from at startup (default DefaultImageCache).
	Fn         FnConfig
	ImageCache string
	// Ready, if set, is called once the API serves, with its address.
	Ready func(addr string)
	// StopSandboxes ends every sandbox when Up stops; by default they
	// keep running, for the next Up on the data dir to re-adopt.
	StopSandboxes bool
	// Network is the sandboxes' network.
	Network NetworkConfig
	// Machines configures the microvm backend.
	Machines MachineConfig
	// Layers says how the node loads layers (eager or lazy).
	Layers LayersConfig
}

// DefaultDataDir and DefaultListen are where `warren up` keeps its state
// and serves, and where client verbs look by default.
const (
	DefaultDataDir = "/var/lib/warren"
	DefaultListen  = "127.0.0.1:7443"
)

// AdminTokenFile is the admin token's file name under the data dir.
const AdminTokenFile = "admin-token"

// Up runs everything until ctx ends. Sandboxes outlive it, unless
// StopSandboxes: a later Up on the same data dir re-adopts them.
func Up(ctx context.Context, cfg UpConfig) error {
	log := cfg.Log
	if log == nil {
		log = slog.Default()
	}
	dir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	start := time.Now()

	etcd, err := store.StartEmbedded(ctx, filepath.Join(dir, "etcd"), store.WithLogger(log))
	if err != nil {
		return fmt.Errorf("start etcd: %w", err)
	}
	defer etcd.Close()
	st := etcd.Store()

	imgs, err := openImages(ctx, st, dir, cfg.Blobs, log) // images.go
	if err != nil {
		return err
	}

	nodeID, err := loadOrCreate(filepath.Join(dir, "node-id"), func() string { return "n" + randomHex(4) })
	if err != nil {
		return err
	}
	nodeDir, err := makeNodeDir(dir)
	if err != nil {
		return err
	}
	mounts := image.NewMounts(filepath.Join(nodeDir, "layers"))
	ctr, err := container.New(container.Config{
		StateDir:     filepath.Join(nodeDir, "container"),
		RuncRoot:     filepath.Join(nodeDir, "runc"),
		CgroupParent: "/warren/" + nodeID,
		Mounts:       mounts,
	})
	if err != nil {
		return err
	}
	cache := image.NewCache(filepath.Join(nodeDir, "cache"), imgs.blobs)
	// One registry for the apiserver's metrics and the node's: up serves
	// both on its API's /metrics, the one address there is to scrape.
	reg := prometheus.NewRegistry()
	// No fleet watcher polls this node: it records its traces itself.
	layers, err := setupLayers(nodeDir, nodeID, cache, blobsOf(cfg.Blobs, dir), imgs.blobs, imgs.images.RecordTrace, cfg.Layers, reg, log)
	if err != nil {
		return err
	}
	defer layers.Close()
	network, netProblem, stopNetwork := startNetwork(ctx, cfg.Network, filepath.Join(nodeDir, "network"), nil, log)
	defer stopNetwork()
	raiseOpenFiles(log)
	agent, err := node.New(ctx, node.Config{
		ID:             nodeID,
		StateDir:       filepath.Join(nodeDir, "sandboxes"),
		Backends:       append([]backend.Backend{ctr}, machineBackends(nodeDir, nodeID, cfg.Machines, mounts, log)...),
		Images:         imgs.images,
		Layers:         cache,
		Packer:         cache,
		Limits:         cfg.Limits,
		Cgroup:         "/warren/" + nodeID,
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
	// Runtime images built on this host (scripts/build-runtime-images)
	// become environments, in the background: minutes the first time.
	go publishCached(ctx, imgs.images, cfg.ImageCache, log)
	fn, err := startFn(cfg.Fn, nodeID, nodeDir, imgs.images, cache, mounts, log)
	if err != nil {
		return err
	}
	if fn != nil {
		defer fn.Close()
	}

	token, err := loadOrCreate(filepath.Join(dir, AdminTokenFile), func() string { return randomHex(32) })
	if err != nil {
		return err
	}
	ids, err := startIAM(ctx, st, token, log) // iam.go
	if err != nil {
		return err
	}
	go ids.Usage.Follow(ctx, agent, usageResync)
	collector := newCollector(imgs.images, agent, fn, cache, log)
	go collector.run(ctx)
	acfg := imgs.serverConfig(cache, mounts, collector, ids, log)
	acfg.Node = layers.Node(agent, fn) // the node's problems include its layer server's
	acfg.Registry = reg
	acfg.DefaultResources.Disk = api.Quantity(cfg.DefaultDisk) // quota counts the node's default
	if fn != nil {
		acfg.Fn = fn
	}
	ln, scheme, err := cfg.TLS.listen(cfg.Listen)
	if err != nil {
		return err
	}
	httpSrv := startHTTP(ln, apiserver.New(acfg))
	log.Info("warren is up", "addr", ln.Addr().String(), "scheme", scheme, "node", nodeID, "data_dir", dir, "blobs", blobsOf(cfg.Blobs, dir),
		"admin_token_file", filepath.Join(dir, AdminTokenFile), "startup", time.Since(start).Round(time.Millisecond))
	if cfg.Ready != nil {
		cfg.Ready(ln.Addr().String())
	}
	awaitStop(ctx, httpSrv, agent, cfg.StopSandboxes, log) // agent.go
	return httpSrv.wait(ctx)
}

// loadOrCreate returns the trimmed content of path, writing mk() to it
// (mode 0600) first if it does not exist.
func loadOrCreate(path string, mk func() string) (string, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		if v := strings.TrimSpace(string(b)); v != "" {
			return v, nil
		}
	} else if !os.IsNotExist(err) {
		return "", err
	}
	v := mk()
	if err := os.WriteFile(path, []byte(v+"\n"), 0o600); err != nil {
		return "", err
	}
	return v, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// makeNodeDir makes the node's directory in the data directory dir, both
// searchable but not listable by others (0711): a container sandbox's root,
// an unprivileged host id in its user namespace, must pass them to reach
// its root filesystem below (runc mounts it from inside the namespace).
// What they hold stays private: files 0600, other directories 0700.
func makeNodeDir(dir string) (string, error) {
	nodeDir := filepath.Join(dir, "node")
	if err := os.MkdirAll(nodeDir, 0o711); err != nil {
		return "", fmt.Errorf("node dir: %w", err)
	}
	for _, d := range []string{dir, nodeDir} {
		if err := os.Chmod(d, 0o711); err != nil {
			return "", fmt.Errorf("node dir: %w", err)
		}
	}
	return nodeDir, nil
}
