// Package clienttest is an in-memory fake of warren's REST v1 API, for tests
// of programs built on the client package or the warren CLI. It keeps
// sandboxes and their files in memory and runs exec through a pluggable
// function; nothing is isolated or limited except output size. Like the
// client, it depends on api/ and the standard library only.
package clienttest

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/warrenhq/warren/api"
)

// ExecFunc runs one command for the fake. It writes output to stdout and
// stderr (each Write becomes one chunk of a stream) and returns the exit
// status in ExitCode, TimedOut and Signal; the server fills in the output
// fields. An error becomes an error event (or an error answer when
// buffered); use Fail to choose its code.
type ExecFunc func(ctx context.Context, sb api.Sandbox, req api.ExecRequest, stdin []byte, stdout, stderr io.Writer) (api.ExecResult, error)

// Option configures a Server.
type Option func(*Server)

// WithToken makes the server require "Authorization: Bearer token".
func WithToken(token string) Option { return func(s *Server) { s.token = token } }

// WithExec replaces DefaultExec.
func WithExec(f ExecFunc) Option { return func(s *Server) { s.exec = f } }

// WithIntercept installs a hook that sees every request first; when it
// returns true it has answered and the fake does nothing more. Use it to
// inject refusals (429 with Retry-After, 503) or to record requests.
func WithIntercept(f func(w http.ResponseWriter, r *http.Request) bool) Option {
	return func(s *Server) { s.intercept = f }
}

// WithImages sets the images the server knows (default: "busybox").
func WithImages(images ...api.Image) Option { return func(s *Server) { s.images = images } }

// Server is a running fake. Close it when done.
type Server struct {
	URL string

	srv       *httptest.Server
	token     string
	exec      ExecFunc
	intercept func(http.ResponseWriter, *http.Request) bool
	images    []api.Image
	nodes     []api.Node

	mu        sync.Mutex
	seq       int
	sandboxes map[string]*sandbox
}

type sandbox struct {
	api.Sandbox
	files map[string]*node // clean absolute path -> node
}

type node struct {
	dir   bool
	link  string // symlink target, when not "" (never followed by the fake)
	mode  fs.FileMode
	data  []byte
	mtime time.Time
}

// NewServer starts a fake on a local port.
func NewServer(opts ...Option) *Server {
	s := &Server{
		exec:      DefaultExec,
		images:    []api.Image{{Name: "busybox", Layers: []string{"sha256:fake"}, Size: 1 << 20}},
		sandboxes: map[string]*sandbox{},
	}
	for _, o := range opts {
		o(s)
	}
	s.nodes = []api.Node{{
		ID: "n1", Address: "127.0.0.1", Backends: []string{api.BackendContainer},
		Capacity: api.Capacity{CPU: 2, Memory: 4 << 30, Sandboxes: 100}, Healthy: true,
		Runtimes: []api.NodeRuntime{{Backend: api.BackendContainer, Name: api.RuntimeRunc, Available: true},
			{Backend: api.BackendContainer, Name: api.RuntimeGVisor, Available: true}},
	}}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	s.URL = s.srv.URL
	return s
}

// Close stops the server.
func (s *Server) Close() { s.srv.Close() }

// Sandbox returns a copy of a sandbox's API view.
func (s *Server) Sandbox(id string) (api.Sandbox, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[id]
	if !ok {
		return api.Sandbox{}, false
	}
	return sb.Sandbox, true
}

// PutFile writes a file into a sandbox, creating parent directories.
func (s *Server) PutFile(id, p string, data []byte, mode fs.FileMode) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[id]
	if !ok {
		return fmt.Errorf("no sandbox %s", id)
	}
	p = path.Clean(p)
	if err := sb.mkdirAll(path.Dir(p)); err != nil {
		return err
	}
	sb.files[p] = &node{mode: mode.Perm(), data: bytes.Clone(data), mtime: time.Now()}
	return nil
}

// File returns a file's content and mode; ok is false for a missing path or
// a directory.
func (s *Server) File(id, p string) (data []byte, mode fs.FileMode, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, found := s.sandboxes[id]
	if !found {
		return nil, 0, false
	}
	n, found := sb.files[path.Clean(p)]
	if !found || n.dir || n.link != "" {
		return nil, 0, false
	}
	return bytes.Clone(n.data), n.mode, true
}

// IsDir reports whether p is a directory in the sandbox.
func (s *Server) IsDir(id, p string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[id]
	if !ok {
		return false
	}
	n, ok := sb.files[path.Clean(p)]
	return ok && n.dir
}

// Fail returns an error that the fake answers with the given status and
// code (from an ExecFunc, say).
func Fail(status int, code, message string) error {
	return &failure{status: status, e: api.Error{Code: code, Message: message}}
}

type failure struct {
	status int
	e      api.Error
}

func (f *failure) Error() string { return f.e.Message }

// WriteError writes a warren error answer, with Retry-After when
// retryAfter > 0.
func WriteError(w http.ResponseWriter, status int, code, message string, retryAfter int) {
	if retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
	}
	writeJSON(w, status, api.ErrorBody{Error: api.Error{Code: code, Message: message, RetryAfter: retryAfter}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if s.intercept != nil && s.intercept(w, r) {
		return
	}
	if r.URL.Path == "/healthz" {
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "ok\n")
		return
	}
	if s.token != "" && r.Header.Get("Authorization") != "Bearer "+s.token {
		WriteError(w, http.StatusUnauthorized, api.CodeUnauthenticated, "missing or invalid bearer token", 0)
		return
	}
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	switch {
	case r.URL.Path == "/v1/images" && r.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, api.ImageList{Images: s.images})
	case r.URL.Path == "/v1/nodes" && r.Method == http.MethodGet:
		s.mu.Lock()
		nodes := append([]api.Node(nil), s.nodes...)
		nodes[0].Usage.Sandboxes = len(s.sandboxes)
		s.mu.Unlock()
		writeJSON(w, http.StatusOK, api.NodeList{Nodes: nodes})
	case r.URL.Path == "/v1/sandboxes" && r.Method == http.MethodPost:
		s.create(w, r)
	case r.URL.Path == "/v1/sandboxes:batch" && r.Method == http.MethodPost:
		s.createBatch(w, r)
	case r.URL.Path == "/v1/sandboxes" && r.Method == http.MethodGet:
		s.list(w, r)
	case len(parts) == 3 && parts[0] == "v1" && parts[1] == "sandboxes":
		switch r.Method {
		case http.MethodGet:
			s.mu.Lock()
			sb, ok := s.sandboxes[parts[2]]
			var v api.Sandbox
			if ok {
				v = sb.Sandbox
			}
			s.mu.Unlock()
			if !ok {
				WriteError(w, http.StatusNotFound, api.CodeSandboxNotFound, "sandbox "+parts[2]+" not found", 0)
				return
			}
			writeJSON(w, http.StatusOK, v)
		case http.MethodDelete:
			s.mu.Lock()
			delete(s.sandboxes, parts[2])
			s.mu.Unlock()
			w.WriteHeader(http.StatusNoContent)
		default:
			WriteError(w, http.StatusMethodNotAllowed, api.CodeInvalid, "method not allowed", 0)
		}
	case len(parts) == 4 && parts[0] == "v1" && parts[1] == "sandboxes":
		s.mu.Lock()
		_, ok := s.sandboxes[parts[2]]
		s.mu.Unlock()
		if !ok {
			WriteError(w, http.StatusNotFound, api.CodeSandboxNotFound, "sandbox "+parts[2]+" not found", 0)
			return
		}
		switch {
		case parts[3] == "exec" && r.Method == http.MethodPost:
			s.execute(w, r, parts[2])
		case parts[3] == "files" && r.Method == http.MethodPut:
			s.putFiles(w, r, parts[2])
		case parts[3] == "files" && r.Method == http.MethodGet:
			s.getFiles(w, r, parts[2])
		case parts[3] == "stat" && r.Method == http.MethodGet:
			s.stat(w, r, parts[2])
		case parts[3] == "network" && r.Method == http.MethodPatch:
			s.network(w, r, parts[2])
		default:
			WriteError(w, http.StatusNotFound, api.CodeNotFound, "no route "+r.Method+" "+r.URL.Path, 0)
		}
	default:
		WriteError(w, http.StatusNotFound, api.CodeNotFound, "no route "+r.Method+" "+r.URL.Path, 0)
	}
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var req api.CreateSandboxRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		WriteError(w, http.StatusBadRequest, api.CodeInvalid, "bad body: "+err.Error(), 0)
		return
	}
	if !s.checkCreate(w, req) {
		return
	}
	writeJSON(w, http.StatusCreated, s.add(req))
}

// createBatch serves POST /v1/sandboxes:batch: every member or none.
func (s *Server) createBatch(w http.ResponseWriter, r *http.Request) {
	var req api.BatchCreateRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		WriteError(w, http.StatusBadRequest, api.CodeInvalid, "bad body: "+err.Error(), 0)
		return
	}
	if req.Count < 1 {
		WriteError(w, http.StatusBadRequest, api.CodeInvalid, "count must be at least 1", 0)
		return
	}
	if !s.checkCreate(w, req.Template) {
		return
	}
	s.mu.Lock()
	gang := fmt.Sprintf("g-%06d", s.seq+1)
	s.mu.Unlock()
	out := api.BatchCreateResponse{Gang: gang}
	for i := range req.Count {
		m := req.Template
		m.Labels = map[string]string{api.LabelGang: gang, api.LabelGangIndex: strconv.Itoa(i)}
		for k, v := range req.Template.Labels {
			m.Labels[k] = v
		}
		out.Sandboxes = append(out.Sandboxes, s.add(m))
	}
	writeJSON(w, http.StatusCreated, out)
}

// checkCreate writes the error of a create it refuses.
func (s *Server) checkCreate(w http.ResponseWriter, req api.CreateSandboxRequest) bool {
	if req.Image == "" {
		WriteError(w, http.StatusBadRequest, api.CodeInvalid, "image is required", 0)
		return false
	}
	found := false
	for _, im := range s.images {
		found = found || im.Name == req.Image
	}
	if !found {
		WriteError(w, http.StatusNotFound, api.CodeImageNotFound, "image "+req.Image+" not found", 0)
		return false
	}
	return true
}

// add creates the sandbox req asks for.
func (s *Server) add(req api.CreateSandboxRequest) api.Sandbox {
	if req.Backend == "" {
		req.Backend = api.BackendContainer
	}
	if req.Backend == api.BackendContainer && req.Runtime == "" {
		req.Runtime = api.RuntimeRunc
	}
	if req.Resources.CPU == 0 {
		req.Resources.CPU = 1
	}
	if req.Resources.Memory == 0 {
		req.Resources.Memory = 512 << 20
	}
	now := time.Now().UTC()
	s.mu.Lock()
	s.seq++
	sb := &sandbox{
		Sandbox: api.Sandbox{
			ID: fmt.Sprintf("n1-%06d", s.seq), Node: "n1", Backend: req.Backend, Runtime: req.Runtime, Image: req.Image,
			State: api.StateRunning, Resources: req.Resources, Env: req.Env, Labels: req.Labels,
			TTL: req.TTL, IdleTimeout: req.IdleTimeout, CreatedAt: now, LastUsedAt: now,
		},
		files: map[string]*node{},
	}
	for _, d := range []string{"/", "/tmp", "/work"} {
		sb.files[d] = &node{dir: true, mode: 0o755, mtime: now}
	}
	if req.Network.Networked() {
		n := &api.SandboxNetwork{NetworkPolicy: *req.Network, Address: "10.213.0.2"}
		if n.Mode == "" {
			n.Mode = api.NetworkAllowlist
		}
		sb.Network = n
	}
	s.sandboxes[sb.ID] = sb
	v := sb.Sandbox
	s.mu.Unlock()
	return v
}

// network applies a PATCH .../network as the API does, without checking
// entries: mode and allow replace, add and remove edit.
func (s *Server) network(w http.ResponseWriter, r *http.Request, id string) {
	var u api.NetworkUpdate
	if err := json.NewDecoder(r.Body).Decode(&u); err != nil {
		WriteError(w, http.StatusBadRequest, api.CodeInvalid, err.Error(), 0)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sb := s.sandboxes[id]
	n := api.SandboxNetwork{NetworkPolicy: api.NetworkPolicy{Mode: api.NetworkNone}}
	if sb.Network != nil {
		n = *sb.Network
	}
	if u.Mode != nil {
		n.Mode, n.Allow = *u.Mode, nil
	}
	if u.Allow != nil {
		n.Allow = *u.Allow
		if u.Mode == nil {
			n.Mode = api.NetworkAllowlist
		}
	}
	if len(u.Add) > 0 && n.Mode == api.NetworkNone {
		n.Mode = api.NetworkAllowlist
	}
	n.Allow = append(n.Allow, u.Add...)
	n.Allow = slices.DeleteFunc(n.Allow, func(e string) bool { return slices.Contains(u.Remove, e) })
	switch n.Mode {
	case api.NetworkNone:
		sb.Network = nil
	case api.NetworkAllowlist, api.NetworkOpen:
		n.Address = "10.213.0.2"
		sb.Network = &n
	default:
		WriteError(w, http.StatusBadRequest, api.CodeInvalid, "network: unknown mode "+n.Mode, 0)
		return
	}
	writeJSON(w, http.StatusOK, n)
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	want := map[string]string{}
	for _, l := range r.URL.Query()["label"] {
		k, v, _ := strings.Cut(l, "=")
		want[k] = v
	}
	state := r.URL.Query().Get("state")
	s.mu.Lock()
	out := []api.Sandbox{}
	for _, sb := range s.sandboxes {
		ok := state == "" || sb.State == state
		for k, v := range want {
			ok = ok && sb.Labels[k] == v
			if _, has := sb.Labels[k]; !has {
				ok = false
			}
		}
		if ok {
			out = append(out, sb.Sandbox)
		}
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	writeJSON(w, http.StatusOK, api.SandboxList{Sandboxes: out})
}

// capWriter keeps at most max bytes of what is written and counts the rest.
type capWriter struct {
	max       int64
	total     int64
	truncated bool
	emit      func(p []byte) // receives the kept part of each write
}

func (c *capWriter) Write(p []byte) (int, error) {
	c.total += int64(len(p))
	keep := p
	if room := c.max - (c.total - int64(len(p))); room < int64(len(p)) {
		if room < 0 {
			room = 0
		}
		keep = p[:room]
		c.truncated = true
	}
	if len(keep) > 0 {
		c.emit(keep)
	}
	return len(p), nil
}

func encode(b []byte) (string, string) {
	if utf8.Valid(b) {
		return string(b), api.EncodingUTF8
	}
	return base64.StdEncoding.EncodeToString(b), api.EncodingBase64
}

func (s *Server) execute(w http.ResponseWriter, r *http.Request, id string) {
	var req api.ExecRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		WriteError(w, http.StatusBadRequest, api.CodeInvalid, "bad body: "+err.Error(), 0)
		return
	}
	if (len(req.Argv) == 0) == (req.Cmd == "") {
		WriteError(w, http.StatusBadRequest, api.CodeInvalid, "exactly one of argv and cmd is required", 0)
		return
	}
	var stdin []byte
	switch req.StdinEncoding {
	case api.EncodingUTF8:
		stdin = []byte(req.Stdin)
	case api.EncodingBase64:
		b, err := base64.StdEncoding.DecodeString(req.Stdin)
		if err != nil {
			WriteError(w, http.StatusBadRequest, api.CodeInvalid, "bad base64 stdin", 0)
			return
		}
		stdin = b
	default:
		WriteError(w, http.StatusBadRequest, api.CodeInvalid, "bad stdin_encoding", 0)
		return
	}
	s.mu.Lock()
	sb := s.sandboxes[id].Sandbox
	s.mu.Unlock()
	limit := int64(req.MaxOutput)
	if limit <= 0 {
		limit = 1 << 20
	}
	stream := req.Stream || strings.Contains(r.Header.Get("Accept"), "application/x-ndjson")

	var mu sync.Mutex
	var outBuf, errBuf bytes.Buffer
	var enc *json.Encoder
	flusher, _ := w.(http.Flusher)
	if stream {
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusOK)
		enc = json.NewEncoder(w)
	}
	emitter := func(name string, buf *bytes.Buffer) func([]byte) {
		return func(p []byte) {
			mu.Lock()
			defer mu.Unlock()
			if !stream {
				buf.Write(p)
				return
			}
			data, e := encode(p)
			_ = enc.Encode(api.ExecEvent{Stream: name, Data: data, Encoding: e})
			if flusher != nil {
				flusher.Flush()
			}
		}
	}
	stdout := &capWriter{max: limit, emit: emitter("stdout", &outBuf)}
	stderr := &capWriter{max: limit, emit: emitter("stderr", &errBuf)}
	res, err := s.exec(r.Context(), sb, req, stdin, stdout, stderr)
	if err != nil {
		f := &failure{status: http.StatusInternalServerError, e: api.Error{Code: api.CodeInternal, Message: err.Error()}}
		errors.As(err, &f)
		if stream {
			_ = enc.Encode(api.ExecEvent{Error: &f.e})
		} else {
			WriteError(w, f.status, f.e.Code, f.e.Message, f.e.RetryAfter)
		}
		return
	}
	res.StdoutBytes, res.StderrBytes = stdout.total, stderr.total
	res.StdoutTruncated, res.StderrTruncated = stdout.truncated, stderr.truncated
	if stream {
		res.Stdout, res.Stderr, res.StdoutEncoding, res.StderrEncoding = "", "", "", ""
		_ = enc.Encode(api.ExecEvent{Result: &res})
		return
	}
	res.Stdout, res.StdoutEncoding = encode(outBuf.Bytes())
	res.Stderr, res.StderrEncoding = encode(errBuf.Bytes())
	writeJSON(w, http.StatusOK, res)
}

// DefaultExec understands a few commands, enough to test a client:
// "echo ARGS..." (stdout), "warn ARGS..." (stderr), "cat" (stdin to stdout),
// "exit N", "true", "false", "sleep DURATION" (honours req.Timeout: a
// timeout is reported as TimedOut with SIGKILL). Cmd is split on spaces.
// Anything else exits 127 with "not found" on stderr.
func DefaultExec(ctx context.Context, sb api.Sandbox, req api.ExecRequest, stdin []byte, stdout, stderr io.Writer) (api.ExecResult, error) {
	argv := req.Argv
	if req.Cmd != "" {
		argv = strings.Fields(req.Cmd)
	}
	if len(argv) == 0 {
		return api.ExecResult{}, Fail(http.StatusBadRequest, api.CodeInvalid, "empty command")
	}
	switch argv[0] {
	case "echo":
		_, _ = io.WriteString(stdout, strings.Join(argv[1:], " ")+"\n")
	case "warn":
		_, _ = io.WriteString(stderr, strings.Join(argv[1:], " ")+"\n")
	case "cat":
		_, _ = stdout.Write(stdin)
	case "true":
	case "false":
		return api.ExecResult{ExitCode: 1}, nil
	case "exit":
		n := 0
		if len(argv) > 1 {
			n, _ = strconv.Atoi(argv[1])
		}
		return api.ExecResult{ExitCode: n}, nil
	case "sleep":
		d := time.Second
		if len(argv) > 1 {
			if v, err := time.ParseDuration(argv[1]); err == nil {
				d = v
			} else if n, err := strconv.ParseFloat(argv[1], 64); err == nil {
				d = time.Duration(n * float64(time.Second))
			}
		}
		if t := req.Timeout.D(); t > 0 && d > t {
			select {
			case <-time.After(t):
			case <-ctx.Done():
			}
			return api.ExecResult{ExitCode: 137, TimedOut: true, Signal: "SIGKILL", DurationMs: t.Milliseconds()}, nil
		}
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return api.ExecResult{ExitCode: 137, Signal: "SIGKILL"}, nil
		}
	default:
		fmt.Fprintf(stderr, "%s: not found\n", argv[0])
		return api.ExecResult{ExitCode: 127}, nil
	}
	return api.ExecResult{}, nil
}

// --- files ---

func (sb *sandbox) mkdirAll(p string) error {
	p = path.Clean(p)
	if n, ok := sb.files[p]; ok {
		if !n.dir {
			return fmt.Errorf("%s is not a directory", p)
		}
		return nil
	}
	if p != "/" {
		if err := sb.mkdirAll(path.Dir(p)); err != nil {
			return err
		}
	}
	sb.files[p] = &node{dir: true, mode: 0o755, mtime: time.Now()}
	return nil
}

func absPath(w http.ResponseWriter, r *http.Request) (string, bool) {
	p := r.URL.Query().Get("path")
	if !path.IsAbs(p) {
		WriteError(w, http.StatusBadRequest, api.CodeInvalid, "path must be absolute", 0)
		return "", false
	}
	return path.Clean(p), true
}

func (s *Server) putFiles(w http.ResponseWriter, r *http.Request, id string) {
	p, ok := absPath(w, r)
	if !ok {
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		WriteError(w, http.StatusBadRequest, api.CodeInvalid, "read body: "+err.Error(), 0)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sb := s.sandboxes[id]
	if r.Header.Get("Content-Type") == "application/x-tar" {
		if err := sb.mkdirAll(p); err != nil {
			WriteError(w, http.StatusConflict, api.CodeConflict, err.Error(), 0)
			return
		}
		if err := sb.untar(p, bytes.NewReader(body)); err != nil {
			WriteError(w, http.StatusBadRequest, api.CodeInvalid, err.Error(), 0)
			return
		}
		w.WriteHeader(http.StatusNoContent)
		return
	}
	mode := fs.FileMode(0o644)
	if m := r.URL.Query().Get("mode"); m != "" {
		v, err := strconv.ParseUint(m, 8, 32)
		if err != nil {
			WriteError(w, http.StatusBadRequest, api.CodeInvalid, "bad mode", 0)
			return
		}
		mode = fs.FileMode(v).Perm()
	}
	if parent, ok := sb.files[path.Dir(p)]; !ok || !parent.dir {
		WriteError(w, http.StatusNotFound, api.CodeFileNotFound, path.Dir(p)+": no such directory", 0)
		return
	}
	if n, ok := sb.files[p]; ok && n.dir {
		WriteError(w, http.StatusConflict, api.CodeConflict, p+" is a directory", 0)
		return
	}
	sb.files[p] = &node{mode: mode, data: body, mtime: time.Now()}
	w.WriteHeader(http.StatusNoContent)
}

func (sb *sandbox) untar(dir string, r io.Reader) error {
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if strings.HasPrefix(hdr.Name, "/") || strings.Contains("/"+hdr.Name+"/", "/../") {
			return fmt.Errorf("bad entry name %q", hdr.Name)
		}
		p := path.Join(dir, hdr.Name)
		if err := sb.mkdirAll(path.Dir(p)); err != nil {
			return err
		}
		mode := fs.FileMode(hdr.Mode).Perm()
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := sb.mkdirAll(p); err != nil {
				return err
			}
			sb.files[p].mode = mode
		case tar.TypeReg:
			data, err := io.ReadAll(tr)
			if err != nil {
				return err
			}
			sb.files[p] = &node{mode: mode, data: data, mtime: hdr.ModTime}
		case tar.TypeSymlink:
			sb.files[p] = &node{link: hdr.Linkname, mode: 0o777, mtime: hdr.ModTime}
		default:
			return fmt.Errorf("unsupported entry %q", hdr.Name)
		}
	}
}

func (s *Server) getFiles(w http.ResponseWriter, r *http.Request, id string) {
	p, ok := absPath(w, r)
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sb := s.sandboxes[id]
	n, ok := sb.files[p]
	if !ok {
		WriteError(w, http.StatusNotFound, api.CodeFileNotFound, p+": no such file or directory", 0)
		return
	}
	if !n.dir && n.link == "" && r.URL.Query().Get("format") != "tar" {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("X-Warren-File-Mode", fmt.Sprintf("%04o", uint32(n.mode)))
		w.Header().Set("Content-Length", strconv.Itoa(len(n.data)))
		_, _ = w.Write(n.data)
		return
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	parent := path.Dir(p)
	var names []string
	for q := range sb.files {
		if q == p || strings.HasPrefix(q, strings.TrimSuffix(p, "/")+"/") {
			names = append(names, q)
		}
	}
	sort.Strings(names)
	for _, q := range names {
		m := sb.files[q]
		rel := strings.TrimPrefix(strings.TrimPrefix(q, parent), "/")
		if rel == "" {
			rel = "."
		}
		hdr := &tar.Header{Name: rel, Mode: int64(m.mode), ModTime: m.mtime}
		switch {
		case m.dir:
			hdr.Typeflag, hdr.Name = tar.TypeDir, rel+"/"
		case m.link != "":
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, m.link
		default:
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(m.data))
		}
		_ = tw.WriteHeader(hdr)
		_, _ = tw.Write(m.data)
	}
	_ = tw.Close()
	w.Header().Set("Content-Type", "application/x-tar")
	_, _ = w.Write(buf.Bytes())
}

func (s *Server) stat(w http.ResponseWriter, r *http.Request, id string) {
	p, ok := absPath(w, r)
	if !ok {
		return
	}
	s.mu.Lock()
	n, ok := s.sandboxes[id].files[p]
	var fi api.FileInfo
	if ok {
		fi = api.FileInfo{Path: p, Size: int64(len(n.data)), Mode: uint32(n.mode), IsDir: n.dir}
	}
	s.mu.Unlock()
	if !ok {
		WriteError(w, http.StatusNotFound, api.CodeFileNotFound, p+": no such file or directory", 0)
		return
	}
	writeJSON(w, http.StatusOK, fi)
}
