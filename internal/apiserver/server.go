// Package apiserver is warren's HTTP edge: the only path between trusted
// callers and untrusted sandboxes. It authenticates, validates and decodes
// requests, forwards them to the node that owns the sandbox, and maps
// classified errors (internal/errdefs) to HTTP statuses and stable codes.
// It keeps no state of its own, so any number of replicas can serve.
package apiserver

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/fncall"
	"github.com/warrenhq/warren/internal/httperr"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/node"
	"github.com/warrenhq/warren/internal/node/nodeapi"
	"github.com/warrenhq/warren/internal/store"
)

// Images lists the images sandboxes can start from.
type Images interface {
	List(ctx context.Context) ([]api.Image, error)
	Get(ctx context.Context, name string) (api.Image, error)
}

// Config builds a Server.
type Config struct {
	// Cluster is where sandboxes run: a Router over a fleet of node
	// agents. Nil makes it SingleNode(Node).
	Cluster Cluster
	// Node is the one in-process node agent when Cluster is nil (warren
	// up); its sandbox calls are served by its node API handler
	// in-process (SingleNode).
	Node   nodeapi.Agent
	Images Images
	// Registrations, if set, keeps the registrations of agents that
	// register through this apiserver (nodes.go), with an IAM token of
	// role node (Tokens) as their credential.
	Registrations store.Watcher
	// Layers serves /v1/layers and /v1/environments; nil answers 503.
	Layers Layers
	// CollectGarbage, if set, is called after a layer or environment is
	// deleted; it should start a GC soon, without waiting for it.
	CollectGarbage func()
	// Tokens authenticates callers (auth.go): *iam.IAM, or StaticToken.
	Tokens Tokens
	// IAM, if set, serves /v1/projects and /v1/tokens and admits creates
	// against project quotas and rate limits (quota.go); nil answers 503
	// there and admits every create.
	IAM *iam.IAM
	// Idempotency records create keys; nil keeps them in this process.
	Idempotency *iam.Idempotency
	// Usage, if set, is IAM's usage source: creates are counted in it as
	// they return (usage.go), so IAM can run with a negative CommitHold.
	Usage *Usage
	// DefaultResources are what quota counts for a create that leaves CPU
	// or memory out; keep them equal to the nodes' defaults. Zero: 1 core,
	// 512Mi (node.Defaults' own).
	DefaultResources api.Resources
	// OCI serves image import and environment export; nil answers 503.
	OCI OCI
	// Squash squashes environments' diff chains (squash.go); nil leaves
	// them as they are and answers 503 to an explicit squash.
	Squash EnvSquasher
	Log    *slog.Logger
	// Registry receives the server's metrics; nil makes a private one.
	Registry *prometheus.Registry

	// Fn runs FnCalls in-process (warren up's node); a Router routes them
	// to its nodes instead (fn.go). Nil with no Router: no runtime exists.
	Fn fncall.Runner
}

// Server serves REST v1.
type Server struct {
	cfg     Config
	log     *slog.Logger
	mux     *http.ServeMux
	metrics *metrics
	cluster Cluster

	idem     *iam.Idempotency
	projects projectCache // sandbox id -> project, for scope checks
}

// New builds a Server.
func New(cfg Config) *Server {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	s := &Server{cfg: cfg, log: cfg.Log, mux: http.NewServeMux(), metrics: newMetrics(cfg.Registry), cluster: cfg.Cluster}
	if s.cluster == nil && cfg.Node != nil {
		s.cluster = SingleNode(cfg.Node, cfg.Log)
	}
	s.idem = cfg.Idempotency
	if s.idem == nil {
		s.idem = iam.NewIdempotency(store.Memory(), iam.IdempotencyOptions{})
	}
	s.routes()
	return s
}

func (s *Server) routes() {
	auth := s.authenticated
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(s.cfg.Registry, promhttp.HandlerOpts{}))

	s.mux.Handle("POST /v1/sandboxes", auth(s.createSandbox))
	s.mux.Handle("POST /v1/sandboxes:batch", auth(s.createBatch)) // batch.go
	s.mux.Handle("POST /v1/sandboxes:pause", auth(s.bulkPause))   // pause.go
	s.mux.Handle("POST /v1/sandboxes:resume", auth(s.bulkPause))
	s.mux.Handle("POST /v1/sandboxes/{id}/pause", auth(s.pauseSandbox)) // pause.go: a worker's group follows
	s.mux.Handle("POST /v1/sandboxes/{id}/resume", auth(s.pauseSandbox))
	s.mux.Handle("GET /v1/sandboxes", auth(s.listSandboxes))
	s.mux.Handle("GET /v1/sandboxes/{id}", auth(s.getSandbox))
	s.mux.Handle("DELETE /v1/sandboxes/{id}", auth(s.deleteSandbox))
	s.mux.Handle("PATCH /v1/sandboxes/{id}", auth(s.forwardSandbox))
	// Every other call on one sandbox (exec, files, stat, ...): one path,
	// the verb's rule in routeRules (auth.go), forwarded to its node.
	s.mux.Handle(sandboxVerbPattern, auth(s.sandboxCall))
	s.portRoutes(auth) // ports.go: the same path, for a sandbox's ports
	s.mux.Handle("GET /v1/images", auth(s.listImages))
	s.mux.Handle("GET /v1/images/{name...}", auth(s.getImage))
	s.mux.Handle("GET /v1/nodes", auth(s.listNodes))
	s.layerRoutes(auth)
	s.snapshotRoutes(auth) // snapshots.go
	s.ociRoutes(auth)
	s.iamRoutes(auth)
	s.fnRoutes(auth)
	s.nodeRoutes() // nodes.go: registration for agents without etcd
	s.mux.Handle("/v1/", auth(func(w http.ResponseWriter, r *http.Request) error {
		return errdefs.New(errdefs.ErrNotFound, api.CodeNotFound, "no route for %s %s", r.Method, r.URL.Path)
	}))
}

// ServeHTTP makes Server an http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
	s.mux.ServeHTTP(rw, r)
	s.metrics.observe(r, rw.status, time.Since(start))
}

// handler is an HTTP handler that returns its error for writeError.
type handler func(w http.ResponseWriter, r *http.Request) error

// apiError maps err to its HTTP status and wire form (internal/httperr
// holds the mapping, shared with the node API).
func apiError(err error) (int, api.Error) { return httperr.ToAPI(err) }

// writeError renders err as an api.ErrorBody with the right status.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	status, e := apiError(err)
	if status == http.StatusInternalServerError {
		s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	writeJSON(w, status, api.ErrorBody{Error: e})
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	return httperr.WriteJSON(w, status, v)
}

// decodeJSON reads one JSON object strictly (see httperr.DecodeJSON).
func decodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	return httperr.DecodeJSON(w, r, v)
}

// statusWriter records the status for metrics and passes Flush through.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// sandboxID returns the {id} path value after checking its form.
func sandboxID(r *http.Request) (string, error) {
	id := r.PathValue("id")
	if _, err := node.NodeOf(id); err != nil {
		return "", errdefs.New(errdefs.ErrNotFound, api.CodeSandboxNotFound, "sandbox %q not found (malformed id)", id)
	}
	return id, nil
}

// routeNode returns the node that owns a sandbox id: the id carries its
// node, so routing needs no lookup.
func (s *Server) routeNode(id string) (Node, error) {
	return s.cluster.Route(context.Background(), id)
}

func (s *Server) sandboxNode(r *http.Request) (string, Node, error) {
	id, err := sandboxID(r)
	if err != nil {
		return "", nil, err
	}
	n, err := s.cluster.Route(r.Context(), id)
	if err == nil {
		err = s.checkSandboxScope(r.Context(), id, n) // auth.go
	}
	return id, n, err
}
