package fncall

import (
	"bytes"
	"context"
	"fmt"
	"path"
	"sort"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/fncall/proto"
)

// call is a validated request.
type call struct {
	rt      *runtimeState
	files   []proto.File
	cases   []api.FnCase
	inputs  [][]byte // each case's stdin
	expect  [][]byte // nil: not compared
	env     []string
	envReq  map[string]string
	args    []string
	lim     limits
	compile limits
	exact   bool
}

// Run runs one call: claims a fresh container of the runtime, writes the
// files, compiles once if the runtime does, runs each case, and destroys the
// container.
func (s *Service) Run(ctx context.Context, req api.FnRunRequest) (api.FnResult, error) {
	start := time.Now()
	c, err := s.validate(req)
	if err != nil {
		return api.FnResult{}, err
	}
	if _, err := s.boxSpec(c.rt); err != nil {
		return api.FnResult{}, err
	}
	c.env = s.runEnv(c.rt, c.envReq) // the environment's variables are known now
	release, err := s.slots.acquire(ctx)
	if err != nil {
		return api.FnResult{}, err
	}
	defer release()
	b, err := c.rt.pool.get(ctx)
	if err != nil {
		return api.FnResult{}, err
	}
	defer c.rt.pool.put(b)

	res := api.FnResult{Runtime: req.Runtime, Cases: make([]api.FnCaseResult, 0, len(c.cases))}
	fail := func(err error) (api.FnResult, error) {
		res.Status = api.FnSandboxError
		for range c.cases {
			res.Cases = append(res.Cases, api.FnCaseResult{Status: api.FnSandboxError, ExitCode: -1, Message: err.Error()})
		}
		res.WallMs = time.Since(start).Milliseconds()
		return res, nil
	}
	if err := b.send(proto.FilesFrame(c.files)); err != nil {
		return fail(err)
	}
	if _, err := b.reply(ctx, 30*time.Second); err != nil {
		return fail(fmt.Errorf("write files: %w", err))
	}

	base := proto.Run{Env: c.env, Dir: workdir}
	if len(c.rt.Compile) > 0 {
		run := base
		run.Argv = c.rt.Compile
		cr := b.exec(ctx, run, c.compile)
		res.Compile = &cr
		switch cr.Status {
		case api.FnOK:
		case api.FnSandboxError:
			return fail(fmt.Errorf("compile: %s", cr.Message))
		default:
			res.Status = api.FnCompileError
			for range c.cases {
				res.Cases = append(res.Cases, api.FnCaseResult{Status: api.FnSkipped})
			}
			res.WallMs = time.Since(start).Milliseconds()
			return res, nil
		}
	}
	res.Status = api.FnOK
	for i := range c.cases {
		if res.Status != api.FnOK && req.StopOnFail {
			res.Cases = append(res.Cases, api.FnCaseResult{Status: api.FnSkipped})
			continue
		}
		run := base
		run.Argv = append(append([]string(nil), c.rt.Run...), c.args...)
		run.Stdin = c.inputs[i]
		cr := b.exec(ctx, run, c.lim)
		if cr.Status == api.FnOK && c.expect[i] != nil && !sameOutput(cr.Stdout, cr.StdoutEncoding, c.expect[i], c.exact) {
			cr.Status = api.FnWrongAnswer
		}
		if res.Status == api.FnOK && cr.Status != api.FnOK {
			res.Status = cr.Status
		}
		res.Cases = append(res.Cases, cr)
		if cr.Status == api.FnSandboxError {
			// The container is not to be trusted any more: the rest
			// did not run, and say so.
			for range c.cases[i+1:] {
				res.Cases = append(res.Cases, api.FnCaseResult{Status: api.FnSandboxError, ExitCode: -1, Message: "not run: an earlier case hit a platform fault"})
			}
			break
		}
	}
	res.WallMs = time.Since(start).Milliseconds()
	return res, nil
}

// validate checks a request and resolves its limits.
func (s *Service) validate(req api.FnRunRequest) (*call, error) {
	rt, ok := s.runtimes[req.Runtime]
	if !ok {
		return nil, errdefs.New(errdefs.ErrNotFound, api.CodeRuntimeNotFound, "runtime %q is not declared on this node", req.Runtime)
	}
	if err := api.CheckFn(&req); err != nil {
		return nil, errdefs.Request(err)
	}
	c := &call{rt: rt, args: req.Args}
	var err error
	if c.lim, err = resolve(req.Limits, s.cfg.Defaults, s.cfg.Max); err != nil {
		return nil, err
	}
	compileDefaults := rt.CompileLimits
	if compileDefaults == (api.FnLimits{}) {
		compileDefaults = DefaultCompileLimits
	}
	if c.compile, err = resolve(api.FnLimits{}, compileDefaults, s.cfg.Max); err != nil {
		return nil, err
	}
	switch req.Compare {
	case "", "lines":
	case "exact":
		c.exact = true
	default:
		return nil, errdefs.Invalid("compare %q: want \"lines\" or \"exact\"", req.Compare)
	}

	size := int64(len(req.Source))
	files := map[string]proto.File{}
	if req.Source != "" {
		files[rt.Source] = proto.File{Path: rt.Source, Data: []byte(req.Source), Mode: 0o644}
	}
	for i, f := range req.Files {
		p := path.Clean(f.Path)
		if f.Path == "" || path.IsAbs(p) || p == "." || p == ".." || len(p) > 3 && p[:3] == "../" {
			return nil, errdefs.Invalid("files[%d].path %q: must be relative to /box, without ..", i, f.Path)
		}
		data, err := api.DecodeBytes(fmt.Sprintf("files[%d].content", i), f.Content, f.Encoding)
		if err != nil {
			return nil, errdefs.Invalid("%v", err)
		}
		if f.Mode&^0o777 != 0 {
			return nil, errdefs.Invalid("files[%d].mode %o: permission bits only", i, f.Mode)
		}
		size += int64(len(data))
		files[p] = proto.File{Path: p, Data: data, Mode: f.Mode}
	}
	if len(files) == 0 {
		return nil, errdefs.Invalid("source or files are required")
	}
	names := make([]string, 0, len(files))
	for p := range files {
		names = append(names, p)
	}
	sort.Strings(names)
	for _, p := range names {
		c.files = append(c.files, files[p])
	}

	for k := range req.Env {
		if !api.ValidEnvName(k) {
			return nil, errdefs.Invalid("env %q: not a valid variable name", k)
		}
	}
	c.envReq = req.Env

	c.cases = req.Cases
	if len(c.cases) == 0 {
		c.cases = []api.FnCase{{Stdin: req.Stdin, StdinEncoding: req.StdinEncoding}}
	} else if req.Stdin != "" {
		return nil, errdefs.Invalid("give stdin or cases, not both")
	}
	for i, cs := range c.cases {
		in, err := api.DecodeBytes(fmt.Sprintf("cases[%d].stdin", i), cs.Stdin, cs.StdinEncoding)
		if err != nil {
			return nil, errdefs.Invalid("%v", err)
		}
		var want []byte
		if cs.Expected != nil {
			if want, err = api.DecodeBytes(fmt.Sprintf("cases[%d].expected", i), *cs.Expected, cs.ExpectedEncoding); err != nil {
				return nil, errdefs.Invalid("%v", err)
			}
			if want == nil {
				want = []byte{}
			}
		}
		size += int64(len(in) + len(want))
		c.inputs = append(c.inputs, in)
		c.expect = append(c.expect, want)
	}
	if size > s.cfg.MaxRequestBytes {
		return nil, errdefs.New(errdefs.ErrInvalid, api.CodeTooLarge, "files and inputs total %d bytes: at most %d", size, s.cfg.MaxRequestBytes)
	}
	return c, nil
}

// runEnv is a run's environment: a PATH, HOME at the workdir, the
// environment's variables, then the call's.
func (s *Service) runEnv(rt *runtimeState, extra map[string]string) []string {
	env := map[string]string{
		"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME": workdir, "LANG": "C.UTF-8",
	}
	rt.mu.Lock()
	for k, v := range rt.image.Env {
		env[k] = v
	}
	rt.mu.Unlock()
	for k, v := range extra {
		env[k] = v
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// sameOutput compares a run's stdout with the expected bytes: exactly, or
// line by line ignoring trailing whitespace and trailing empty lines.
func sameOutput(got, enc string, want []byte, exact bool) bool {
	g, err := api.DecodeBytes("stdout", got, enc)
	if err != nil {
		return false
	}
	if exact {
		return bytes.Equal(g, want)
	}
	return bytes.Equal(normalize(g), normalize(want))
}

func normalize(b []byte) []byte {
	lines := bytes.Split(b, []byte("\n"))
	for i, l := range lines {
		lines[i] = bytes.TrimRight(l, " \t\r")
	}
	for len(lines) > 0 && len(lines[len(lines)-1]) == 0 {
		lines = lines[:len(lines)-1]
	}
	return bytes.Join(lines, []byte("\n"))
}
