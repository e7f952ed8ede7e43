// Package nodeapi is the node agent's HTTP API: what apiservers call to
// create sandboxes on one node, inspect and delete them, run commands in
// them, move files in and out, and poll the node's status. Server serves an
// agent on its --listen address; Client calls one node (creates, lists,
// gets and deletes typed; every other call on a sandbox forwarded as it
// came, Forward); Clients keeps one Client per node and polls them for the
// fleet watcher (fleet.StatusSource).
//
// The calls on one sandbox (/v1/sandboxes/{id}/exec, /files, /stat,
// /stats, ...) are REST v1's exactly, so that an apiserver forwards them
// as they come (Client.Forward; the apiserver's one path per verb) and the
// public SDKs speak to a node as they speak to an apiserver. Adding a verb
// on a sandbox takes a handler here, the agent's method and the backend's,
// and one rule line in the apiserver. A create differs from REST v1: it
// carries the image the apiserver already resolved, so a node reads no
// registry (it needs only the blob store). Errors are rendered and read
// with internal/httperr: a node's 429 node_full comes back to the
// apiserver as errdefs.ErrExhausted with its Retry-After. Bodies stream
// both ways; nothing is buffered whole.
//
// Every call but /healthz and /metrics carries a bearer token that the
// server's Authenticator accepts: the node's own secret (Secret), which its
// agent draws at every start and registers with the node
// (fleet.Registration), so that apiservers, and nobody else, know it. A
// node token (an IAM token of role node) is what an agent presents to
// register, never what the node API takes: one node's secret opens no
// other node. /metrics is open as an apiserver's is (ServeMetrics).
package nodeapi

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/fncall"
	"github.com/warrenhq/warren/internal/guard"
	"github.com/warrenhq/warren/internal/httperr"
	"github.com/warrenhq/warren/internal/node"
)

// Agent is what the server needs of a node agent; *node.Agent is one.
type Agent interface {
	ID() string
	Status() api.Node
	Create(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error)
	CreateFrom(ctx context.Context, req api.CreateSandboxRequest, img api.Image) (api.Sandbox, error)
	Get(ctx context.Context, id string) (api.Sandbox, error)
	List(ctx context.Context, f node.Filter) ([]api.Sandbox, error)
	Delete(ctx context.Context, id string) error
	Exec(ctx context.Context, id string, req api.ExecRequest, stdout, stderr io.Writer) (api.ExecResult, error)
	Stat(ctx context.Context, id, path string) (api.FileInfo, error)
	WriteFile(ctx context.Context, id, path string, mode uint32, r io.Reader) error
	ReadFile(ctx context.Context, id, path string, w io.Writer) error
	WriteTar(ctx context.Context, id, dir string, r io.Reader) error
	ReadTar(ctx context.Context, id, path string, w io.Writer) error
	Stats(ctx context.Context, id string) (api.SandboxStats, error)
	Pack(ctx context.Context, id string, req api.PackRequest) (api.PackResult, error)
	Pause(ctx context.Context, id, by string) (api.Sandbox, error)
	Resume(ctx context.Context, id, by string) (api.Sandbox, error)
	Update(ctx context.Context, id string, u api.SandboxUpdate) (api.Sandbox, error)
	Journal(ctx context.Context, id string, since int64) (api.Journal, error)
	Screen(ctx context.Context, id string) ([]byte, error)
	Input(ctx context.Context, id string, req api.InputRequest) error
	UpdateNetwork(ctx context.Context, id string, u api.NetworkUpdate) (api.SandboxNetwork, error)
	// Ports and DialPort reach a sandbox's ports (ports.go).
	Ports(ctx context.Context, id string) (dial node.PortDial, done func(error) error, err error)
	DialPort(ctx context.Context, id string, port int) (net.Conn, error)
}

var _ Agent = (*node.Agent)(nil)

// Authenticator checks the bearer token of a call to the node API.
type Authenticator interface {
	// Check returns nil if token may call the node, or an
	// ErrUnauthenticated.
	Check(ctx context.Context, token string) error
}

// Secret is a node's own secret: the one token its node API accepts,
// compared in constant time. An empty Secret accepts nothing.
type Secret string

// Check implements Authenticator.
func (s Secret) Check(_ context.Context, token string) error {
	want, got := sha256.Sum256([]byte(s)), sha256.Sum256([]byte(token))
	if s == "" || subtle.ConstantTimeCompare(want[:], got[:]) != 1 {
		return errdefs.New(errdefs.ErrUnauthenticated, api.CodeUnauthenticated, "invalid node token")
	}
	return nil
}

// CreateRequest is the body of POST /v1/sandboxes on the node API.
type CreateRequest struct {
	Request api.CreateSandboxRequest `json:"request"`
	// Image is what Request's image or layers resolve to; nil makes the
	// node resolve them itself, if it can.
	Image *api.Image `json:"image,omitempty"`
}

// Event is one line of an exec stream: the node API's streams are REST v1's
// (an error event carries its HTTP status, api.ExecEvent.Status), so an
// apiserver passes them through as they come.
type Event = api.ExecEvent

const (
	tarType    = "application/x-tar"
	ndjsonType = "application/x-ndjson"
)

// Server serves the node API of one agent.
type Server struct {
	agent Agent
	auth  Authenticator
	log   *slog.Logger
	mux   *http.ServeMux
	fn    fncall.Runner // nil: no FnCall here (fn.go)
}

// NewServer returns the node API over agent; every call but /healthz must
// carry a token auth accepts.
func NewServer(agent Agent, auth Authenticator, log *slog.Logger) *Server {
	if log == nil {
		log = slog.Default()
	}
	s := &Server{agent: agent, auth: auth, log: log, mux: http.NewServeMux()}
	s.routes()
	return s
}

// ServeMetrics makes the server serve GET /metrics with h, a Prometheus
// handler of the node's metrics (without it, /metrics is no route).
// Like /healthz, and like an apiserver's /metrics, it takes no token: a
// Prometheus server scrapes every node, and the node's secret is for
// apiservers only; what it shows is counters, no sandbox's data. Call it
// once, before the server serves. It returns s.
func (s *Server) ServeMetrics(h http.Handler) *Server {
	if h != nil {
		s.mux.Handle("GET /metrics", h)
	}
	return s
}

// ServeHTTP makes Server an http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

type handler func(w http.ResponseWriter, r *http.Request) error

func (s *Server) routes() {
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	h := s.authenticated
	s.mux.Handle("GET /v1/status", h(s.status))
	s.mux.Handle("POST /v1/sandboxes", h(s.create))
	s.mux.Handle("GET /v1/sandboxes", h(s.list))
	s.mux.Handle("GET /v1/changes", h(s.changes)) // changes.go
	s.mux.Handle("GET /v1/sandboxes/{id}", h(s.get))
	s.mux.Handle("DELETE /v1/sandboxes/{id}", h(s.delete))
	s.mux.Handle("POST /v1/sandboxes/{id}/exec", h(s.exec))
	s.mux.Handle("GET /v1/sandboxes/{id}/stat", h(s.stat))
	s.mux.Handle("GET /v1/sandboxes/{id}/files", h(s.readFiles))
	s.mux.Handle("PUT /v1/sandboxes/{id}/files", h(s.writeFiles))
	s.mux.Handle("GET /v1/sandboxes/{id}/stats", h(s.stats))
	// The node's half of POST /v1/sandboxes/{id}/snapshot, which the
	// apiserver serves itself (its records are the control plane's).
	s.mux.Handle("POST /v1/sandboxes/{id}/pack", h(s.pack))
	s.mux.Handle("PATCH /v1/sandboxes/{id}/network", h(s.network))
	s.mux.Handle("PATCH /v1/sandboxes/{id}", h(s.update))
	s.mux.Handle("GET /v1/sandboxes/{id}/journal", h(s.journal))
	s.mux.Handle("GET /v1/sandboxes/{id}/screen", h(s.screen))
	s.mux.Handle("POST /v1/sandboxes/{id}/input", h(s.input))
	s.mux.Handle("POST /v1/sandboxes/{id}/pause", h(s.pause))
	s.mux.Handle("POST /v1/sandboxes/{id}/resume", h(s.pause))
	s.portRoutes() // ports.go
	s.mux.Handle("/", h(func(w http.ResponseWriter, r *http.Request) error {
		return errdefs.New(errdefs.ErrNotFound, api.CodeNotFound, "no node API route for %s %s", r.Method, r.URL.Path)
	}))
}

func (s *Server) authenticated(h handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		var err error
		if !ok || tok == "" {
			err = errdefs.New(errdefs.ErrUnauthenticated, api.CodeUnauthenticated, "missing bearer token")
		} else {
			err = s.auth.Check(r.Context(), tok)
		}
		if err == nil {
			err = h(w, r)
		}
		if err != nil {
			if httperr.Write(w, err) == http.StatusInternalServerError {
				s.log.Error("node API call failed", "method", r.Method, "path", r.URL.Path, "err", err)
			}
		}
	})
}

func (s *Server) status(w http.ResponseWriter, r *http.Request) error {
	return httperr.WriteJSON(w, http.StatusOK, s.withFn(r.Context(), s.agent.Status()))
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) error {
	var req CreateRequest
	if err := httperr.DecodeJSON(w, r, &req); err != nil {
		return err
	}
	var sb api.Sandbox
	var err error
	if req.Image != nil {
		sb, err = s.agent.CreateFrom(r.Context(), req.Request, *req.Image)
	} else {
		sb, err = s.agent.Create(r.Context(), req.Request)
	}
	if err != nil {
		return err
	}
	return httperr.WriteJSON(w, http.StatusCreated, sb)
}

// ParseFilter reads a list filter from ?state= and repeated ?label=k=v.
func ParseFilter(q map[string][]string) (node.Filter, error) {
	f := node.Filter{}
	if st := q["state"]; len(st) > 0 {
		f.State = st[0]
	}
	for _, l := range q["label"] {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return node.Filter{}, errdefs.Invalid("label filter %q: want key=value", l)
		}
		if f.Labels == nil {
			f.Labels = map[string]string{}
		}
		f.Labels[k] = v
	}
	return f, nil
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) error {
	f, err := ParseFilter(r.URL.Query())
	if err != nil {
		return err
	}
	list, err := s.agent.List(r.Context(), f)
	if err != nil {
		return err
	}
	return httperr.WriteJSON(w, http.StatusOK, api.SandboxList{Sandboxes: list})
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.agent.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	return httperr.WriteJSON(w, http.StatusOK, sb)
}

func (s *Server) delete(w http.ResponseWriter, r *http.Request) error {
	if err := s.agent.Delete(r.Context(), r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) exec(w http.ResponseWriter, r *http.Request) error {
	var req api.ExecRequest
	if err := httperr.DecodeJSON(w, r, &req); err != nil {
		return err
	}
	id := r.PathValue("id")
	if !WantsStream(r, req) {
		return guard.ServeExec(w, spoolDir(s.agent), func(stdout, stderr io.Writer) (api.ExecResult, error) {
			return s.agent.Exec(r.Context(), id, req, stdout, stderr)
		})
	}
	st := &stream{w: w, enc: json.NewEncoder(w)}
	res, err := s.agent.Exec(r.Context(), id, req, st.writer("stdout"), st.writer("stderr"))
	if err != nil {
		if !st.started() {
			return err // nothing sent yet: a normal error answer
		}
		status, e := httperr.ToAPI(err)
		return st.send(Event{Error: &e, Status: status})
	}
	return st.send(Event{Result: &res})
}

// WantsStream reports whether an exec asks for an NDJSON stream: "stream"
// in its body, or an Accept of application/x-ndjson.
func WantsStream(r *http.Request, req api.ExecRequest) bool {
	if req.Stream {
		return true
	}
	for _, a := range strings.Split(r.Header.Get("Accept"), ",") {
		if mt, _, err := mime.ParseMediaType(strings.TrimSpace(a)); err == nil && mt == ndjsonType {
			return true
		}
	}
	return false
}

// spoolDir is where an agent spools buffered exec output: *node.Agent's
// data dir, else the system's temporary directory.
func spoolDir(a any) string {
	if d, ok := a.(interface{ SpoolDir() string }); ok {
		return d.SpoolDir()
	}
	return ""
}

// stream writes exec events as NDJSON, flushing each. Headers go out with
// the first event, so an exec that fails before any output gets a proper
// error status.
type stream struct {
	mu   sync.Mutex
	w    http.ResponseWriter
	enc  *json.Encoder
	sent bool
	err  error
}

func (s *stream) started() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sent
}

func (s *stream) send(ev Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.sent {
		s.sent = true
		s.w.Header().Set("Content-Type", ndjsonType)
		s.w.Header().Set("X-Content-Type-Options", "nosniff")
		s.w.WriteHeader(http.StatusOK)
	}
	if s.err != nil {
		return s.err
	}
	if err := s.enc.Encode(ev); err != nil {
		s.err = err
		return err
	}
	if f, ok := s.w.(http.Flusher); ok {
		f.Flush()
	}
	return nil
}

// writer sends each write as one event. A caller that went away does not
// fail the command's writes: the exec ends with the request's context.
func (s *stream) writer(name string) io.Writer {
	return writerFunc(func(p []byte) (int, error) {
		data, enc := api.EncodeBytes(p)
		s.send(Event{Stream: name, Data: data, Encoding: enc})
		return len(p), nil
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func (s *Server) stat(w http.ResponseWriter, r *http.Request) error {
	fi, err := s.agent.Stat(r.Context(), r.PathValue("id"), r.URL.Query().Get("path"))
	if err != nil {
		return err
	}
	return httperr.WriteJSON(w, http.StatusOK, fi)
}

// readFiles streams a tar of a path (?format=tar, or a directory) or one
// regular file, with its size and mode in the headers.
func (s *Server) readFiles(w http.ResponseWriter, r *http.Request) error {
	id, q := r.PathValue("id"), r.URL.Query()
	p := q.Get("path")
	ctx := r.Context()
	format := q.Get("format")
	switch format {
	case "", "file", "tar":
	default:
		return errdefs.Invalid("format %q: want file or tar", format)
	}
	if format != "tar" {
		fi, err := s.agent.Stat(ctx, id, p)
		if err != nil {
			return err
		}
		if fi.IsDir {
			format = "tar"
		} else {
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Header().Set("X-Warren-File-Mode", fmt.Sprintf("%04o", fi.Mode))
			w.Header().Set("Content-Length", strconv.FormatInt(fi.Size, 10))
		}
	}
	read := func(cw io.Writer) error { return s.agent.ReadFile(ctx, id, p, cw) }
	if format == "tar" {
		w.Header().Set("Content-Type", tarType)
		read = func(cw io.Writer) error { return s.agent.ReadTar(ctx, id, p, cw) }
	}
	return httperr.Stream(w, s.log.With("sandbox", id, "path", p), read)
}

func (s *Server) writeFiles(w http.ResponseWriter, r *http.Request) error {
	id, q := r.PathValue("id"), r.URL.Query()
	p := q.Get("path")
	var err error
	if ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); ct == tarType {
		err = s.agent.WriteTar(r.Context(), id, p, r.Body)
	} else {
		mode := uint64(0o644)
		if m := q.Get("mode"); m != "" {
			if mode, err = strconv.ParseUint(m, 8, 32); err != nil || mode > 0o7777 {
				return errdefs.Invalid("mode %q: want octal permission bits like 0644", m)
			}
		}
		err = s.agent.WriteFile(r.Context(), id, p, uint32(mode), r.Body)
	}
	if err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) network(w http.ResponseWriter, r *http.Request) error {
	var u api.NetworkUpdate
	if err := httperr.DecodeJSON(w, r, &u); err != nil {
		return err
	}
	n, err := s.agent.UpdateNetwork(r.Context(), r.PathValue("id"), u)
	if err != nil {
		return err
	}
	return httperr.WriteJSON(w, http.StatusOK, n)
}

func (s *Server) pack(w http.ResponseWriter, r *http.Request) error {
	var req api.PackRequest
	if err := httperr.DecodeJSON(w, r, &req); err != nil {
		return err
	}
	res, err := s.agent.Pack(r.Context(), r.PathValue("id"), req)
	if err != nil {
		return err
	}
	return httperr.WriteJSON(w, http.StatusOK, res)
}

func (s *Server) journal(w http.ResponseWriter, r *http.Request) error {
	var since int64
	if v := r.URL.Query().Get("since"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return errdefs.Invalid("since %q: want a sequence number (0 or more)", v)
		}
		since = n
	}
	j, err := s.agent.Journal(r.Context(), r.PathValue("id"), since)
	if err != nil {
		return err
	}
	return httperr.WriteJSON(w, http.StatusOK, j)
}

// screen: GET /v1/sandboxes/{id}/screen answers image/png.
func (s *Server) screen(w http.ResponseWriter, r *http.Request) error {
	b, err := s.agent.Screen(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "image/png")
	w.WriteHeader(http.StatusOK)
	_, err = w.Write(b)
	return err
}

// input: POST /v1/sandboxes/{id}/input with an api.InputRequest; 204.
func (s *Server) input(w http.ResponseWriter, r *http.Request) error {
	var req api.InputRequest
	if err := httperr.DecodeJSON(w, r, &req); err != nil {
		return err
	}
	if err := s.agent.Input(r.Context(), r.PathValue("id"), req); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) update(w http.ResponseWriter, r *http.Request) error {
	var u api.SandboxUpdate
	if err := httperr.DecodeJSON(w, r, &u); err != nil {
		return err
	}
	sb, err := s.agent.Update(r.Context(), r.PathValue("id"), u)
	if err != nil {
		return err
	}
	return httperr.WriteJSON(w, http.StatusOK, sb)
}

// pause serves POST .../pause and .../resume: ?by= says who pauses
// (api.PauseInfo.By; default "caller").
func (s *Server) pause(w http.ResponseWriter, r *http.Request) error {
	by := r.URL.Query().Get("by")
	if by == "" {
		by = node.PausedByCaller
	}
	if len(by) > 32 {
		return errdefs.Invalid("by %q: at most 32 bytes", by)
	}
	f := s.agent.Pause
	if strings.HasSuffix(r.URL.Path, "/resume") {
		f = s.agent.Resume
	}
	sb, err := f(r.Context(), r.PathValue("id"), by)
	if err != nil {
		return err
	}
	return httperr.WriteJSON(w, http.StatusOK, sb)
}

func (s *Server) stats(w http.ResponseWriter, r *http.Request) error {
	st, err := s.agent.Stats(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	return httperr.WriteJSON(w, http.StatusOK, st)
}
