package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/warrenhq/warren/internal/errdefs"
)

// Embedded is a single-member etcd cluster running inside this process, as
// `warren up` uses it, together with a Store over it. It listens on loopback
// only: clients reach it through a unix socket in its directory (or a
// loopback TCP port when that path is too long for a socket), and its peer
// listener is bound to an ephemeral loopback port no one dials, since it has
// no peers.
//
// Its data survives a crash of the process (kill -9): etcd's WAL is
// fsynced before a write is acknowledged, and StartEmbedded on the same
// directory picks the data up again.
type Embedded struct {
	*Etcd
	etcd     *embed.Etcd
	lock     *os.File
	endpoint string
	closing  *atomic.Bool // silences the logger during Close
	closed   sync.Once
	closeErr error
}

// EmbeddedOption configures StartEmbedded.
type EmbeddedOption func(*embeddedConfig)

type embeddedConfig struct {
	logger    *slog.Logger
	prefix    string
	clientURL string
}

// WithLogger sends etcd's warnings and errors to l. Without it they are
// discarded: etcd logs a great deal at info level, none of it useful to a
// warren user.
func WithLogger(l *slog.Logger) EmbeddedOption {
	return func(c *embeddedConfig) { c.logger = l }
}

// WithPrefix sets the key namespace of the Store (default DefaultPrefix).
func WithPrefix(prefix string) EmbeddedOption {
	return func(c *embeddedConfig) { c.prefix = prefix }
}

// WithClientURL makes the member listen for clients on u (for example
// "http://127.0.0.1:2379", so other processes can reach it) instead of a
// unix socket in its directory.
func WithClientURL(u string) EmbeddedOption {
	return func(c *embeddedConfig) { c.clientURL = u }
}

// maxSocketPath keeps a unix socket path within sun_path (108 bytes on
// Linux, including the terminating NUL).
const maxSocketPath = 100

// StartEmbedded starts (or restarts, if dir holds data from an earlier run)
// an embedded etcd member with its data in dir, and returns once it serves
// requests. It takes an exclusive lock on dir: a second member on the same
// directory fails with ErrUnavailable instead of corrupting it. Close stops
// it gracefully.
func StartEmbedded(ctx context.Context, dir string, opts ...EmbeddedOption) (*Embedded, error) {
	c := embeddedConfig{prefix: DefaultPrefix}
	for _, o := range opts {
		o(&c)
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("store: embedded etcd dir: %w", err)
	}
	// The directory holds every secret warren stores (tokens): owner only,
	// as etcd itself insists.
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("store: embedded etcd dir: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("store: embedded etcd dir: %w", err)
	}
	lock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	e, err := startEmbedded(ctx, dir, c)
	if err != nil {
		lock.Close()
		return nil, err
	}
	e.lock = lock
	return e, nil
}

func startEmbedded(ctx context.Context, dir string, c embeddedConfig) (*Embedded, error) {
	closing := new(atomic.Bool)
	lg := zap.NewNop()
	if c.logger != nil {
		lg = zap.New(newSlogCore(c.logger.Handler(), zap.WarnLevel, closing))
	}

	clientURL, err := embeddedClientURL(dir, c.clientURL)
	if err != nil {
		return nil, err
	}
	// Port 0: the kernel picks a free port, so nothing collides. The
	// member's identity hashes its advertised peer URL, which stays the
	// literal ":0" across restarts, and a single member never dials it.
	peerURL := url.URL{Scheme: "http", Host: "127.0.0.1:0"}

	cfg := embed.NewConfig()
	cfg.Name = "warren"
	cfg.Dir = dir
	cfg.Logger = "zap"
	cfg.LogLevel = "warn"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg)
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.ListenClientUrls = []url.URL{*clientURL}
	cfg.AdvertiseClientUrls = []url.URL{*clientURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.InitialClusterToken = "warren"
	cfg.EnableGRPCGateway = false
	// A lone member elects itself after a randomized election timeout:
	// with etcd's defaults (100 ms ticks, 1 s election) startup takes up
	// to a second; with these, tens of milliseconds. Short timeouts cost a
	// lone member nothing: it has no peers to heartbeat or lose.
	cfg.TickMs = 10
	cfg.ElectionMs = 100
	// Revisions older than an hour are compacted, so a long-lived `warren
	// up` does not grow its database without bound.
	cfg.AutoCompactionMode = embed.CompactorModePeriodic
	cfg.AutoCompactionRetention = "1h"

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("store: start embedded etcd in %s: %w: %w", dir, errdefs.ErrUnavailable, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("store: embedded etcd in %s: %w: %w", dir, errdefs.ErrUnavailable, err)
	case <-ctx.Done():
		e.Server.Stop()
		e.Close()
		return nil, fmt.Errorf("store: embedded etcd in %s not ready: %w", dir, ctx.Err())
	}

	endpoint := clientURL.String()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{endpoint},
		DialTimeout: 5 * time.Second,
		Logger:      lg,
	})
	if err != nil {
		e.Close()
		return nil, fmt.Errorf("store: connect to embedded etcd: %w: %w", errdefs.ErrUnavailable, err)
	}
	return &Embedded{
		Etcd:     NewEtcd(cli, c.prefix),
		etcd:     e,
		endpoint: endpoint,
		closing:  closing,
	}, nil
}

// embeddedClientURL returns the URL the member serves clients on.
func embeddedClientURL(dir, override string) (*url.URL, error) {
	if override != "" {
		u, err := url.Parse(override)
		if err != nil {
			return nil, errdefs.Invalid("etcd client URL %q: %v", override, err)
		}
		return u, nil
	}
	if sock := filepath.Join(dir, "etcd.sock"); len(sock) <= maxSocketPath {
		return &url.URL{Scheme: "unix", Path: sock}, nil
	}
	// A free port, briefly reserved and released: another process could
	// take it in between, in which case StartEtcd fails and says so.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("store: pick a port for embedded etcd: %w: %w", errdefs.ErrUnavailable, err)
	}
	addr := l.Addr().String()
	l.Close()
	return &url.URL{Scheme: "http", Host: addr}, nil
}

// lockDir takes an exclusive, non-blocking lock on dir/LOCK. The kernel
// drops it when the process dies, so a killed `warren up` never leaves a
// stale lock behind.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "LOCK"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("store: lock %s: %w", dir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errdefs.New(errdefs.ErrUnavailable, "store_locked",
				"etcd data directory %s is in use by another process", dir)
		}
		return nil, fmt.Errorf("store: lock %s: %w", dir, err)
	}
	return f, nil
}

// Store returns the Store in the member's namespace. Closing it does not
// stop the member; Close on the Embedded does.
func (e *Embedded) Store() Store { return e.Etcd }

// Endpoint returns the client URL of the member, e.g. "unix:///data/etcd.sock".
func (e *Embedded) Endpoint() string { return e.endpoint }

// Err reports a fatal error of the running member (it then stops serving).
func (e *Embedded) Err() <-chan error { return e.etcd.Err() }

// Close closes the client, stops the member gracefully (in-flight requests
// finish, the database is closed cleanly) and releases the directory.
// Calling it again is a no-op.
func (e *Embedded) Close() error {
	e.closed.Do(func() {
		e.closing.Store(true)
		err := e.Etcd.cli.Close()
		e.etcd.Close()
		if e.lock != nil {
			e.lock.Close()
		}
		if !errors.Is(err, context.Canceled) {
			e.closeErr = err
		}
	})
	return e.closeErr
}
