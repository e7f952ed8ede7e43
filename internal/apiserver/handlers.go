package apiserver

import (
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/guard"
	"github.com/warrenhq/warren/internal/httperr"
	"github.com/warrenhq/warren/internal/node"
)

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateSandboxRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	sb, err := s.admitCreate(w, r, req, s.cluster.Create) // quota.go
	if err != nil {
		return err
	}
	s.metrics.created.Inc()
	w.Header().Set("Location", "/v1/sandboxes/"+sb.ID)
	return writeJSON(w, http.StatusCreated, sb)
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) error {
	scope, err := listScope(r) // auth.go
	if err != nil {
		return err
	}
	q := r.URL.Query()
	f := node.Filter{State: q.Get("state")}
	for _, l := range q["label"] {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return errdefs.Invalid("label filter %q: want key=value", l)
		}
		if f.Labels == nil {
			f.Labels = map[string]string{}
		}
		f.Labels[k] = v
	}
	list, err := s.cluster.List(r.Context(), f)
	if err != nil {
		return err
	}
	list = inScope(list, scope)
	return writeJSON(w, http.StatusOK, api.SandboxList{Sandboxes: list})
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) error {
	id, n, err := s.sandboxNode(r)
	if err != nil {
		return err
	}
	sb, err := n.Get(r.Context(), id)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, sb)
}

// deleteSandbox is idempotent: deleting a sandbox that is already gone
// answers 204 too, so callers can retry after a network error.
func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request) error {
	id, n, err := s.sandboxNode(r)
	if isHidden(err) { // gone, or outside the caller's scope: the same answer
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	if err != nil {
		return err
	}
	if err := n.Delete(r.Context(), id); err != nil {
		return err
	}
	s.deleted(id) // quota.go
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// wantsStream reports whether the caller asked for an NDJSON stream.
func wantsStream(r *http.Request, req api.ExecRequest) bool {
	if req.Stream {
		return true
	}
	for _, a := range strings.Split(r.Header.Get("Accept"), ",") {
		if mt, _, err := mime.ParseMediaType(strings.TrimSpace(a)); err == nil && mt == "application/x-ndjson" {
			return true
		}
	}
	return false
}

func (s *Server) exec(w http.ResponseWriter, r *http.Request) error {
	id, n, err := s.sandboxNode(r)
	if err != nil {
		return err
	}
	var req api.ExecRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	s.metrics.execs.Inc()
	if !wantsStream(r, req) {
		// Output is spooled (to the in-process node's data dir on
		// warren up), never held whole: see guard.ServeExec.
		return guard.ServeExec(w, spoolDir(n), func(stdout, stderr io.Writer) (api.ExecResult, error) {
			return n.Exec(r.Context(), id, req, stdout, stderr)
		})
	}
	st := newEventStream(w)
	res, err := n.Exec(r.Context(), id, req, st.writer("stdout"), st.writer("stderr"))
	if err != nil {
		if !st.started {
			return err // nothing sent yet: a normal error answer
		}
		_, e := apiError(err)
		return st.send(api.ExecEvent{Error: &e})
	}
	st.start()
	return st.send(api.ExecEvent{Result: &res})
}

// spoolDir is where buffered exec output past its in-memory threshold
// goes: the in-process node's data dir, else the temporary directory.
func spoolDir(n any) string {
	if d, ok := n.(interface{ SpoolDir() string }); ok {
		return d.SpoolDir()
	}
	return ""
}

// eventStream writes NDJSON exec events, one per line, flushed as they come.
// The headers go out with the first event, so an exec that fails before any
// output still gets a proper error status.
type eventStream struct {
	mu      sync.Mutex
	w       http.ResponseWriter
	enc     *json.Encoder
	started bool
	err     error
}

func newEventStream(w http.ResponseWriter) *eventStream {
	return &eventStream{w: w, enc: json.NewEncoder(w)}
}

func (e *eventStream) start() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.startLocked()
}

func (e *eventStream) startLocked() {
	if e.started {
		return
	}
	e.started = true
	e.w.Header().Set("Content-Type", "application/x-ndjson")
	e.w.Header().Set("X-Content-Type-Options", "nosniff")
	e.w.WriteHeader(http.StatusOK)
}

func (e *eventStream) send(ev api.ExecEvent) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.startLocked()
	if e.err != nil {
		return e.err
	}
	if err := e.enc.Encode(ev); err != nil {
		e.err = err
		return err
	}
	if f, ok := e.w.(http.Flusher); ok {
		f.Flush()
	}
	return nil
}

// writer returns an io.Writer that sends each write as one event. A caller
// that went away does not stop the command: the write is dropped (the exec
// ends with the request's context instead).
func (e *eventStream) writer(stream string) writerFunc {
	return func(p []byte) (int, error) {
		data, enc := api.EncodeBytes(p)
		e.send(api.ExecEvent{Stream: stream, Data: data, Encoding: enc})
		return len(p), nil
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func (s *Server) stat(w http.ResponseWriter, r *http.Request) error {
	id, n, err := s.sandboxNode(r)
	if err != nil {
		return err
	}
	fi, err := n.Stat(r.Context(), id, r.URL.Query().Get("path"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, fi)
}

const tarType = "application/x-tar"

func (s *Server) readFiles(w http.ResponseWriter, r *http.Request) error {
	id, n, err := s.sandboxNode(r)
	if err != nil {
		return err
	}
	p := r.URL.Query().Get("path")
	fi, err := n.Stat(r.Context(), id, p)
	if err != nil {
		return err
	}
	ctx := r.Context()
	if fi.IsDir || r.URL.Query().Get("format") == "tar" {
		w.Header().Set("Content-Type", tarType)
		// Errors after the first byte can only cut the stream short; the
		// tar then lacks its end marker, which readers detect.
		return httperr.Stream(w, s.log, func(cw io.Writer) error { return n.ReadTar(ctx, id, p, cw) })
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("X-Warren-File-Mode", fmt.Sprintf("%04o", fi.Mode))
	w.Header().Set("Content-Length", strconv.FormatInt(fi.Size, 10))
	return httperr.Stream(w, s.log, func(cw io.Writer) error { return n.ReadFile(ctx, id, p, cw) })
}

func (s *Server) writeFiles(w http.ResponseWriter, r *http.Request) error {
	id, n, err := s.sandboxNode(r)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	p := q.Get("path")
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if ct == tarType {
		if err := n.WriteTar(r.Context(), id, p, r.Body); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	mode := uint64(0o644)
	if m := q.Get("mode"); m != "" {
		mode, err = strconv.ParseUint(m, 8, 32)
		if err != nil || mode > 0o7777 {
			return errdefs.Invalid("mode %q: want octal permission bits like 0644", m)
		}
	}
	if err := n.WriteFile(r.Context(), id, p, uint32(mode), r.Body); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) listImages(w http.ResponseWriter, r *http.Request) error {
	imgs, err := s.cfg.Images.List(r.Context())
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, api.ImageList{Images: imgs})
}

func (s *Server) getImage(w http.ResponseWriter, r *http.Request) error {
	img, err := s.cfg.Images.Get(r.Context(), r.PathValue("name"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, img)
}

func (s *Server) listNodes(w http.ResponseWriter, r *http.Request) error {
	nodes, err := s.cluster.Nodes(r.Context())
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, api.NodeList{Nodes: nodes})
}
