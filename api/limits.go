package api

import (
	"fmt"
	"regexp"
	"strings"
	"time"
)

// Limits on what a caller may send. Every request field a caller controls
// has a maximum here, checked by the Check* functions below, which the
// apiserver and the node agent both call (the node is reachable without an
// apiserver in front). Past a limit the answer is 400 with code
// CodeTooLarge (or CodeInvalid for a value out of range) before anything
// is allocated for what the field asks for. The README's "Limits" table
// and openapi.yaml list the same numbers.
//
// Environment and argv limits follow the kernel's: execve fails with E2BIG
// for one "KEY=VALUE" or argument string over 128 KiB, or for all of them
// over ARG_MAX (a quarter of the stack limit, 2 MiB by default), and a
// sandbox's environment is passed to every exec in it. So the sandbox's
// env, an exec's env and an exec's argv together stay under 2 MiB.
const (
	// MaxRequestBody bounds every JSON request body (exec stdin and
	// FnCall files ride in them, base64 or UTF-8).
	MaxRequestBody = 64 << 20

	// MaxExecOutput is the largest max_output an exec may ask for (per
	// stream). Output past the in-memory threshold is spooled to the
	// node's disk, never held in memory.
	MaxExecOutput = 128 << 20
	// MaxExecStdin bounds an exec's stdin (decoded), which rides in the
	// request body.
	MaxExecStdin = 16 << 20
	// MaxExecTimeout bounds one exec; longer work belongs in a sandbox's
	// own background processes.
	MaxExecTimeout = 24 * time.Hour

	// MaxArgs and MaxArgBytes bound an exec's argv (or cmd) and FnCall
	// args: the count, and the bytes of all strings together; one string
	// is at most MaxArgLen.
	MaxArgs     = 4096
	MaxArgBytes = 1 << 20
	MaxArgLen   = 128<<10 - 1

	// MaxEnvVars and MaxEnvBytes bound one env map (a sandbox's, an
	// exec's, an FnCall's): the count, and the bytes of its keys and
	// values together; one "KEY=VALUE" is at most MaxEnvEntry bytes.
	MaxEnvVars  = 1024
	MaxEnvBytes = 256 << 10
	MaxEnvEntry = 128<<10 - 1

	// MaxPathLen bounds cwd, file paths and FnCall file paths (PATH_MAX).
	MaxPathLen = 4096
	// MaxUserLen bounds an exec's user ("name", "uid" or "uid:gid").
	MaxUserLen = 256

	// MaxLabels bounds a sandbox's labels; keys are 1-64 of
	// [A-Za-z0-9._/-] starting and ending alphanumeric, values at most
	// MaxLabelValue bytes. The same holds for a node selector, with at most
	// MaxNodeSelector entries.
	MaxLabels       = 64
	MaxLabelKey     = 64
	MaxLabelValue   = 256
	MaxNodeSelector = 16

	// MaxTTL is the longest ttl and idle_timeout; a node may set a lower
	// maximum. The shortest is MinTTL.
	MaxTTL = 7 * 24 * time.Hour
	MinTTL = time.Second

	// MaxRefLen bounds an image, layer or environment reference, a
	// project path, a pool name, a backend and an FnCall runtime name;
	// MaxLayers bounds an explicit layer stack.
	MaxRefLen = 256
	MaxLayers = 64
	// MaxIdempotencyKey bounds an idempotency key (body or header).
	MaxIdempotencyKey = 255

	// MaxFnBatch bounds the calls of one FnCall batch.
	MaxFnBatch = 1024
	// MaxFnCases and MaxFnFiles bound one FnCall; MaxFnInput bounds its
	// source, files, stdin and expected outputs together (decoded).
	MaxFnCases = 1000
	MaxFnFiles = 1000
	MaxFnInput = 32 << 20
)

// CodeTooLarge is the code of a 400 for a field over its limit.
const CodeTooLarge = "too_large"

// LimitError says which field of a request is over which limit. Its
// message names the field, what was sent and the maximum.
type LimitError struct {
	Field string // e.g. "env", "argv[3]", "labels"
	Got   int64
	Max   int64
	Unit  string // "bytes", "entries", ...
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("%s: %d %s, at most %d", e.Field, e.Got, e.Unit, e.Max)
}

func tooMany(field string, got, max int) error {
	return &LimitError{Field: field, Got: int64(got), Max: int64(max), Unit: "entries"}
}

func tooLong(field string, got, max int) error {
	return &LimitError{Field: field, Got: int64(got), Max: int64(max), Unit: "bytes"}
}

// labelKeyPattern is what a label or node selector key looks like.
var labelKeyPattern = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._/-]{0,62}[A-Za-z0-9])?$`)

// ValidLabelKey reports whether k may be a label or node selector key.
func ValidLabelKey(k string) bool { return labelKeyPattern.MatchString(k) }

// CheckEnv checks one env map against MaxEnvVars, MaxEnvEntry and
// MaxEnvBytes. Names are checked by ValidEnvName, by the caller.
func CheckEnv(field string, env map[string]string) error {
	if len(env) > MaxEnvVars {
		return tooMany(field, len(env), MaxEnvVars)
	}
	total := 0
	for k, v := range env {
		n := len(k) + 1 + len(v)
		if n > MaxEnvEntry {
			return tooLong(fmt.Sprintf("%s[%.64s]", field, k), n, MaxEnvEntry)
		}
		total += n
	}
	if total > MaxEnvBytes {
		return tooLong(field, total, MaxEnvBytes)
	}
	return nil
}

// CheckArgs checks argv-like strings against MaxArgs, MaxArgLen and
// MaxArgBytes.
func CheckArgs(field string, args []string) error {
	if len(args) > MaxArgs {
		return tooMany(field, len(args), MaxArgs)
	}
	total := 0
	for i, a := range args {
		if len(a) > MaxArgLen {
			return tooLong(fmt.Sprintf("%s[%d]", field, i), len(a), MaxArgLen)
		}
		total += len(a) + 1
	}
	if total > MaxArgBytes {
		return tooLong(field, total, MaxArgBytes)
	}
	return nil
}

// CheckLabels checks a label map or node selector: at most max entries,
// keys by ValidLabelKey, values at most MaxLabelValue bytes. A bad key is
// a plain error (the caller classifies it as invalid), a count or length
// over its limit a *LimitError.
func CheckLabels(field string, m map[string]string, max int) error {
	if len(m) > max {
		return tooMany(field, len(m), max)
	}
	for k, v := range m {
		if len(k) > MaxLabelKey {
			return tooLong(fmt.Sprintf("%s key %.64q", field, k), len(k), MaxLabelKey)
		}
		if !ValidLabelKey(k) {
			return fmt.Errorf("%s key %q: keys are 1-%d of [A-Za-z0-9._/-], starting and ending with a letter or digit", field, k, MaxLabelKey)
		}
		if len(v) > MaxLabelValue {
			return tooLong(fmt.Sprintf("%s[%s]", field, k), len(v), MaxLabelValue)
		}
	}
	return nil
}

func checkLen(field, s string, max int) error {
	if len(s) > max {
		return tooLong(field, len(s), max)
	}
	return nil
}

// CheckCreate checks a create request's sizes and ranges that need no
// node: every length and count, ttl and idle_timeout within
// MinTTL..MaxTTL, and the runtime (checkRuntime). It does not fill in
// defaults.
func CheckCreate(req *CreateSandboxRequest) error {
	for _, f := range []struct {
		name, v string
		max     int
	}{
		{"backend", req.Backend, MaxRefLen},
		{"image", req.Image, MaxRefLen},
		{"project", req.Project, MaxRefLen},
		{"pool", req.Pool, MaxRefLen},
		{"runtime", req.Runtime, MaxRefLen},
		{"idempotency_key", req.IdempotencyKey, MaxIdempotencyKey},
	} {
		if err := checkLen(f.name, f.v, f.max); err != nil {
			return err
		}
	}
	if len(req.Layers) > MaxLayers {
		return tooMany("layers", len(req.Layers), MaxLayers)
	}
	for i, l := range req.Layers {
		if err := checkLen(fmt.Sprintf("layers[%d]", i), l, MaxRefLen); err != nil {
			return err
		}
	}
	if err := CheckEnv("env", req.Env); err != nil {
		return err
	}
	if err := CheckLabels("labels", req.Labels, MaxLabels); err != nil {
		return err
	}
	if err := CheckLabels("node_selector", req.NodeSelector, MaxNodeSelector); err != nil {
		return err
	}
	if n := req.Network; n != nil {
		if err := checkLen("network.mode", n.Mode, MaxRefLen); err != nil {
			return err
		}
		if max := MaxAllowDomains + MaxAllowCIDRs; len(n.Allow) > max {
			return tooMany("network.allow", len(n.Allow), max)
		}
		for i, e := range n.Allow {
			if err := checkLen(fmt.Sprintf("network.allow[%d]", i), e, MaxAllowEntry); err != nil {
				return err
			}
		}
	}
	switch req.Pool {
	case "", PoolOnPrem, PoolCloud:
	default:
		return fmt.Errorf("pool %q: want %s or %s", req.Pool, PoolOnPrem, PoolCloud)
	}
	if err := checkRuntime(req); err != nil {
		return err
	}
	if d := req.TTL.D(); d != 0 && (d < MinTTL || d > MaxTTL) {
		return fmt.Errorf("ttl %v: want %v..%v", d, MinTTL, MaxTTL)
	}
	if d := req.IdleTimeout.D(); d != 0 && (d < MinTTL || d > MaxTTL) {
		return fmt.Errorf("idle_timeout %v: want %v..%v", d, MinTTL, MaxTTL)
	}
	if d := req.AutoPause.D(); d != 0 && (d < MinTTL || d > MaxTTL) {
		return fmt.Errorf("auto_pause %v: want %v..%v", d, MinTTL, MaxTTL)
	}
	return nil
}

// CheckEnvironment checks a CreateEnvironmentRequest's sizes: refs,
// toolkits, env (merged under every sandbox's own), workdir, user and
// entrypoint.
func CheckEnvironment(req *CreateEnvironmentRequest) error {
	for _, f := range []struct {
		name, v string
		max     int
	}{
		{"name", req.Name, MaxRefLen},
		{"version", req.Version, MaxRefLen},
		{"from", req.From, MaxRefLen},
		{"base", req.Base, MaxRefLen},
		{"workspace", req.Workspace, MaxRefLen},
		{"workdir", req.Workdir, MaxPathLen},
		{"user", req.User, MaxUserLen},
	} {
		if err := checkLen(f.name, f.v, f.max); err != nil {
			return err
		}
	}
	if len(req.Toolkits) > MaxLayers {
		return tooMany("toolkits", len(req.Toolkits), MaxLayers)
	}
	for i, t := range req.Toolkits {
		if err := checkLen(fmt.Sprintf("toolkits[%d]", i), t, MaxRefLen); err != nil {
			return err
		}
	}
	if err := CheckEnv("env", req.Env); err != nil {
		return err
	}
	return CheckArgs("entrypoint", req.Entrypoint)
}

// CheckBatch checks a batch create: its count and its template.
func CheckBatch(req *BatchCreateRequest) error {
	if req.Count < 1 || req.Count > MaxBatchCount {
		return fmt.Errorf("count %d: want 1..%d", req.Count, MaxBatchCount)
	}
	if n := len(req.Template.Labels); n > MaxLabels-2 {
		// Every member also gets LabelGang and LabelGangIndex.
		return tooMany("template.labels", n, MaxLabels-2)
	}
	return CheckCreate(&req.Template)
}

// CheckExec checks an exec request's sizes: argv or cmd, env, cwd, user,
// stdin (its encoded length, before decoding), timeout and max_output.
func CheckExec(req *ExecRequest) error {
	if err := CheckArgs("argv", req.Argv); err != nil {
		return err
	}
	if err := checkLen("cmd", req.Cmd, MaxArgLen); err != nil {
		return err
	}
	if err := CheckEnv("env", req.Env); err != nil {
		return err
	}
	if err := checkLen("cwd", req.Cwd, MaxPathLen); err != nil {
		return err
	}
	if err := checkLen("user", req.User, MaxUserLen); err != nil {
		return err
	}
	if err := checkStdin("stdin", req.Stdin, req.StdinEncoding, MaxExecStdin); err != nil {
		return err
	}
	if req.MaxOutput < 0 {
		return fmt.Errorf("max_output must not be negative")
	}
	if req.MaxOutput > MaxExecOutput {
		return &LimitError{Field: "max_output", Got: int64(req.MaxOutput), Max: MaxExecOutput, Unit: "bytes"}
	}
	if d := req.Timeout.D(); d < 0 || d > MaxExecTimeout {
		return fmt.Errorf("timeout %v: want 0..%v", d, MaxExecTimeout)
	}
	return nil
}

// decodedLen is the length s decodes to under encoding (an upper bound
// for base64), so sizes are checked before anything is decoded.
func decodedLen(s, encoding string) int {
	if encoding != EncodingBase64 {
		return len(s)
	}
	n := len(s) / 4 * 3
	switch {
	case strings.HasSuffix(s, "=="):
		n -= 2
	case strings.HasSuffix(s, "="):
		n--
	}
	return n
}

func checkStdin(field, s, encoding string, max int) error {
	if n := decodedLen(s, encoding); n > max {
		return tooLong(field, n, max)
	}
	return nil
}

// CheckFn checks an FnCall's sizes: runtime, args, env, files (count and
// paths), cases, and source, files, stdin and expected outputs together
// against MaxFnInput (decoded sizes, computed before decoding).
func CheckFn(req *FnRunRequest) error {
	if err := checkLen("runtime", req.Runtime, MaxRefLen); err != nil {
		return err
	}
	if err := checkLen("project", req.Project, MaxRefLen); err != nil {
		return err
	}
	if err := CheckArgs("args", req.Args); err != nil {
		return err
	}
	if err := CheckEnv("env", req.Env); err != nil {
		return err
	}
	if len(req.Files) > MaxFnFiles {
		return tooMany("files", len(req.Files), MaxFnFiles)
	}
	if len(req.Cases) > MaxFnCases {
		return tooMany("cases", len(req.Cases), MaxFnCases)
	}
	total := len(req.Source) + decodedLen(req.Stdin, req.StdinEncoding)
	for i, f := range req.Files {
		if err := checkLen(fmt.Sprintf("files[%d].path", i), f.Path, MaxPathLen); err != nil {
			return err
		}
		total += decodedLen(f.Content, f.Encoding)
	}
	for _, c := range req.Cases {
		total += decodedLen(c.Stdin, c.StdinEncoding)
		if c.Expected != nil {
			total += decodedLen(*c.Expected, c.ExpectedEncoding)
		}
	}
	if total > MaxFnInput {
		return tooLong("source, files and inputs", total, MaxFnInput)
	}
	return nil
}

// CheckFnBatch checks a batch's call count and each call.
func CheckFnBatch(req *FnBatchRequest) error {
	if n := len(req.Calls); n < 1 || n > MaxFnBatch {
		return fmt.Errorf("a batch takes 1..%d calls, got %d", MaxFnBatch, n)
	}
	for i := range req.Calls {
		if err := CheckFn(&req.Calls[i]); err != nil {
			if le, ok := err.(*LimitError); ok {
				c := *le
				c.Field = fmt.Sprintf("calls[%d].%s", i, le.Field)
				return &c
			}
			return fmt.Errorf("calls[%d]: %w", i, err)
		}
	}
	return nil
}

// checkRuntime checks a create's runtime: a known one, asked of the
// container backend, and for gVisor no network.
func checkRuntime(req *CreateSandboxRequest) error {
	switch req.Runtime {
	case "":
		return nil
	case RuntimeRunc, RuntimeGVisor:
	default:
		return fmt.Errorf("runtime %q: want %s or %s", req.Runtime, RuntimeRunc, RuntimeGVisor)
	}
	if req.Backend != "" && req.Backend != BackendContainer {
		return fmt.Errorf("runtime %s: backend %s has no runtimes to choose from (runtimes are the container backend's)", req.Runtime, req.Backend)
	}
	if req.Runtime == RuntimeGVisor && req.Network.Networked() {
		return fmt.Errorf("runtime gvisor: network must be none (a gVisor sandbox has its own loopback only: the node cannot reach into its network stack)")
	}
	return nil
}
