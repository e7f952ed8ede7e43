package api

import (
	"time"
)

// Sandbox states. "lost" means the node vanished or the sandbox died for an
// infrastructure reason: a trainer should mask that rollout, not score it.
const (
	StateCreating = "creating"
	StateRunning  = "running"
	StatePaused   = "paused"
	StateStopping = "stopping"
	StateStopped  = "stopped"
	StateFailed   = "failed"
	StateLost     = "lost"
)

// Backends a sandbox can run on.
const (
	BackendFnCall    = "fncall"
	BackendContainer = "container"
	BackendMicroVM   = "microvm"
	BackendVM        = "vm"
)

// Resources a sandbox asks for. Zero values mean the server's defaults.
type Resources struct {
	// CPU in cores; 0.5 is half a core.
	CPU float64 `json:"cpu,omitempty"`
	// Memory limit in bytes; JSON accepts "256Mi", "1G" or a number.
	Memory Quantity `json:"memory,omitempty"`
	// PIDs caps the number of processes and threads.
	PIDs int64 `json:"pids,omitempty"`
}

// CreateSandboxRequest is the body of POST /v1/sandboxes.
type CreateSandboxRequest struct {
	Backend     string            `json:"backend,omitempty"` // default "container"
	Image       string            `json:"image"`
	Resources   Resources         `json:"resources,omitempty"`
	Env         map[string]string `json:"env,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	TTL         Duration          `json:"ttl,omitempty"`          // lifetime; 0 = server default
	IdleTimeout Duration          `json:"idle_timeout,omitempty"` // 0 = none
}

// Sandbox is the API view of one sandbox.
type Sandbox struct {
	ID          string            `json:"id"`
	Node        string            `json:"node"`
	Backend     string            `json:"backend"`
	Image       string            `json:"image"`
	State       string            `json:"state"`
	Reason      string            `json:"reason,omitempty"` // why failed or lost
	Resources   Resources         `json:"resources"`
	Env         map[string]string `json:"env,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	TTL         Duration          `json:"ttl,omitempty"`
	IdleTimeout Duration          `json:"idle_timeout,omitempty"`
	CreatedAt   time.Time         `json:"created_at"`
	LastUsedAt  time.Time         `json:"last_used_at"`
	ExpiresAt   *time.Time        `json:"expires_at,omitempty"`
}

// SandboxList is the body of GET /v1/sandboxes.
type SandboxList struct {
	Sandboxes []Sandbox `json:"sandboxes"`
}

// ExecRequest is the body of POST /v1/sandboxes/{id}/exec. Exactly one of
// Argv and Cmd is set; Cmd runs as `/bin/sh -c Cmd`.
type ExecRequest struct {
	Argv  []string          `json:"argv,omitempty"`
	Cmd   string            `json:"cmd,omitempty"`
	Env   map[string]string `json:"env,omitempty"`
	Cwd   string            `json:"cwd,omitempty"`
	User  string            `json:"user,omitempty"` // name, uid or uid:gid
	Stdin string            `json:"stdin,omitempty"`
	// StdinEncoding is "" for UTF-8 text or "base64" for arbitrary bytes.
	StdinEncoding string   `json:"stdin_encoding,omitempty"`
	Timeout       Duration `json:"timeout,omitempty"` // 0 = server default
	// MaxOutput caps stdout and stderr each; 0 = server default (1 MiB).
	MaxOutput Quantity `json:"max_output,omitempty"`
	// Stream asks for an NDJSON stream of ExecEvent instead of one
	// ExecResult. "Accept: application/x-ndjson" does the same.
	Stream bool `json:"stream,omitempty"`
}

// Output encodings. Output that is not valid UTF-8 is sent as base64 so that
// no byte is lost on the way through JSON.
const (
	EncodingUTF8   = ""
	EncodingBase64 = "base64"
)

// ExecResult is the buffered answer to an exec, and the last event of a
// stream (with Stdout and Stderr empty there).
type ExecResult struct {
	ExitCode        int    `json:"exit_code"`
	Signal          string `json:"signal,omitempty"` // e.g. "SIGKILL" when killed by a signal
	TimedOut        bool   `json:"timed_out"`
	Stdout          string `json:"stdout"`
	StdoutEncoding  string `json:"stdout_encoding,omitempty"`
	Stderr          string `json:"stderr"`
	StderrEncoding  string `json:"stderr_encoding,omitempty"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	StdoutBytes     int64  `json:"stdout_bytes"` // total written, captured or not
	StderrBytes     int64  `json:"stderr_bytes"`
	DurationMs      int64  `json:"duration_ms"`
}

// ExecEvent is one line of an NDJSON exec stream: either a chunk of output
// (Stream "stdout" or "stderr"), the final Result, or an Error.
type ExecEvent struct {
	Stream   string      `json:"stream,omitempty"`
	Data     string      `json:"data,omitempty"`
	Encoding string      `json:"encoding,omitempty"`
	Result   *ExecResult `json:"result,omitempty"`
	Error    *Error      `json:"error,omitempty"`
}

// FileInfo describes a path inside a sandbox (HEAD/GET on files sets the
// X-Warren-File-* headers from it).
type FileInfo struct {
	Path  string `json:"path"`
	Size  int64  `json:"size"`
	Mode  uint32 `json:"mode"` // permission bits
	IsDir bool   `json:"is_dir"`
}

// Image is a named environment a sandbox can start from.
type Image struct {
	Name      string    `json:"name"`
	Layers    []string  `json:"layers"` // layer digests, bottom first
	Size      int64     `json:"size"`
	CreatedAt time.Time `json:"created_at"`
}

// ImageList is the body of GET /v1/images.
type ImageList struct {
	Images []Image `json:"images"`
}

// Node is the API view of one node agent.
type Node struct {
	ID        string    `json:"id"`
	Address   string    `json:"address,omitempty"`
	Backends  []string  `json:"backends"`
	Capacity  Capacity  `json:"capacity"`
	Usage     Capacity  `json:"usage"`
	Healthy   bool      `json:"healthy"`
	Problems  []string  `json:"problems,omitempty"` // e.g. a backend unavailable here, and why
	UpdatedAt time.Time `json:"updated_at"`
}

// Capacity counts a node's resources.
type Capacity struct {
	CPU       float64  `json:"cpu"`
	Memory    Quantity `json:"memory"`
	Sandboxes int      `json:"sandboxes"`
}

// NodeList is the body of GET /v1/nodes.
type NodeList struct {
	Nodes []Node `json:"nodes"`
}

// Error is the body of every non-2xx answer: {"error": {...}}.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// RetryAfter, in seconds, mirrors the Retry-After header on 429 and 503.
	RetryAfter int `json:"retry_after,omitempty"`
}

// ErrorBody wraps Error on the wire.
type ErrorBody struct {
	Error Error `json:"error"`
}

// Stable error codes. Clients switch on these, never on messages.
const (
	CodeInvalid            = "invalid_argument"    // 400
	CodeUnauthenticated    = "unauthenticated"     // 401
	CodeForbidden          = "forbidden"           // 403
	CodeNotFound           = "not_found"           // 404
	CodeSandboxNotFound    = "sandbox_not_found"   // 404
	CodeImageNotFound      = "image_not_found"     // 404
	CodeFileNotFound       = "file_not_found"      // 404
	CodeConflict           = "conflict"            // 409
	CodeExhausted          = "resource_exhausted"  // 429
	CodeNodeFull           = "node_full"           // 429
	CodeUnavailable        = "unavailable"         // 503
	CodeBackendUnavailable = "backend_unavailable" // 503
	CodeInternal           = "internal"            // 500
)
