// Package apiserver is warren's HTTP edge: the only path between trusted
// callers and untrusted sandboxes. It authenticates, validates and decodes
// requests, forwards them to the node that owns the sandbox, and maps
// classified errors (internal/errdefs) to HTTP statuses and stable codes.
// It keeps no state of its own, so any number of replicas can serve.
package apiserver

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/node"
)

// Node is what the apiserver needs of a node agent. *node.Agent satisfies
// it in-process (warren up); a node API client will across hosts.
type Node interface {
	ID() string
	Status() api.Node
	Create(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error)
	Get(ctx context.Context, id string) (api.Sandbox, error)
	List(ctx context.Context, f node.Filter) ([]api.Sandbox, error)
	Delete(ctx context.Context, id string) error
	Exec(ctx context.Context, id string, req api.ExecRequest, stdout, stderr io.Writer) (api.ExecResult, error)
	Stat(ctx context.Context, id, path string) (api.FileInfo, error)
	WriteFile(ctx context.Context, id, path string, mode uint32, r io.Reader) error
	ReadFile(ctx context.Context, id, path string, w io.Writer) error
	WriteTar(ctx context.Context, id, dir string, r io.Reader) error
	ReadTar(ctx context.Context, id, path string, w io.Writer) error
}

// Images lists the images sandboxes can start from.
type Images interface {
	List(ctx context.Context) ([]api.Image, error)
	Get(ctx context.Context, name string) (api.Image, error)
}

// Tokens checks bearer tokens.
type Tokens interface {
	// Check returns nil if token is valid, or an ErrUnauthenticated.
	Check(ctx context.Context, token string) error
}

// Config builds a Server.
type Config struct {
	Node   Node
	Images Images
	// Layers serves /v1/layers and /v1/environments; nil answers 503.
	Layers Layers
	// CollectGarbage, if set, is called after a layer or environment is
	// deleted; it should start a GC soon, without waiting for it.
	CollectGarbage func()
	Tokens         Tokens
	// OCI serves image import and environment export; nil answers 503.
	OCI OCI
	Log *slog.Logger
	// Registry receives the server's metrics; nil makes a private one.
	Registry *prometheus.Registry
}

// Server serves REST v1.
type Server struct {
	cfg     Config
	log     *slog.Logger
	mux     *http.ServeMux
	metrics *metrics
}

// New builds a Server.
func New(cfg Config) *Server {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	s := &Server{cfg: cfg, log: cfg.Log, mux: http.NewServeMux(), metrics: newMetrics(cfg.Registry)}
	s.routes()
	return s
}

func (s *Server) routes() {
	auth := s.authenticated
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(s.cfg.Registry, promhttp.HandlerOpts{}))

	s.mux.Handle("POST /v1/sandboxes", auth(s.createSandbox))
	s.mux.Handle("GET /v1/sandboxes", auth(s.listSandboxes))
	s.mux.Handle("GET /v1/sandboxes/{id}", auth(s.getSandbox))
	s.mux.Handle("DELETE /v1/sandboxes/{id}", auth(s.deleteSandbox))
	s.mux.Handle("POST /v1/sandboxes/{id}/exec", auth(s.exec))
	s.mux.Handle("GET /v1/sandboxes/{id}/stat", auth(s.stat))
	s.mux.Handle("GET /v1/sandboxes/{id}/files", auth(s.readFiles))
	s.mux.Handle("PUT /v1/sandboxes/{id}/files", auth(s.writeFiles))
	s.mux.Handle("GET /v1/images", auth(s.listImages))
	s.mux.Handle("GET /v1/images/{name...}", auth(s.getImage))
	s.mux.Handle("GET /v1/nodes", auth(s.listNodes))
	s.layerRoutes(auth)
	s.ociRoutes(auth)
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

// authenticated checks the bearer token, runs h and renders its error.
func (s *Server) authenticated(h handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := s.checkAuth(r)
		if err == nil {
			err = h(w, r)
		}
		if err != nil {
			s.writeError(w, r, err)
		}
	})
}

func (s *Server) checkAuth(r *http.Request) error {
	h := r.Header.Get("Authorization")
	tok, ok := strings.CutPrefix(h, "Bearer ")
	if !ok || tok == "" {
		return errdefs.New(errdefs.ErrUnauthenticated, api.CodeUnauthenticated, "missing bearer token")
	}
	return s.cfg.Tokens.Check(r.Context(), tok)
}

// StaticToken accepts one token, compared in constant time.
type StaticToken string

// Check implements Tokens.
func (t StaticToken) Check(_ context.Context, token string) error {
	want, got := sha256.Sum256([]byte(t)), sha256.Sum256([]byte(token))
	if subtle.ConstantTimeCompare(want[:], got[:]) != 1 {
		return errdefs.New(errdefs.ErrUnauthenticated, api.CodeUnauthenticated, "invalid token")
	}
	return nil
}

// statusFor maps an error kind to an HTTP status and a default code.
func statusFor(err error) (int, string) {
	switch {
	case errors.Is(err, errdefs.ErrInvalid):
		return http.StatusBadRequest, api.CodeInvalid
	case errors.Is(err, errdefs.ErrUnauthenticated):
		return http.StatusUnauthorized, api.CodeUnauthenticated
	case errors.Is(err, errdefs.ErrForbidden):
		return http.StatusForbidden, api.CodeForbidden
	case errors.Is(err, errdefs.ErrNotFound):
		return http.StatusNotFound, api.CodeNotFound
	case errors.Is(err, errdefs.ErrConflict):
		return http.StatusConflict, api.CodeConflict
	case errors.Is(err, errdefs.ErrExhausted):
		return http.StatusTooManyRequests, api.CodeExhausted
	case errors.Is(err, errdefs.ErrUnavailable):
		return http.StatusServiceUnavailable, api.CodeUnavailable
	}
	return http.StatusInternalServerError, api.CodeInternal
}

// apiError maps err to its HTTP status and wire form.
func apiError(err error) (int, api.Error) {
	status, code := statusFor(err)
	if c := errdefs.Code(err); c != "" {
		code = c
	}
	e := api.Error{Code: code, Message: err.Error()}
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		ra := errdefs.RetryAfter(err)
		if ra <= 0 {
			ra = time.Second
		}
		e.RetryAfter = int((ra + time.Second - 1) / time.Second)
	}
	return status, e
}

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
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	return json.NewEncoder(w).Encode(v)
}

// maxJSONBody bounds JSON request bodies; exec stdin rides in them.
const maxJSONBody = 64 << 20

// decodeJSON reads one JSON object strictly: unknown fields and trailing
// data are errors, so a typo like "memroy" fails loudly instead of being
// ignored.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxJSONBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return errdefs.Invalid("request body larger than %d bytes", mbe.Limit)
		}
		if errors.Is(err, io.EOF) {
			return errdefs.Invalid("empty request body: want a JSON object")
		}
		return errdefs.Invalid("malformed JSON: %v", err)
	}
	if dec.More() {
		return errdefs.Invalid("malformed JSON: data after the object")
	}
	return nil
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

// routeNode returns the node that owns a sandbox id. One node today; the
// id carries its node so many nodes need no lookup.
func (s *Server) routeNode(id string) (Node, error) {
	nid, _ := node.NodeOf(id)
	if nid != s.cfg.Node.ID() {
		return nil, errdefs.New(errdefs.ErrNotFound, api.CodeSandboxNotFound, "sandbox %s not found (no node %s)", id, nid)
	}
	return s.cfg.Node, nil
}

func (s *Server) sandboxNode(r *http.Request) (string, Node, error) {
	id, err := sandboxID(r)
	if err != nil {
		return "", nil, err
	}
	n, err := s.routeNode(id)
	return id, n, err
}
