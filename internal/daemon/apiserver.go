package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/warrenhq/warren/internal/apiserver"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/fleet"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/node/nodeapi"
	"github.com/warrenhq/warren/internal/placement"
	"github.com/warrenhq/warren/internal/store"
)

// APIServerConfig configures `warren apiserver`: one stateless replica of
// the API over an etcd cluster and a fleet of agents.
type APIServerConfig struct {
	// DataDir holds what this replica keeps locally: the admin-token and
	// node-token files (when it bootstrapped the cluster, or was given
	// them), scratch space for layer builds and OCI imports, and a layer
	// cache for exports. Nothing in it is needed to serve.
	DataDir string
	Listen  string
	Etcd    []string
	// TLS: the API serves TLS with TLS.Cert and TLS.Key, and TLS.CA is
	// what the agents' certificates are verified with when they registered
	// an https address (the system's roots without it).
	TLS TLSConfig
	// Blobs is the blob store every apiserver and node share (blob.Open:
	// a directory on a filesystem they all mount, or s3://bucket/prefix).
	// Default <DataDir>/blobs (one host only).
	Blobs string
	// Placement tunes placement (K, strategy, burst pool, retries).
	Placement placement.Config
	// Fleet tunes the fleet watcher's polls (interval, timeout, misses).
	Fleet fleet.Config
	// Refresh is how often each node is re-listed (apiserver.RouterConfig).
	Refresh time.Duration
	Log     *slog.Logger
	// Ready, if set, is called once the API serves, with its address.
	Ready func(addr string)
}

// Bootstrap keys in etcd.
const (
	// adminBootstrapKey is claimed by the apiserver that creates the
	// first admin token: that one, and only that one, writes it to its
	// <data-dir>/admin-token.
	adminBootstrapKey = "/cluster/admin-bootstrap"
	// nodeBootstrapKey is claimed by the apiserver that mints the first
	// node token, which it writes to its <data-dir>/node-token.
	nodeBootstrapKey = "/cluster/node-bootstrap"
)

// NodeTokenFile is the bootstrap node token's file name under the data dir
// of the first apiserver of a cluster: pass its content to `warren agent
// --token`. It is an IAM token of role node like any other (`warren token
// create --role node` mints more; `warren token revoke` ends one).
const NodeTokenFile = "node-token"

// APIServer runs one apiserver replica until ctx ends.
func APIServer(ctx context.Context, cfg APIServerConfig) error {
	log := cfg.Log
	if log == nil {
		log = slog.Default()
	}
	if len(cfg.Etcd) == 0 {
		return errdefs.Invalid("apiserver: --etcd is required")
	}
	dir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	start := time.Now()
	st, err := store.DialEtcd(cfg.Etcd, "")
	if err != nil {
		return err
	}
	defer st.Close()
	// Fail fast when etcd is not there, rather than serve 503s.
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, err = st.Get(pctx, adminBootstrapKey)
	cancel()
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return fmt.Errorf("etcd %v: %w", cfg.Etcd, err)
	}

	imgs, err := openImages(ctx, st, dir, cfg.Blobs, log) // images.go
	if err != nil {
		return err
	}
	admin, err := bootstrapAdmin(ctx, st, filepath.Join(dir, AdminTokenFile))
	if err != nil {
		return fmt.Errorf("admin token: %w", err)
	}
	ids, err := clusterIAM(ctx, st, admin, log)
	if err != nil {
		return err
	}
	nodeTokenFile := filepath.Join(dir, NodeTokenFile)
	mintedNodeToken, err := bootstrapNodeToken(ctx, st, ids.IAM, nodeTokenFile)
	if err != nil {
		return fmt.Errorf("node token: %w", err)
	}

	// No shared node secret: each node registers its own, and the fleet
	// view hands it to the client of that node.
	nodeHTTP, err := cfg.TLS.nodeHTTP()
	if err != nil {
		return err
	}
	clients := nodeapi.NewClients(nodeHTTP)
	fc := cfg.Fleet
	// The prefetch traces nodes report are kept with their layers.
	fc.Store, fc.Source, fc.Log = st, apiserver.RecordTraces(clients, imgs.images.RecordTrace, log), log
	watcher, err := fleet.New(fc)
	if err != nil {
		return err
	}
	router, err := apiserver.NewRouter(apiserver.RouterConfig{
		Fleet:     watcher,
		Clients:   clients,
		Placement: cfg.Placement,
		Images:    imgs.images,
		Known:     func(ctx context.Context, id string) (bool, error) { return fleet.Known(ctx, st, id) },
		Usage:     ids.Usage,
		Refresh:   cfg.Refresh,
		Log:       log,
	})
	if err != nil {
		return err
	}
	wctx, stopFleet := context.WithCancel(ctx)
	fleetDone := make(chan struct{})
	go func() { watcher.Run(wctx); close(fleetDone) }()
	defer func() { stopFleet(); <-fleetDone }()
	// Serve once the view is whole: placing before every node answered
	// once would see nodes without their usage.
	select {
	case <-watcher.Ready():
	case <-time.After(15 * time.Second):
		log.Warn("fleet view not complete after 15s; serving anyway")
	case <-ctx.Done():
		return nil
	}
	go router.Run(wctx)

	collector := newLayerCollector(imgs.images, router.LiveLayers, nil, log)
	go collector.run(ctx)
	exportDir := filepath.Join(dir, "export")
	acfg := imgs.serverConfig(image.NewCache(filepath.Join(exportDir, "cache"), imgs.blobs),
		image.NewMounts(filepath.Join(exportDir, "layers")), collector, ids, log)
	acfg.Cluster = router
	acfg.Registrations = st
	ln, scheme, err := cfg.TLS.listen(cfg.Listen)
	if err != nil {
		return err
	}
	httpSrv := startHTTP(ln, apiserver.New(acfg))
	attrs := []any{"addr", ln.Addr().String(), "scheme", scheme, "etcd", strings.Join(cfg.Etcd, ","), "data_dir", dir,
		"blobs", blobsOf(cfg.Blobs, dir), "nodes", len(watcher.Snapshot()), "startup", time.Since(start).Round(time.Millisecond)}
	if admin != "" {
		attrs = append(attrs, "admin_token_file", filepath.Join(dir, AdminTokenFile))
	}
	if mintedNodeToken {
		attrs = append(attrs, "node_token_file", nodeTokenFile)
	}
	log.Info("warren apiserver is up", attrs...)
	if cfg.Ready != nil {
		cfg.Ready(ln.Addr().String())
	}
	return httpSrv.wait(ctx)
}

// bootstrapNodeToken mints a node token and writes it to file, once per
// cluster: the apiserver that wins the create of the bootstrap key does
// (the first of a fresh cluster), so that a cluster can be joined without
// first running `warren token create --role node`. It is a plain IAM
// token: revoking it takes effect, and no restart brings it back. A file
// that exists is left as it is. It reports whether it minted the token.
func bootstrapNodeToken(ctx context.Context, st store.Store, m *iam.IAM, file string) (bool, error) {
	if _, err := os.Stat(file); err == nil {
		return false, nil
	} else if !os.IsNotExist(err) {
		return false, err
	}
	host, _ := os.Hostname()
	mark := fmt.Sprintf(`{"host":%q,"file":%q,"at":%q}`, host, file, time.Now().UTC().Format(time.RFC3339))
	err := st.Create(ctx, nodeBootstrapKey, []byte(mark))
	if errors.Is(err, errdefs.ErrConflict) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	_, secret, err := m.CreateToken(ctx, iam.SystemPrincipal(), iam.TokenSpec{
		Project: "", Role: iam.RoleNode, Name: "bootstrap-node",
		Description: "node token the first apiserver wrote to " + file,
	})
	if err == nil {
		err = writeSecret(file, secret)
	}
	if err != nil {
		// Let the next apiserver start try again.
		st.Delete(context.WithoutCancel(ctx), nodeBootstrapKey)
		return false, err
	}
	return true, nil
}

// bootstrapAdmin returns the admin secret this apiserver registers at
// start: the one in file if it exists (kept from an earlier start, or put
// there by an operator); else a new one, written to file, if this is the
// first apiserver of the cluster (it wins the create of the bootstrap
// key); else "" (another apiserver made the admin token).
func bootstrapAdmin(ctx context.Context, st store.Store, file string) (string, error) {
	if b, err := os.ReadFile(file); err == nil {
		if v := strings.TrimSpace(string(b)); v != "" {
			return v, nil
		}
	} else if !os.IsNotExist(err) {
		return "", err
	}
	host, _ := os.Hostname()
	mark := fmt.Sprintf(`{"host":%q,"file":%q,"at":%q}`, host, file, time.Now().UTC().Format(time.RFC3339))
	err := st.Create(ctx, adminBootstrapKey, []byte(mark))
	if errors.Is(err, errdefs.ErrConflict) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	secret := randomHex(32)
	if err := writeSecret(file, secret); err != nil {
		return "", err
	}
	return secret, nil
}

func writeSecret(path, secret string) error {
	return os.WriteFile(path, []byte(secret+"\n"), 0o600)
}

// clusterIAM is startIAM for a replica that may have no admin secret to
// register (another apiserver bootstrapped the cluster).
func clusterIAM(ctx context.Context, st store.Store, admin string, log *slog.Logger) (*iamParts, error) {
	if admin != "" {
		return startIAM(ctx, st, admin, log)
	}
	usage := apiserver.NewUsage()
	m := iam.New(st, iam.Options{Usage: usage, CommitHold: -1})
	// Idempotency keys are swept by the replica that bootstrapped; any
	// replica's sweep would do, and one is enough.
	return &iamParts{IAM: m, Idempotency: iam.NewIdempotency(st, iam.IdempotencyOptions{}), Usage: usage}, nil
}
