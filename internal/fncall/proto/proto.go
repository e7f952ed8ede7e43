// Package proto is the wire between the node agent and warren-fninit, the
// pid 1 of every FnCall container: newline-delimited JSON over one Unix
// socket the agent passes as fd 3. It has no dependencies so that
// warren-fninit stays a small binary that starts in about a millisecond.
//
// fninit starts in new mount, pid, IPC and UTS namespaces. The
// conversation: the agent sends Setup; fninit builds the container's
// root and answers Ready (or Error, and exits). The container then waits in
// the pool. A call sends Files once and Run once per case (compile step
// included), each answered by one Reply; Kill may arrive while a Run is
// going on and ends it. Closing the socket ends fninit, and with it, as pid
// 1, every process of the container.
package proto

// Fd is the file descriptor fninit finds its socket on; NetnsFd is the
// network namespace (lo only, up) fninit joins: the agent recycles them
// between containers, since nothing of a call survives in one.
const (
	Fd      = 3
	NetnsFd = 4
)

// Message is what the agent sends; exactly one field is set.
type Message struct {
	Setup *Setup `json:"setup,omitempty"`
	Files []File `json:"files,omitempty"`
	Run   *Run   `json:"run,omitempty"`
	Kill  string `json:"kill,omitempty"` // the reason, e.g. "cpu"
}

// Setup describes the container's root filesystem and identity.
type Setup struct {
	// Lower are the read-only layer directories, top first (overlayfs
	// lowerdir order).
	Lower []string `json:"lower"`
	// Scratch is an empty host directory fninit mounts a tmpfs of
	// ScratchBytes on, private to its mount namespace; the overlay's
	// upper and work dirs live there, so every write of the container
	// goes to memory charged to its cgroup and vanishes with it.
	Scratch      string `json:"scratch"`
	ScratchBytes int64  `json:"scratch_bytes"`
	Hostname     string `json:"hostname"`
	// Workdir is created and given to UID:GID (the runs' identity).
	Workdir string `json:"workdir"`
	UID     int    `json:"uid"`
	GID     int    `json:"gid"`
}

// File is written under Setup.Workdir, owned by UID:GID.
type File struct {
	Path string `json:"path"`
	Data []byte `json:"data"`
	Mode uint32 `json:"mode"`
}

// Run is one process to run to completion.
type Run struct {
	Argv  []string `json:"argv"` // argv[0] looked up in Env's PATH
	Env   []string `json:"env"`
	Dir   string   `json:"dir"`
	Stdin []byte   `json:"stdin,omitempty"`
	// WallNs kills the run after this long (0: never).
	WallNs int64 `json:"wall_ns"`
	// OutputBytes caps stdout and stderr each; past it the run is killed
	// (OutputLimit). FileBytes is RLIMIT_FSIZE, CPUSeconds RLIMIT_CPU (a
	// backstop: the agent watches CPU time in the cgroup), StackBytes
	// RLIMIT_STACK; 0 leaves a limit as it is.
	OutputBytes int64 `json:"output_bytes"`
	FileBytes   int64 `json:"file_bytes"`
	CPUSeconds  int64 `json:"cpu_seconds"`
	StackBytes  int64 `json:"stack_bytes"`
}

// Reply answers Setup (Ready), Files and Run; Error is set when the
// platform, not the program, failed.
type Reply struct {
	Ready  bool       `json:"ready,omitempty"`
	Result *RunResult `json:"result,omitempty"`
	Error  string     `json:"error,omitempty"`
}

// RunResult is how a Run ended.
type RunResult struct {
	// ExitCode, or Signal (a number) when killed by one.
	ExitCode int `json:"exit_code"`
	Signal   int `json:"signal,omitempty"`
	// StartError is set when the program could not be started at all
	// (not found, not executable): the program's fault, not the platform's.
	StartError string `json:"start_error,omitempty"`
	Stdout     []byte `json:"stdout"`
	Stderr     []byte `json:"stderr"`
	// Totals written, kept or not.
	StdoutBytes int64 `json:"stdout_bytes"`
	StderrBytes int64 `json:"stderr_bytes"`
	// Why fninit killed the run, if it did: "wall", "output", or the
	// reason a Kill gave.
	Killed string `json:"killed,omitempty"`
	WallNs int64  `json:"wall_ns"`
	// From wait4 for the run's process and the descendants it waited
	// for; the agent prefers the cgroup's figures.
	CPUNs     int64 `json:"cpu_ns"`
	MaxRSSKiB int64 `json:"max_rss_kib"`
}
