package node

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"path"
	"strings"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/guard"
)

// running returns a live sandbox that is running, or a classified error.
func (a *Agent) running(ctx context.Context, id, verb string) (*sandbox, error) {
	s, err := a.lookup(id)
	if err != nil {
		return nil, err
	}
	if s.isPaused() {
		if err := a.resume(ctx, s, verb); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	state, deleting, reason := s.view.State, s.deleting, s.endReason
	s.mu.Unlock()
	if deleting {
		return nil, errGone(id, reason, false)
	}
	if state != api.StateRunning {
		return nil, errdefs.New(errdefs.ErrConflict, "sandbox_not_running", "sandbox %s is %s, not running", id, state)
	}
	return s, nil
}

// Exec runs a command in a sandbox. Output goes to stdout and stderr as it
// is produced, each capped at req.MaxOutput (default 1 MiB): bytes past the
// cap are counted and dropped. If stdout and stderr are nil, the output is
// captured into the result instead. The error is non-nil only when the
// command could not be run; a failing command is a result with its exit
// code.
func (a *Agent) Exec(ctx context.Context, id string, req api.ExecRequest, stdout, stderr io.Writer) (api.ExecResult, error) {
	breq, err := a.execRequest(req)
	if err != nil {
		return api.ExecResult{}, err
	}
	ex, s, done, err := call[backend.Execer](ctx, a, id, "exec")
	if err != nil {
		return api.ExecResult{}, err
	}
	if breq.User == "" {
		breq.User = s.snapshot().User // the environment's default
	}
	limit := int64(req.MaxOutput)
	if limit == 0 {
		limit = a.cfg.Defaults.MaxOutput
	}
	var outBuf, errBuf *bytes.Buffer
	if stdout == nil && stderr == nil {
		outBuf, errBuf = &bytes.Buffer{}, &bytes.Buffer{}
		stdout, stderr = outBuf, errBuf
	}
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	outW, errW := guard.NewLimitWriter(stdout, limit), guard.NewLimitWriter(stderr, limit)
	outJ, errJ := &headTail{n: api.JournalOutputBytes}, &headTail{n: api.JournalOutputBytes}
	breq.Stdout, breq.Stderr = io.MultiWriter(outW, outJ), io.MultiWriter(errW, errJ)

	start := time.Now()
	res, err := ex.Exec(ctx, id, breq)
	err = done(err)
	e := api.JournalEntry{Verb: "exec", Argv: req.Argv, Cmd: req.Cmd, Cwd: req.Cwd, User: req.User,
		StdoutBytes: outJ.total, StderrBytes: errJ.total}
	e.StdoutHead, e.StdoutTail = outJ.strings()
	e.StderrHead, e.StderrTail = errJ.strings()
	if err == nil {
		code := res.ExitCode
		e.ExitCode, e.Signal, e.TimedOut = &code, res.Signal, res.TimedOut
	}
	a.record(id, start, e, err) // journal.go
	if err != nil {
		return api.ExecResult{}, err
	}
	out := api.ExecResult{
		ExitCode:        res.ExitCode,
		Signal:          res.Signal,
		TimedOut:        res.TimedOut,
		StdoutTruncated: outW.Truncated(),
		StderrTruncated: errW.Truncated(),
		StdoutBytes:     outW.Total(),
		StderrBytes:     errW.Total(),
		DurationMs:      res.Duration.Milliseconds(),
	}
	if outBuf != nil {
		out.Stdout, out.StdoutEncoding = api.EncodeBytes(outBuf.Bytes())
		out.Stderr, out.StderrEncoding = api.EncodeBytes(errBuf.Bytes())
	}
	return out, nil
}

// execRequest validates an API exec request and turns it into a backend one.
func (a *Agent) execRequest(req api.ExecRequest) (backend.ExecRequest, error) {
	if err := api.CheckExec(&req); err != nil {
		return backend.ExecRequest{}, errdefs.Request(err)
	}
	switch {
	case len(req.Argv) > 0 && req.Cmd != "":
		return backend.ExecRequest{}, errdefs.Invalid("give argv or cmd, not both")
	case len(req.Argv) > 0:
		if req.Argv[0] == "" {
			return backend.ExecRequest{}, errdefs.Invalid("argv[0] is empty")
		}
	case req.Cmd == "":
		return backend.ExecRequest{}, errdefs.Invalid("argv or cmd is required")
	}
	for k := range req.Env {
		if !api.ValidEnvName(k) {
			return backend.ExecRequest{}, errdefs.Invalid("env %q: not a valid variable name", k)
		}
	}
	if req.Cwd != "" && !path.IsAbs(req.Cwd) {
		return backend.ExecRequest{}, errdefs.Invalid("cwd %q: must be absolute", req.Cwd)
	}
	timeout := req.Timeout.D()
	if timeout == 0 {
		timeout = a.cfg.Defaults.ExecTimeout
	}
	var stdin io.Reader
	switch req.StdinEncoding {
	case api.EncodingUTF8:
		if req.Stdin != "" {
			stdin = strings.NewReader(req.Stdin)
		}
	case api.EncodingBase64:
		b, err := base64.StdEncoding.DecodeString(req.Stdin)
		if err != nil {
			return backend.ExecRequest{}, errdefs.Invalid("stdin: bad base64: %v", err)
		}
		stdin = bytes.NewReader(b)
	default:
		return backend.ExecRequest{}, errdefs.Invalid("stdin_encoding %q: want \"\" or \"base64\"", req.StdinEncoding)
	}
	return backend.ExecRequest{
		Argv:    req.Argv,
		Shell:   req.Cmd,
		Env:     envList(req.Env),
		Cwd:     req.Cwd,
		User:    req.User,
		Stdin:   stdin,
		Timeout: timeout,
	}, nil
}

// files returns a running sandbox's file access after checking path, with
// the call begun (reaper.go): done must end it with the bytes the call
// moved, and gives the answer; the call goes into the journal.
func (a *Agent) files(ctx context.Context, id, p, verb string) (backend.Files, func(err error, n int64) error, error) {
	if p == "" || !path.IsAbs(p) {
		return nil, nil, errdefs.Invalid("path %q: must be absolute", p)
	}
	if strings.ContainsRune(p, 0) {
		return nil, nil, errdefs.Invalid("path contains a NUL byte")
	}
	f, _, done, err := call[backend.Files](ctx, a, id, "file transfer")
	if err != nil {
		return nil, nil, err
	}
	start := time.Now()
	return f, func(err error, n int64) error {
		err = done(fileErr(p, err))
		a.record(id, start, api.JournalEntry{Verb: verb, Path: p, Bytes: n}, err) // journal.go
		return err
	}, nil
}

// Stat describes a path inside a sandbox.
func (a *Agent) Stat(ctx context.Context, id, p string) (api.FileInfo, error) {
	f, done, err := a.files(ctx, id, p, "stat")
	if err != nil {
		return api.FileInfo{}, err
	}
	fi, err := f.Stat(ctx, id, p)
	if err := done(err, 0); err != nil {
		return api.FileInfo{}, err
	}
	return api.FileInfo{Path: path.Clean(p), Size: fi.Size, Mode: fi.Mode, IsDir: fi.IsDir}, nil
}

// WriteFile writes one regular file into a sandbox.
func (a *Agent) WriteFile(ctx context.Context, id, p string, mode uint32, r io.Reader) error {
	if mode&^0o7777 != 0 {
		return errdefs.Invalid("mode %o: only permission bits", mode)
	}
	f, done, err := a.files(ctx, id, p, "write_file")
	if err != nil {
		return err
	}
	cr := &counter{r: r}
	return done(f.WriteFile(ctx, id, p, mode, cr), cr.n)
}

// ReadFile streams one regular file out of a sandbox.
func (a *Agent) ReadFile(ctx context.Context, id, p string, w io.Writer) error {
	f, done, err := a.files(ctx, id, p, "read_file")
	if err != nil {
		return err
	}
	cw := &counter{w: w}
	return done(f.ReadFile(ctx, id, p, cw), cw.n)
}

// WriteTar extracts a tar stream under dir inside a sandbox.
func (a *Agent) WriteTar(ctx context.Context, id, dir string, r io.Reader) error {
	f, done, err := a.files(ctx, id, dir, "write_tar")
	if err != nil {
		return err
	}
	cr := &counter{r: r}
	return done(f.WriteTar(ctx, id, dir, cr), cr.n)
}

// ReadTar streams a file or directory tree out of a sandbox as a tar.
func (a *Agent) ReadTar(ctx context.Context, id, p string, w io.Writer) error {
	f, done, err := a.files(ctx, id, p, "read_tar")
	if err != nil {
		return err
	}
	cw := &counter{w: w}
	return done(f.ReadTar(ctx, id, p, cw), cw.n)
}

// counter counts the bytes read through r or written through w.
type counter struct {
	r io.Reader
	w io.Writer
	n int64
}

func (c *counter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func (c *counter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// fileErr gives a missing path the file_not_found code.
func fileErr(p string, err error) error {
	if err == nil || errdefs.Code(err) != "" {
		return err
	}
	if isNotFound(err) {
		return &errdefs.Error{Kind: errdefs.ErrNotFound, Code: api.CodeFileNotFound, Msg: fmt.Sprintf("%s: %v", p, err)}
	}
	return err
}
