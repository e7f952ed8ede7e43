package api

// FnCall: stateless jobs (judge, compile, test runs) on pre-created
// containers. Each call gets a fresh container of its runtime, thrown away
// afterwards; the program runs once per case.

// FnRunRequest is the body of POST /v1/fn/run.
type FnRunRequest struct {
	// Runtime names a runtime the nodes declare, e.g. "python3", "cpp",
	// "c", "sh". GET /v1/fn/runtimes lists them.
	Runtime string `json:"runtime"`
	// Source is the program's text, written to the runtime's source file
	// (main.py, main.cpp, ...). Files are extra files; both land in the
	// working directory /box. A file named like the source file replaces
	// Source.
	Source string   `json:"source,omitempty"`
	Files  []FnFile `json:"files,omitempty"`
	// Args are appended to the runtime's run command.
	Args []string          `json:"args,omitempty"`
	Env  map[string]string `json:"env,omitempty"`
	// Stdin is the one run's input when Cases is empty.
	Stdin         string `json:"stdin,omitempty"`
	StdinEncoding string `json:"stdin_encoding,omitempty"`
	// Cases run the program once each, in order, in the same container.
	Cases []FnCase `json:"cases,omitempty"`
	// StopOnFail skips the cases after the first that is not OK.
	StopOnFail bool `json:"stop_on_fail,omitempty"`
	// Compare is how stdout is matched against a case's Expected:
	// "lines" (default: trailing whitespace on each line and trailing
	// empty lines ignored) or "exact".
	Compare string `json:"compare,omitempty"`
	// Limits apply to each case and to the compile step separately.
	Limits FnLimits `json:"limits,omitempty"`
	// Project the call counts against (its FnCall rate); default the
	// caller's. It must be within the caller's scope.
	Project string `json:"project,omitempty"`
}

// FnFile is one file written under /box before anything runs.
type FnFile struct {
	Path     string `json:"path"` // relative to /box
	Content  string `json:"content"`
	Encoding string `json:"encoding,omitempty"` // "" (UTF-8) or "base64"
	Mode     uint32 `json:"mode,omitempty"`     // default 0644
}

// FnCase is one run of the program.
type FnCase struct {
	Stdin         string `json:"stdin,omitempty"`
	StdinEncoding string `json:"stdin_encoding,omitempty"`
	// Expected, if set, is compared with the run's stdout: a mismatch is
	// WrongAnswer.
	Expected         *string `json:"expected,omitempty"`
	ExpectedEncoding string  `json:"expected_encoding,omitempty"`
}

// FnLimits bound each case (and the compile step). Zero means the node's
// default; values above the node's maximum are refused with 400.
type FnLimits struct {
	CPUTime  Duration `json:"cpu_time,omitempty"`  // CPU time from the cgroup, all processes of the case
	WallTime Duration `json:"wall_time,omitempty"` // default 2x CPUTime + 1 s
	Memory   Quantity `json:"memory,omitempty"`    // peak memory of the case's processes
	PIDs     int64    `json:"pids,omitempty"`      // processes and threads at once
	Output   Quantity `json:"output,omitempty"`    // stdout and stderr each
	FileSize Quantity `json:"file_size,omitempty"` // any one file written
}

// Case statuses. SandboxError is only ever a platform fault, never the
// program's: a trainer can drop such a rollout instead of scoring it.
const (
	FnOK           = "OK"
	FnWrongAnswer  = "WrongAnswer"
	FnNonZeroExit  = "NonZeroExit"
	FnTimeLimit    = "TimeLimit"
	FnMemoryLimit  = "MemoryLimit"
	FnOutputLimit  = "OutputLimit"
	FnSignal       = "Signal"
	FnSandboxError = "SandboxError"
	// FnSkipped marks the cases after a failure under StopOnFail.
	FnSkipped = "Skipped"
	// FnCompileError is a call's status when the compile step failed;
	// FnResult.Compile says how.
	FnCompileError = "CompileError"
)

// FnCaseResult is how one run (a case or the compile step) ended.
type FnCaseResult struct {
	Status          string `json:"status"`
	ExitCode        int    `json:"exit_code"`
	Signal          string `json:"signal,omitempty"`
	Stdout          string `json:"stdout"`
	StdoutEncoding  string `json:"stdout_encoding,omitempty"`
	Stderr          string `json:"stderr"`
	StderrEncoding  string `json:"stderr_encoding,omitempty"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	StdoutBytes     int64  `json:"stdout_bytes"`
	StderrBytes     int64  `json:"stderr_bytes"`
	CPUMs           int64  `json:"cpu_ms"`
	WallMs          int64  `json:"wall_ms"`
	PeakMemory      int64  `json:"peak_memory"` // bytes
	// Message explains a SandboxError or a limit hit.
	Message string `json:"message,omitempty"`
}

// FnResult is the answer to a call. Status is OK when every case is OK,
// CompileError when compiling failed, else the first non-OK case's status.
type FnResult struct {
	Runtime string         `json:"runtime"`
	Status  string         `json:"status"`
	Compile *FnCaseResult  `json:"compile,omitempty"`
	Cases   []FnCaseResult `json:"cases"`
	Node    string         `json:"node,omitempty"`
	// WallMs is the whole call on the node, container claim included.
	WallMs int64 `json:"wall_ms"`
}

// FnBatchRequest is the body of POST /v1/fn/batch: independent calls run
// concurrently; each gets its own result or error.
type FnBatchRequest struct {
	Calls []FnRunRequest `json:"calls"`
}

// FnBatchResult answers FnBatchRequest, in the order of the calls.
type FnBatchResult struct {
	Results []FnBatchItem `json:"results"`
}

// FnBatchItem is one call's outcome: Result, or Error when the call was
// refused (e.g. 429 overloaded) or invalid.
type FnBatchItem struct {
	Result *FnResult `json:"result,omitempty"`
	Error  *Error    `json:"error,omitempty"`
}

// FnRuntime describes one runtime and its pool on a node (or summed over
// the fleet).
type FnRuntime struct {
	Name      string   `json:"name"`
	Env       string   `json:"env"`    // environment name@version
	Source    string   `json:"source"` // file Source is written to
	Compile   []string `json:"compile,omitempty"`
	Run       []string `json:"run"`
	Available bool     `json:"available"`
	Reason    string   `json:"reason,omitempty"` // why not available
	Ready     int      `json:"ready"`            // pre-created containers waiting
	Busy      int      `json:"busy"`             // calls running
	PoolMin   int      `json:"pool_min"`
	PoolMax   int      `json:"pool_max"`
	// Root is "read-only" (the environment's files cannot be written; a
	// program writes in /box, /tmp and /dev/shm) or "overlay" (anywhere,
	// in memory); empty until the environment is resolved.
	Root string `json:"root,omitempty"`
}

// FnRuntimeList is the body of GET /v1/fn/runtimes.
type FnRuntimeList struct {
	Runtimes []FnRuntime `json:"runtimes"`
}

// FnCall error codes. CodeRuntimeUnavailable also answers a create whose
// sandbox runtime (CreateSandboxRequest.Runtime) cannot run on the node,
// or on any node that could take it; the message says why.
const (
	CodeRuntimeNotFound    = "runtime_not_found"   // 404: no node declares it
	CodeRuntimeUnavailable = "runtime_unavailable" // 503: declared, but its environment is missing
	CodeFnOverloaded       = "fn_overloaded"       // 429: every container busy and the pool at its maximum
)
