package lazy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/blob"
)

// The layer server: the FS and its Cache served by a process of their
// own (`warren lazyd`, Serve), which the node agent starts and talks to
// over a unix socket in the server's directory (Client). Sandboxes read
// their layers from that process, not from the agent's, so they keep
// reading while the agent restarts or crashes: the server is in its own
// session (and, where the agent can, its own cgroup), a new agent finds
// it answering on its socket and goes on with it, and the EROFS mounts on
// its files never notice. The chunk cache stays warm across agent
// restarts too.
//
// If the server itself dies, the kernel aborts its FUSE connection: reads
// of its files, and so of every layer mounted on them, fail at once
// (ENOTCONN, "transport endpoint is not connected"; never a hang), but
// for what the page cache still holds. The agent notices (a pidfd, and a
// probe every few seconds), detaches the dead layer mounts, reports which
// layers and sandboxes lost them, and starts another server on the same
// directory; new creates then mount their layers afresh. Sandboxes that
// were reading from the dead server fail their reads until recreated: a
// FUSE connection dies with its server, and a mount cannot be moved to
// another.
//
// The server's directory holds:
//
//	server.sock  the control socket (HTTP, mode 0600)
//	server.pid   the serving process, while it serves
//	server.log   the server's log (appended by each server)
//	mnt/         the FUSE filesystem, a file per layer
//	chunks/      the chunk cache

// ServerConfig configures Serve.
type ServerConfig struct {
	Dir        string     // the server's directory (made if missing)
	Store      blob.Store // where chunks come from
	CacheBytes int64      // the chunk cache's limit
	// TraceWindow is how long a layer's reads are recorded into its
	// prefetch trace (0: DefaultTraceWindow; negative: none recorded).
	TraceWindow time.Duration
	Log         *slog.Logger
}

// Socket is the control socket of the server in dir.
func Socket(dir string) string { return filepath.Join(dir, "server.sock") }

// MountDir is where the server in dir mounts its filesystem.
func MountDir(dir string) string { return filepath.Join(dir, "mnt") }

// PidFile holds the pid of the server serving in dir, while it serves: a
// server that stopped answering can still be found and killed.
func PidFile(dir string) string { return filepath.Join(dir, "server.pid") }

// Info is what a server says about itself.
type Info struct {
	Pid   int    `json:"pid"`
	Mount string `json:"mount"`
	Limit int64  `json:"limit_bytes"`
	Start string `json:"started"` // RFC 3339
}

// Serve mounts the layer filesystem and serves its control socket until
// ctx ends or a client asks it to stop, then unmounts (layers still
// mounted on its files fail reads from then on; a stop asked with
// ?unused=1 is refused instead, while any are).
func Serve(ctx context.Context, cfg ServerConfig) error {
	log := cfg.Log
	if log == nil {
		log = slog.Default()
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return err
	}
	cache, err := OpenCache(filepath.Join(cfg.Dir, "chunks"), cfg.Store, cfg.CacheBytes)
	if err != nil {
		return err
	}
	mnt := MountDir(cfg.Dir)
	// An earlier server's filesystem is dead (its process is gone): it is
	// detached, so the new one mounts in its place.
	if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		log.Warn("lazy layers: unmount the earlier filesystem", "dir", mnt, "err", err)
	}
	window := cfg.TraceWindow
	if window == 0 {
		window = DefaultTraceWindow
	}
	fsys, err := Mount(mnt, cache, WithTraceWindow(window), WithLogger(log))
	if err != nil {
		return err
	}
	var unmounted atomic.Bool // by a stop ?unused=1: nothing left to close
	defer func() {
		if unmounted.Load() {
			return
		}
		if err := fsys.Close(); err != nil {
			log.Warn("lazy layers: unmount", "err", err)
		}
	}()
	sock := Socket(cfg.Dir)
	os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	defer os.Remove(sock)
	if err := os.Chmod(sock, 0o600); err != nil {
		ln.Close()
		return err
	}
	pidFile := PidFile(cfg.Dir)
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600); err != nil {
		ln.Close()
		return err
	}
	defer os.Remove(pidFile)
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	info := Info{Pid: os.Getpid(), Mount: mnt, Limit: cfg.CacheBytes, Start: time.Now().UTC().Format(time.RFC3339)}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/info", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, info) })
	mux.HandleFunc("GET /v1/stats", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, fsys.Stats()) })
	mux.HandleFunc("PUT /v1/layers", func(w http.ResponseWriter, r *http.Request) {
		var req Layer
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 256<<20)).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		path, err := fsys.Add(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		writeJSON(w, map[string]string{"path": path})
	})
	mux.HandleFunc("DELETE /v1/layers/{digest}", func(w http.ResponseWriter, r *http.Request) {
		fsys.Remove(r.PathValue("digest"))
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /v1/traces", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, map[string][]Trace{"traces": fsys.Traces()})
	})
	mux.HandleFunc("DELETE /v1/traces/{digest}", func(w http.ResponseWriter, r *http.Request) {
		fsys.AckTrace(r.PathValue("digest"))
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /v1/stop", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("unused") != "" {
			// The kernel says whether layers are mounted on the
			// filesystem's files (they hold them open: EBUSY), with no
			// window in which one could appear unnoticed.
			if err := unix.Unmount(mnt, 0); err != nil {
				code := http.StatusInternalServerError
				if errors.Is(err, unix.EBUSY) {
					code = http.StatusConflict
				}
				http.Error(w, fmt.Sprintf("unmount %s: %v", mnt, err), code)
				return
			}
			unmounted.Store(true)
		}
		w.WriteHeader(http.StatusNoContent)
		stop()
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	shut := make(chan struct{})
	go func() {
		defer close(shut)
		<-ctx.Done()
		// Shutdown lets the stop's answer out before the process ends.
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
		srv.Close()
	}()
	log.Info("lazy layer server up", "pid", info.Pid, "mount", mnt, "chunk_cache", cfg.CacheBytes)
	err = srv.Serve(ln)
	stop()
	<-shut
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	log.Info("lazy layer server stopping", "unmounted", unmounted.Load())
	return nil
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(v); err != nil {
		fmt.Fprintln(os.Stderr, "lazy layer server: reply:", err)
	}
}
