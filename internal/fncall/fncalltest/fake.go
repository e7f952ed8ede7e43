// Package fncalltest is a deterministic fake of fncall.Runner, for tests of
// the layers between a user and a node's FnCall service (node API,
// apiserver routing, client, CLI) without containers.
//
// The fake "runs" a program by reading directives in its source:
//
//	COMPILE_ERROR  the compile step fails (status CompileError)
//	SANDBOX_ERROR  every case ends in SandboxError
//	EXIT <n>       every case exits with n (NonZeroExit when n != 0)
//	TLE            every case hits the time limit
//	BLOCK          every case waits until Release (or the call's context)
//
// Otherwise the program echoes its input: a case's stdout is its stdin
// (decoded), followed by the args joined by spaces when there are any,
// and stderr says "ran <runtime>". Cases compare stdout with Expected under
// the request's Compare mode. Output that is not UTF-8 comes back base64.
package fncalltest

import (
	"context"
	"encoding/base64"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/fncall"
)

var _ fncall.Runner = (*Fake)(nil)

// Fake is a fncall.Runner whose runtimes are set by hand. It is safe for
// concurrent use.
type Fake struct {
	mu         sync.Mutex
	runtimes   []api.FnRuntime
	overloaded time.Duration // > 0: every Run refuses with this Retry-After
	calls      []api.FnRunRequest
	busy       map[string]int
	release    chan struct{}
}

// New returns a fake declaring runtimes, each available with 2 ready
// containers, a pool of 1..4, a read-only root, source file main.<name> and
// a run command;
// "cpp" and "c" also compile.
func New(runtimes ...string) *Fake {
	f := &Fake{busy: map[string]int{}, release: make(chan struct{})}
	for _, name := range runtimes {
		rt := api.FnRuntime{
			Name: name, Env: "fn-" + name + "@1", Source: "main." + name,
			Run: []string{"./" + name}, Available: true, Ready: 2, PoolMin: 1, PoolMax: 4, Root: "read-only",
		}
		if name == "cpp" || name == "c" {
			rt.Compile = []string{"cc", rt.Source}
		}
		f.runtimes = append(f.runtimes, rt)
	}
	return f
}

// SetPool sets what Runtimes reports of runtime name's pool: ready
// containers and calls running (on top of the fake's own running calls).
func (f *Fake) SetPool(name string, ready, busy int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.runtimes {
		if f.runtimes[i].Name == name {
			f.runtimes[i].Ready, f.runtimes[i].Busy = ready, busy
		}
	}
}

// SetUnavailable declares runtime name unavailable for reason: Run
// refuses it with 503 runtime_unavailable.
func (f *Fake) SetUnavailable(name, reason string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.runtimes {
		if f.runtimes[i].Name == name {
			f.runtimes[i].Available, f.runtimes[i].Reason = false, reason
			f.runtimes[i].Ready, f.runtimes[i].Root = 0, ""
		}
	}
}

// SetOverloaded makes every Run refuse with 429 fn_overloaded and a
// Retry-After of retryAfter; 0 ends that.
func (f *Fake) SetOverloaded(retryAfter time.Duration) {
	f.mu.Lock()
	f.overloaded = retryAfter
	f.mu.Unlock()
}

// Release lets every call blocked on BLOCK finish, now and from now on.
func (f *Fake) Release() {
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-f.release:
	default:
		close(f.release)
	}
}

// Calls returns the requests Run received, refused or not, in order.
func (f *Fake) Calls() []api.FnRunRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// Busy returns how many calls of runtime name are running now.
func (f *Fake) Busy(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.busy[name]
}

// Runtimes implements fncall.Runner.
func (f *Fake) Runtimes(context.Context) []api.FnRuntime {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]api.FnRuntime, len(f.runtimes))
	for i, rt := range f.runtimes {
		rt.Busy += f.busy[rt.Name]
		rt.Compile, rt.Run = slices.Clone(rt.Compile), slices.Clone(rt.Run)
		out[i] = rt
	}
	return out
}

// Run implements fncall.Runner.
func (f *Fake) Run(ctx context.Context, req api.FnRunRequest) (api.FnResult, error) {
	start := time.Now()
	f.mu.Lock()
	f.calls = append(f.calls, req)
	over := f.overloaded
	i := slices.IndexFunc(f.runtimes, func(rt api.FnRuntime) bool { return rt.Name == req.Runtime })
	var rt api.FnRuntime
	if i >= 0 {
		rt = f.runtimes[i]
	}
	release := f.release
	f.mu.Unlock()

	switch {
	case req.Runtime == "":
		return api.FnResult{}, errdefs.Invalid("runtime is required")
	case i < 0:
		return api.FnResult{}, errdefs.New(errdefs.ErrNotFound, api.CodeRuntimeNotFound, "runtime %q is not declared", req.Runtime)
	case !rt.Available:
		return api.FnResult{}, &errdefs.Error{Kind: errdefs.ErrUnavailable, Code: api.CodeRuntimeUnavailable,
			RetryAfter: 5 * time.Second, Msg: fmt.Sprintf("runtime %s is unavailable: %s", rt.Name, rt.Reason)}
	case req.Compare != "" && req.Compare != "lines" && req.Compare != "exact":
		return api.FnResult{}, errdefs.Invalid("compare %q: want lines or exact", req.Compare)
	case over > 0:
		return api.FnResult{}, errdefs.Exhausted(api.CodeFnOverloaded, over, "every %s container is busy", rt.Name)
	}
	stdins, err := inputs(req)
	if err != nil {
		return api.FnResult{}, err
	}

	f.mu.Lock()
	f.busy[rt.Name]++
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.busy[rt.Name]--
		f.mu.Unlock()
	}()

	src := req.Source
	for _, file := range req.Files {
		if file.Path == rt.Source {
			b, _ := decode(file.Content, file.Encoding)
			src = string(b)
		}
	}
	res := api.FnResult{Runtime: rt.Name, Status: api.FnOK, Cases: []api.FnCaseResult{}}
	if len(rt.Compile) > 0 {
		c := api.FnCaseResult{Status: api.FnOK, CPUMs: 5, WallMs: 6, PeakMemory: 8 << 20}
		if strings.Contains(src, "COMPILE_ERROR") {
			c.Status, c.ExitCode = api.FnNonZeroExit, 1
			c.Stderr = rt.Source + ":1: error: expected ';'\n"
			c.StderrBytes = int64(len(c.Stderr))
			res.Compile, res.Status = &c, api.FnCompileError
			res.WallMs = time.Since(start).Milliseconds()
			return res, nil
		}
		res.Compile = &c
	}
	failed := false
	for _, in := range stdins {
		if failed && req.StopOnFail {
			res.Cases = append(res.Cases, api.FnCaseResult{Status: api.FnSkipped})
			continue
		}
		c := run(ctx, src, req, in, release)
		c.Stderr = "ran " + rt.Name + "\n"
		c.StderrBytes = int64(len(c.Stderr))
		if c.Status != api.FnOK {
			if !failed {
				res.Status = c.Status
			}
			failed = true
		}
		res.Cases = append(res.Cases, c)
	}
	res.WallMs = time.Since(start).Milliseconds()
	return res, nil
}

type input struct {
	stdin    []byte
	expected []byte // nil: not compared
}

func inputs(req api.FnRunRequest) ([]input, error) {
	if len(req.Cases) == 0 {
		b, err := decode(req.Stdin, req.StdinEncoding)
		return []input{{stdin: b}}, err
	}
	var ins []input
	for i, c := range req.Cases {
		in, err := decode(c.Stdin, c.StdinEncoding)
		if err != nil {
			return nil, errdefs.Invalid("case %d: stdin: %v", i+1, err)
		}
		var exp []byte
		if c.Expected != nil {
			if exp, err = decode(*c.Expected, c.ExpectedEncoding); err != nil {
				return nil, errdefs.Invalid("case %d: expected: %v", i+1, err)
			}
			if exp == nil {
				exp = []byte{}
			}
		}
		ins = append(ins, input{stdin: in, expected: exp})
	}
	return ins, nil
}

func decode(s, enc string) ([]byte, error) {
	switch enc {
	case api.EncodingUTF8:
		return []byte(s), nil
	case api.EncodingBase64:
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return nil, errdefs.Invalid("bad base64: %v", err)
		}
		return b, nil
	}
	return nil, errdefs.Invalid("encoding %q: want \"\" or base64", enc)
}

func run(ctx context.Context, src string, req api.FnRunRequest, in input, release <-chan struct{}) api.FnCaseResult {
	c := api.FnCaseResult{Status: api.FnOK, CPUMs: 1, WallMs: 2, PeakMemory: 1 << 20}
	if strings.Contains(src, "BLOCK") {
		select {
		case <-release:
		case <-ctx.Done():
			c.Status, c.Message = api.FnSandboxError, "call canceled"
			return c
		}
	}
	switch {
	case strings.Contains(src, "SANDBOX_ERROR"):
		c.Status, c.ExitCode, c.Message = api.FnSandboxError, -1, "container died"
		return c
	case strings.Contains(src, "TLE"):
		c.Status, c.ExitCode, c.Signal, c.CPUMs = api.FnTimeLimit, -1, "SIGKILL", 2000
		c.Message = "CPU time limit exceeded"
		return c
	}
	if _, after, ok := strings.Cut(src, "EXIT "); ok {
		n, _ := strconv.Atoi(strings.Fields(after + " 0")[0])
		if n != 0 {
			c.Status, c.ExitCode = api.FnNonZeroExit, n
			return c
		}
	}
	out := in.stdin
	if len(req.Args) > 0 {
		out = append(append([]byte(nil), out...), strings.Join(req.Args, " ")...)
	}
	c.StdoutBytes = int64(len(out))
	if utf8.Valid(out) {
		c.Stdout = string(out)
	} else {
		c.Stdout, c.StdoutEncoding = base64.StdEncoding.EncodeToString(out), api.EncodingBase64
	}
	if in.expected != nil && !Match(req.Compare, out, in.expected) {
		c.Status = api.FnWrongAnswer
	}
	return c
}

// Match compares output with expected as FnCall's compare modes say:
// "exact" byte for byte, "lines" (or "") ignoring trailing whitespace on
// each line and trailing empty lines.
func Match(mode string, output, expected []byte) bool {
	if mode == "exact" {
		return string(output) == string(expected)
	}
	norm := func(b []byte) []string {
		lines := strings.Split(string(b), "\n")
		for i, l := range lines {
			lines[i] = strings.TrimRight(l, " \t\r\f\v")
		}
		for len(lines) > 0 && lines[len(lines)-1] == "" {
			lines = lines[:len(lines)-1]
		}
		return lines
	}
	return slices.Equal(norm(output), norm(expected))
}
