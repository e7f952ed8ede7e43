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

// Runtimes a container sandbox can run under (CreateSandboxRequest.Runtime).
const (
	// RuntimeRunc is the default: the host's kernel, behind namespaces,
	// cgroups and seccomp.
	RuntimeRunc = "runc"
	// RuntimeGVisor is gVisor (runsc): the sandbox's system calls go to a
	// kernel in user space, not to the host's. Its sandboxes have no
	// network but their own loopback (a create must leave network none,
	// and their ports cannot be reached from outside), and their memory
	// and pids limits hold for the sandbox as a whole: one that goes over
	// its memory limit is stopped whole. Exec, files, pause and snapshots
	// work as with runc. Only nodes whose Node.Runtimes say it is
	// available take such creates.
	RuntimeGVisor = "gvisor"
)

// Resources a sandbox asks for. Zero values mean the server's defaults.
type Resources struct {
	// CPU in cores; 0.5 is half a core.
	CPU float64 `json:"cpu,omitempty"`
	// Memory limit in bytes; JSON accepts "256Mi", "1G" or a number.
	Memory Quantity `json:"memory,omitempty"`
	// PIDs caps the number of processes and threads.
	PIDs int64 `json:"pids,omitempty"`
	// Disk limits the sandbox's writable layer (what it writes to its
	// root filesystem), in bytes like Memory; 0 takes the node's default
	// (none unless the node sets one). Past it, writes inside fail with
	// EDQUOT or ENOSPC. A node that cannot enforce it (Node.DiskQuota
	// "none") refuses it with CodeDiskQuotaUnsupported. It counts
	// against the project quota's disk.
	Disk Quantity `json:"disk,omitempty"`
	// DiskInodes limits the files, directories and links of the writable
	// layer; 0 with a Disk limit takes one per 16 KiB of Disk (at least
	// 1024) where the node limits inodes (Node.DiskQuota "xfs" or
	// "ext4"). On "btrfs" each inode's metadata is charged to Disk
	// instead, and an explicit DiskInodes is refused.
	DiskInodes int64 `json:"disk_inodes,omitempty"`
}

// QoS classes (CreateSandboxRequest.QoS). Best-effort work yields the CPU
// to latency work: every process of a best-effort sandbox, including ones
// exec'd later, runs under SCHED_IDLE, in an idle cgroup (internal/qos).
// Under memory pressure a node pauses or evicts best-effort sandboxes
// first, never latency ones.
const (
	QoSLatency    = "latency"
	QoSBestEffort = "best-effort"
)

// CreateSandboxRequest is the body of POST /v1/sandboxes. Exactly one of
// Image and Layers says what the sandbox's root is made of.
type CreateSandboxRequest struct {
	Backend string `json:"backend,omitempty"` // default "container"
	// Image is an environment: "name@version", or "name" for its latest
	// version ("busybox" is always there).
	Image string `json:"image,omitempty"`
	// Layers is an explicit stack of layer refs ("name@version" or "name"
	// for the latest), bottom first, used instead of an environment.
	Layers    []string  `json:"layers,omitempty"`
	Resources Resources `json:"resources,omitempty"`
	// QoS is the sandbox's class: QoSLatency (the default) or
	// QoSBestEffort.
	QoS         string            `json:"qos,omitempty"`
	Env         map[string]string `json:"env,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	TTL         Duration          `json:"ttl,omitempty"`          // lifetime; 0 = server default
	IdleTimeout Duration          `json:"idle_timeout,omitempty"` // 0 = none
	// AutoPause pauses the sandbox, instead of deleting it, after this
	// long without a call (0: never); TTLWhilePaused keeps its TTL
	// running while it is paused (by default paused time does not count).
	AutoPause      Duration `json:"auto_pause,omitempty"`
	TTLWhilePaused bool     `json:"ttl_while_paused,omitempty"`
	// Network is the egress policy; nil or mode none: loopback only.
	Network *NetworkPolicy `json:"network,omitempty"`
	// Runtime is what runs a container sandbox: "" or RuntimeRunc (the
	// default), or RuntimeGVisor. An unknown runtime, or one asked of a
	// backend that has none, is refused (400); one that no node can run
	// here answers CodeRuntimeUnavailable (503) saying why.
	Runtime string `json:"runtime,omitempty"`
	// NodeSelector restricts placement to nodes carrying every one of
	// these labels with exactly that value (warren agent --label).
	NodeSelector map[string]string `json:"node_selector,omitempty"`
	// Pool restricts placement to one node pool (PoolOnPrem or
	// PoolCloud), with no spill to the other. Empty: the home pool, and
	// the burst pool for burstable work when the home pool is full.
	Pool string `json:"pool,omitempty"`
	// Project the sandbox belongs to and is counted against ("a/b"); empty
	// means the calling token's own project. A token creates only within
	// its project's subtree.
	Project string `json:"project,omitempty"`
	// Worker declares the sandbox a rollout worker (long-lived, it runs
	// the agent scaffold): pausing it pauses the sandboxes it drives, and
	// resuming it resumes them (LabelWorker). WorkerOf links the new
	// sandbox to the worker (a sandbox id) that drives it
	// (LabelWorkerOf).
	Worker   bool   `json:"worker,omitempty"`
	WorkerOf string `json:"worker_of,omitempty"`
	// Build makes a build sandbox (Sandbox.Build): one a builder sets up
	// an environment in, which runners cannot see. Default: true when the
	// caller's role is builder, false otherwise; true needs builder or
	// admin.
	Build *bool `json:"build,omitempty"`
	// IdempotencyKey makes the create safe to retry: every request with the
	// same key (in the same project) gets the one sandbox the first created,
	// for 24h. The Idempotency-Key header does the same and wins.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// MemoryMergeGroup is the platform's to set (the apiserver overwrites
	// whatever a caller sends): the memory merge group of the sandbox's
	// project (Project.MemoryMerge), "" for none. A node merges the
	// memory of sandboxes of one group at a time.
	MemoryMergeGroup string `json:"memory_merge_group,omitempty"`
}

// BatchCreateRequest is the body of POST /v1/sandboxes:batch: a gang of
// Count sandboxes made from one Template (a GRPO-style group). Every member
// is labelled LabelGang=<gang id> and LabelGangIndex=<0..Count-1> on top
// of the template's labels. The template must not carry an idempotency key.
//
// Quota and the project's rate limit count the whole gang up front: a gang
// that does not fit is refused (429) before any member is created. With
// AllOrNone, any member's failure deletes the members already created and
// answers that failure (429 with Retry-After when it was a quota or
// capacity refusal). Without it, the answer is 201 when every member was
// created, else 200 with the created members and one error per failed
// member (or the error itself when none was created).
type BatchCreateRequest struct {
	Count     int                  `json:"count"` // 1..MaxBatchCount
	Template  CreateSandboxRequest `json:"template"`
	AllOrNone bool                 `json:"all_or_none,omitempty"`
}

// BatchCreateResponse answers a BatchCreateRequest.
type BatchCreateResponse struct {
	Gang      string           `json:"gang"`      // the gang id (LabelGang's value)
	Sandboxes []Sandbox        `json:"sandboxes"` // the created members, by index
	Errors    []BatchItemError `json:"errors,omitempty"`
}

// BatchItemError is why one gang member was not created.
type BatchItemError struct {
	Index int   `json:"index"`
	Error Error `json:"error"`
}

// Gang labels and limits.
const (
	LabelGang      = "warren.dev/gang"
	LabelGangIndex = "warren.dev/gang-index"
	// CodeGangAborted is the per-member error (409) of a member never
	// tried because another member of its all-or-none gang failed.
	CodeGangAborted = "gang_aborted"
	MaxBatchCount   = 1024
)

// Sandbox is the API view of one sandbox.
type Sandbox struct {
	ID      string `json:"id"`
	Node    string `json:"node"`
	Project string `json:"project"` // "" is the root project
	Backend string `json:"backend"`
	// Runtime is what runs it, for a backend with several (container:
	// RuntimeRunc or RuntimeGVisor); absent for the others.
	Runtime   string    `json:"runtime,omitempty"`
	Image     string    `json:"image"` // the environment, "name@version"
	State     string    `json:"state"`
	Reason    string    `json:"reason,omitempty"` // why failed or lost
	Resources Resources `json:"resources"`
	QoS       string    `json:"qos,omitempty"` // QoSLatency or QoSBestEffort
	// MemoryMergeGroup is the memory merge group the sandbox's memory
	// merges in (its project's, Project.MemoryMerge), "" when it merges
	// with nothing (no group, or a node or backend that cannot).
	MemoryMergeGroup string            `json:"memory_merge_group,omitempty"`
	Env              map[string]string `json:"env,omitempty"`
	Labels           map[string]string `json:"labels,omitempty"`
	// Build: a build sandbox. Tokens below builder get 404 for it, as
	// for a missing one, and lists leave it out: what a builder plants
	// while it sets up an environment (answers, fixtures) stays with
	// builders until it is published, stripped, as a snapshot.
	Build bool `json:"build,omitempty"`
	// Layers are the digests of the layers the root is made of, bottom
	// first; a layer in use by a live sandbox cannot be deleted.
	Layers []string `json:"layers,omitempty"`
	// Workdir and User are the defaults for exec, from the environment.
	Workdir     string   `json:"workdir,omitempty"`
	User        string   `json:"user,omitempty"`
	TTL         Duration `json:"ttl,omitempty"`
	IdleTimeout Duration `json:"idle_timeout,omitempty"`
	// AutoPause pauses (not deletes) the sandbox after this long idle.
	AutoPause Duration `json:"auto_pause,omitempty"`
	// TTLWhilePaused: the TTL runs on while the sandbox is paused (by
	// default it stands still, as the idle clock always does).
	TTLWhilePaused bool `json:"ttl_while_paused,omitempty"`
	// PausedAt is when the sandbox was paused (State paused), Pause what
	// its last pause did.
	PausedAt *time.Time `json:"paused_at,omitempty"`
	Pause    *PauseInfo `json:"pause,omitempty"`
	// Network is the egress policy in force and what it refused; absent
	// for a sandbox with no network (mode none, the default).
	Network    *SandboxNetwork `json:"network,omitempty"`
	CreatedAt  time.Time       `json:"created_at"`
	LastUsedAt time.Time       `json:"last_used_at"`
	ExpiresAt  *time.Time      `json:"expires_at,omitempty"`
}

// PauseInfo says what a sandbox's last pause did.
type PauseInfo struct {
	By       string  `json:"by"`        // who paused it: "caller", "auto-pause", "selector", "project"
	FreezeMS float64 `json:"freeze_ms"` // until every process was frozen
	// MemoryBefore and MemoryAfter are the memory charged to the
	// sandbox (bytes) before the pause and after its reclaim; Reclaim
	// says how memory was pushed out, or why none was.
	MemoryBefore int64  `json:"memory_before"`
	MemoryAfter  int64  `json:"memory_after"`
	Reclaim      string `json:"reclaim"`
	// ResumedAt is when it was resumed last (after this pause), and by
	// what ("caller", or the call that resumed it: "exec", "files", ...).
	ResumedAt *time.Time `json:"resumed_at,omitempty"`
	ResumedBy string     `json:"resumed_by,omitempty"`
}

// SandboxList is the body of GET /v1/sandboxes.
type SandboxList struct {
	Sandboxes []Sandbox `json:"sandboxes"`
}

// ExecRequest is the body of POST /v1/sandboxes/{id}/exec. Exactly one of
// Argv and Cmd is set; Cmd runs as `sh -c Cmd` with the platform's own
// shell, never the sandbox's /bin/sh.
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
	// MaxOutput caps stdout and stderr each; 0 = server default (1 MiB),
	// at most MaxExecOutput.
	MaxOutput Quantity `json:"max_output,omitempty"`
	// Stream asks for an NDJSON stream of ExecEvent instead of one
	// ExecResult. "Accept: application/x-ndjson" does the same.
	Stream bool `json:"stream,omitempty"`
}

// ValidEnvName reports whether k may name an environment variable in a
// request: a letter or underscore, then letters, digits and underscores.
func ValidEnvName(k string) bool {
	for i, c := range k {
		switch {
		case c == '_', 'A' <= c && c <= 'Z', 'a' <= c && c <= 'z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return k != ""
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
	// Status is, with Error, the HTTP status the error would have had
	// before the stream started, so its kind survives the stream.
	Status int `json:"status,omitempty"`
}

// FileInfo describes a path inside a sandbox (HEAD/GET on files sets the
// X-Warren-File-* headers from it).
type FileInfo struct {
	Path  string `json:"path"`
	Size  int64  `json:"size"`
	Mode  uint32 `json:"mode"` // permission bits
	IsDir bool   `json:"is_dir"`
}

// SandboxStats is a sandbox's resource use now (GET
// /v1/sandboxes/{id}/stats), as its cgroups count it.
type SandboxStats struct {
	// CPUSeconds is the CPU time its processes used, ever.
	CPUSeconds float64 `json:"cpu_seconds"`
	// Memory is what it holds now, page cache included; MemoryPeak the
	// most it ever held (0 where the host does not say).
	Memory     int64 `json:"memory"`
	MemoryPeak int64 `json:"memory_peak"`
	// PIDs counts its processes and threads now.
	PIDs int64 `json:"pids"`
}

// Image is an environment as a sandbox starts from it: its layers resolved
// to digests, and its defaults. GET /v1/images lists every environment
// version this way.
type Image struct {
	Name      string    `json:"name"`   // "name@version"
	Layers    []string  `json:"layers"` // layer digests, bottom first
	Size      int64     `json:"size"`
	CreatedAt time.Time `json:"created_at"`
	// Defaults for the sandbox: Env under the create request's own env,
	// Workdir and User for exec calls that give none.
	Env        map[string]string `json:"env,omitempty"`
	Workdir    string            `json:"workdir,omitempty"`
	User       string            `json:"user,omitempty"`
	Entrypoint []string          `json:"entrypoint,omitempty"`
	// Unpublished: a builder's snapshot (Environment.Unpublished).
	Unpublished bool `json:"unpublished,omitempty"`
	// PrefetchTraces maps the digests of the layers that have a prefetch
	// trace (Layer.PrefetchTrace) to the trace's blob digest: a node that
	// loads layers lazily replays it when it starts a sandbox.
	PrefetchTraces map[string]string `json:"prefetch_traces,omitempty"`
}

// ImageList is the body of GET /v1/images.
type ImageList struct {
	Images []Image `json:"images"`
}

// Layer kinds. An environment stacks one base, at most one workspace and
// any number of toolkits; diff layers hold a sandbox's changes on top of
// their parent (snapshots).
const (
	LayerBase      = "base"
	LayerWorkspace = "workspace"
	LayerToolkit   = "toolkit"
	LayerDiff      = "diff"
)

// Layer is one read-only, versioned EROFS layer. Its content lives in the
// blob store as chunks listed by a manifest blob; Digest, the manifest's
// digest, is what sandboxes and environments refer to.
type Layer struct {
	Ref         string    `json:"ref"` // "name@version"
	Name        string    `json:"name"`
	Version     string    `json:"version"`
	Kind        string    `json:"kind"`
	Digest      string    `json:"digest"`       // of the manifest
	ImageDigest string    `json:"image_digest"` // of the whole EROFS image
	Size        int64     `json:"size"`         // of the EROFS image, bytes
	Chunks      int       `json:"chunks"`
	Parent      string    `json:"parent,omitempty"` // diff layers: the parent's manifest digest
	CreatedAt   time.Time `json:"created_at"`
	// UsedBy lists the environments ("name@version") that use the layer.
	UsedBy []string `json:"used_by,omitempty"`
	// PrefetchTrace is the blob digest of the layer's prefetch trace, if
	// one was recorded: the order in which a node first read its chunks
	// (the first trace any node reported), which lazily loading nodes
	// replay in the background when they start it.
	PrefetchTrace string `json:"prefetch_trace,omitempty"`
}

// LayerList is the body of GET /v1/layers.
type LayerList struct {
	Layers []Layer `json:"layers"`
}

// EnvLayer is one layer of an environment, resolved when the environment
// was created.
type EnvLayer struct {
	Ref    string `json:"ref"` // "name@version"
	Kind   string `json:"kind"`
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
}

// Environment is a named, versioned, immutable stack of layers plus the
// defaults sandboxes started from it get.
type Environment struct {
	Ref     string `json:"ref"` // "name@version"
	Name    string `json:"name"`
	Version string `json:"version"`
	// Layers, bottom first: the base, the workspace if any, then the
	// toolkits (the last one is on top).
	Layers     []EnvLayer        `json:"layers"`
	Env        map[string]string `json:"env,omitempty"`
	Workdir    string            `json:"workdir,omitempty"`
	User       string            `json:"user,omitempty"`
	Entrypoint []string          `json:"entrypoint,omitempty"`
	Size       int64             `json:"size"` // sum of the layers' sizes
	// Snapshot is the id of the snapshot this environment is, if it is
	// one (its top layer is then the snapshot's diff).
	Snapshot string `json:"snapshot,omitempty"`
	// Unpublished: a builder's snapshot not published yet (POST
	// /v1/environments/{ref}/publish). Only builders see it, create from
	// it or read its check; runners see neither it nor its snapshot.
	Unpublished bool `json:"unpublished,omitempty"`
	// Check is the last publish check's outcome (builders only).
	Check *EnvCheck `json:"check,omitempty"`
	// Squashed says the diff layers on top were squashed into the top
	// one (image.Squasher), and which they were.
	Squashed  *EnvSquash `json:"squashed,omitempty"`
	CreatedAt time.Time  `json:"created_at"`
}

// EnvSquash records a squash of an environment's diff layers.
type EnvSquash struct {
	From []string  `json:"from"` // the diff layers' refs, bottom first
	At   time.Time `json:"at"`
}

// MaxDiffDepth is how many diff layers an environment stacks on top
// before a snapshot's registration squashes them into one in the
// background; at twice as many the snapshot waits for it.
const MaxDiffDepth = 8

// DiffDepth is how many diff layers are on top of layers (bottom first).
func DiffDepth(layers []EnvLayer) int {
	n := 0
	for i := len(layers) - 1; i >= 0 && layers[i].Kind == LayerDiff; i-- {
		n++
	}
	return n
}

// SquashResult is the answer of POST /v1/environments/{ref}/squash.
type SquashResult struct {
	Environment Environment `json:"environment"`
	Squashed    bool        `json:"squashed"` // false: under two diffs, nothing to do
}

// EnvironmentList is the body of GET /v1/environments.
type EnvironmentList struct {
	Environments []Environment `json:"environments"`
}

// CreateEnvironmentRequest is the body of POST /v1/environments. Layer refs
// are "name@version", or "name" for the latest version.
//
// With From set, the new environment starts as a copy of that one and the
// other fields change it: Base and Workspace replace the layer of their
// kind, each toolkit replaces the toolkit of the same name (or goes on top
// if there is none), Env is merged in, Workdir, User and Entrypoint replace
// when set. Name defaults to From's name, and Version to the next integer
// version of that name. This is how a toolkit upgrade reaches an
// environment: a new version that shares every other layer, no data copied.
type CreateEnvironmentRequest struct {
	Name       string            `json:"name,omitempty"`
	Version    string            `json:"version,omitempty"`
	From       string            `json:"from,omitempty"`
	Base       string            `json:"base,omitempty"`
	Workspace  string            `json:"workspace,omitempty"`
	Toolkits   []string          `json:"toolkits,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	Workdir    string            `json:"workdir,omitempty"`
	User       string            `json:"user,omitempty"`
	Entrypoint []string          `json:"entrypoint,omitempty"`
}

// GCResult is the answer of POST /v1/gc: what a collection of unreferenced
// blobs found and removed.
type GCResult struct {
	Blobs        int   `json:"blobs"`         // in the blob store before
	Live         int   `json:"live"`          // referenced, kept
	Deleted      int   `json:"deleted"`       // unreferenced, removed
	DeletedBytes int64 `json:"deleted_bytes"` // their total size
	Young        int   `json:"young"`         // unreferenced but within the grace period, kept
	// Snapshots are forks' snapshots removed first: nothing used them.
	Snapshots  int   `json:"snapshots,omitempty"`
	Skipped    bool  `json:"skipped"` // another collection was running
	DurationMs int64 `json:"duration_ms"`
}

// Node pools. Placement keeps work in the on-prem pool and spills
// burstable sandboxes to the cloud pool when on-prem fills up.
const (
	PoolOnPrem = "onprem"
	PoolCloud  = "cloud"
)

// Node is the API view of one node agent.
type Node struct {
	ID string `json:"id"`
	// Name is the node's name (`warren agent --node-name`, or the name
	// its node token is bound to); empty for a node that has none.
	Name    string `json:"name,omitempty"`
	Address string `json:"address,omitempty"`
	// Pool is PoolOnPrem (also when empty) or PoolCloud.
	Pool string `json:"pool,omitempty"`
	// Labels are matched by a create's node selector, e.g. gpu-adjacent=true.
	Labels   map[string]string `json:"labels,omitempty"`
	Backends []string          `json:"backends"`
	// Machines says, for each QEMU backend the node runs (microvm, vm),
	// which accelerator its machines get (kvm or tcg) and why.
	Machines []NodeMachine `json:"machines,omitempty"`
	// Runtimes are the runtimes of the node's backends that have several
	// (CreateSandboxRequest.Runtime), the default first, each with
	// whether the node can run it and why not; an unavailable one is
	// also a line of Problems. Placement sends a create that names a
	// runtime only to nodes where it is available.
	Runtimes []NodeRuntime `json:"runtimes,omitempty"`
	// LayerLoading is how the node gets its sandboxes' layers:
	// LayersEager (each whole, before the first start) or LayersLazy
	// (chunk by chunk on first read; LayerCache counts them).
	LayerLoading string           `json:"layer_loading,omitempty"`
	LayerCache   *LayerCacheStats `json:"layer_cache,omitempty"`
	Capacity     Capacity         `json:"capacity"`
	Usage        Capacity         `json:"usage"`
	Healthy      bool             `json:"healthy"`
	Problems     []string         `json:"problems,omitempty"` // e.g. a backend unavailable here, and why
	UpdatedAt    time.Time        `json:"updated_at"`
	// LayerPrefetch says the node replays layers' prefetch traces: the
	// creates an apiserver sends it carry them (Image.PrefetchTraces);
	// other nodes get none (one that predates them would refuse the
	// field).
	LayerPrefetch bool `json:"layer_prefetch,omitempty"`
	// PrefetchTraces are the prefetch traces the node recorded lately
	// (for some minutes after each), for the control plane to keep
	// with their layers (Layer.PrefetchTrace).
	PrefetchTraces []LayerTrace `json:"prefetch_traces,omitempty"`
	// DiskQuota names how the node enforces Resources.Disk: DiskQuotaBtrfs,
	// DiskQuotaXFS, DiskQuotaExt4, or DiskQuotaNone (empty from nodes that
	// predate it: none either). Placement sends a create with a disk limit
	// only to nodes that enforce it.
	DiskQuota string `json:"disk_quota,omitempty"`
	// Network says the node gives sandboxes a network (policies
	// allowlist and open); placement sends networked creates only there.
	Network bool `json:"network,omitempty"`
	// FnRuntimes are the FnCall runtimes the node declares, with their
	// pools' state; apiservers route FnCalls by them.
	FnRuntimes []FnRuntime `json:"fn_runtimes,omitempty"`
	// Security is what the node enforces on its sandboxes (empty from
	// nodes that predate it).
	Security *NodeSecurity `json:"security,omitempty"`
	// Snapshots says what snapshots the node takes (nil: none).
	Snapshots *NodeSnapshots `json:"snapshots,omitempty"`
	// PauseReclaim says what pausing a sandbox pushes out of memory
	// here: anonymous memory to swap (how much), or file pages only
	// (no swap). Empty where no backend pauses.
	PauseReclaim string `json:"pause_reclaim,omitempty"`
	// QoS counts the node's sandboxes by QoS class and says how it runs
	// best-effort ones.
	QoS *NodeQoS `json:"qos,omitempty"`
	// InUse is what the node's sandboxes really use, as it measures it
	// (Usage is what they asked for): the node admits by both, and
	// placement ranks nodes by it.
	InUse *NodeInUse `json:"in_use,omitempty"`
	// MemoryMerge says whether and for whom the node merges sandboxes'
	// equal memory pages (KSM); nil from nodes that predate it.
	MemoryMerge *NodeMemoryMerge `json:"memory_merge,omitempty"`
}

// NodeMemoryMerge is Node.MemoryMerge. A node merges the memory of one
// group's sandboxes at a time (Project.MemoryMerge): placement sends
// another group's merging sandboxes elsewhere, and the node refuses them
// (429 node_full) while its group has a sandbox there.
type NodeMemoryMerge struct {
	// Mechanism is "ksm" where the node merges (KSM, each merging
	// sandbox opted in by the platform with prctl PR_SET_MEMORY_MERGE),
	// else "off: WHY" (then merging sandboxes run unmerged).
	Mechanism string `json:"mechanism"`
	// Group is the merge group of the node's merging sandboxes, and
	// Sandboxes how many there are; "" and 0 for none.
	Group     string `json:"group,omitempty"`
	Sandboxes int    `json:"sandboxes"`
	// Saved is the memory KSM saves on the host now (its pages_sharing).
	Saved Quantity `json:"saved"`
}

// NodeInUse is Node.InUse.
type NodeInUse struct {
	// CPU is the cores the node's work keeps busy outside the
	// best-effort class, CPUBestEffort inside it: averages over the last
	// ~10 s. CPUUnmeasured says why they are not measured, if they are
	// not (then both are 0).
	CPU           float64 `json:"cpu"`
	CPUBestEffort float64 `json:"cpu_best_effort"`
	CPUUnmeasured string  `json:"cpu_unmeasured,omitempty"`
	Cores         float64 `json:"cores"` // the host's
	// Memory is the host's memory in use (MemTotal - MemAvailable) and
	// MemoryTotal all of it; MemoryLimit is what creates may bring the
	// memory in use to (MemoryTotal less the node's reserve for the host
	// and its agent); Swap the host's swap (0: none).
	Memory      Quantity `json:"memory"`
	MemoryTotal Quantity `json:"memory_total"`
	MemoryLimit Quantity `json:"memory_limit"`
	Swap        Quantity `json:"swap"`
	// Overcommit is the ratios that bound what requests may add up to
	// (Capacity): CPU x Cores, Memory x the host's memory less the
	// reserve, plus swap.
	Overcommit NodeOvercommit `json:"overcommit"`
	// Reclaim is what the node does with idle sandboxes' memory.
	Reclaim *NodeReclaim `json:"reclaim,omitempty"`
}

// NodeReclaim is NodeInUse.Reclaim.
type NodeReclaim struct {
	// Mechanism is how the memory of sandboxes idle for IdleAfter is
	// reclaimed ("memory.force_empty" on cgroup v1, "memory.reclaim" on
	// v2), or "off", or why none.
	Mechanism string   `json:"mechanism"`
	IdleAfter Duration `json:"idle_after"`
	// Sandboxes and Bytes count the reclaims done since the agent
	// started, and what they freed.
	Sandboxes int64    `json:"sandboxes"`
	Bytes     Quantity `json:"bytes"`
	// DAMON says whether the host has DAMON and whether it is used.
	DAMON string `json:"damon"`
}

// NodeOvercommit is NodeInUse.Overcommit.
type NodeOvercommit struct {
	CPU    float64 `json:"cpu"`
	Memory float64 `json:"memory"`
}

// NodeQoS is Node.QoS.
type NodeQoS struct {
	Latency    int `json:"latency"`
	BestEffort int `json:"best_effort"`
	// Group is how a best-effort sandbox's cgroup yields the CPU to
	// others: "cpu.idle" (an idle group), else the least "cpu.shares"
	// (v1) or "cpu.weight" (v2).
	Group string `json:"group"`
	// CoreScheduling is "on" where best-effort sandboxes get core
	// scheduling cookies of their own (never sharing an SMT core with
	// latency work), else why not.
	CoreScheduling string `json:"core_scheduling"`
	// OOMOrder is who a host-wide OOM kills first, as oom_score_adj
	// values: "best-effort 1000, latency 500, agent -999" (the agent's
	// own stays 0 where the host denies it CAP_SYS_RESOURCE).
	OOMOrder string `json:"oom_order,omitempty"`
}

// NodeMachine is one entry of Node.Machines.
type NodeMachine struct {
	Backend string `json:"backend"`
	// Accel is AccelKVM or AccelTCG.
	Accel string `json:"accel"`
	// Reason says why (e.g. "/dev/kvm is served by kvm_pvm, ...").
	Reason string `json:"reason,omitempty"`
}

// NodeRuntime is one entry of Node.Runtimes.
type NodeRuntime struct {
	Backend   string `json:"backend"`
	Name      string `json:"name"` // RuntimeRunc, RuntimeGVisor
	Available bool   `json:"available"`
	// Reason says why it is not available (e.g. "runsc not found").
	Reason string `json:"reason,omitempty"`
}

// RunsRuntime reports whether node n runs sandboxes of backend ("" for
// any) under runtime, and if not why: the reason n gave, or "" when n
// has no such runtime at all.
func (n *Node) RunsRuntime(backend, runtime string) (bool, string) {
	var why string
	for _, r := range n.Runtimes {
		if (backend == "" || r.Backend == backend) && r.Name == runtime {
			if r.Available {
				return true, ""
			}
			why = r.Reason
		}
	}
	return false, why
}

// Accelerators of QEMU machines (NodeMachine.Accel).
const (
	AccelKVM = "kvm"
	AccelTCG = "tcg" // QEMU's emulator: slow, works everywhere
)

// NodeSnapshots is Node.Snapshots.
type NodeSnapshots struct {
	// Kinds are the Snapshot.Kinds the node takes: "filesystem".
	Kinds []string `json:"kinds"`
	// Processes says why the node takes no snapshots of running
	// processes (WithProcesses) when it takes none.
	ProcessesUnavailable string `json:"processes_unavailable,omitempty"`
}

// NodeSecurity is Node.Security.
type NodeSecurity struct {
	// Enforced names the mechanisms every sandbox of the node gets:
	// seccomp, no-new-privs, capabilities, masked-paths, ioctl-filter,
	// socket-filter, ksm-filter (no sandbox opts its own memory into
	// KSM: guard's deniedArgs).
	Enforced []string `json:"enforced"`
	// LSMs are the Linux security modules warren knows of (landlock,
	// apparmor): whether the host runs each, whether warren applies it.
	LSMs []NodeLSM `json:"lsms,omitempty"`
	// UserNS says whether container sandboxes run in user namespaces of
	// their own: "per-sandbox" (root inside is an unprivileged range of
	// host ids no other sandbox shares), or "off: WHY".
	UserNS string `json:"user_ns,omitempty"`
}

// NodeLSM is one Linux security module on a node.
type NodeLSM struct {
	Name    string `json:"name"`
	Active  bool   `json:"active"`  // the host's kernel runs it
	Applied bool   `json:"applied"` // warren confines sandboxes with it
	Note    string `json:"note,omitempty"`
}

// How a node limits a sandbox's disk (Node.DiskQuota).
const (
	DiskQuotaBtrfs = "btrfs" // subvolume + qgroup: bytes, inode metadata included
	DiskQuotaXFS   = "xfs"   // project quota: bytes and inodes
	DiskQuotaExt4  = "ext4"  // project quota: bytes and inodes
	DiskQuotaNone  = "none"  // the node's filesystem offers no quota it uses
)

// EnforcesDisk reports whether a node whose DiskQuota is mech can limit a
// sandbox's disk, and its inodes if inodes.
func EnforcesDisk(mech string, inodes bool) bool {
	switch mech {
	case DiskQuotaXFS, DiskQuotaExt4:
		return true
	case DiskQuotaBtrfs:
		return !inodes
	}
	return false
}

// Capacity counts a node's resources.
type Capacity struct {
	CPU       float64  `json:"cpu"`
	Memory    Quantity `json:"memory"`
	Sandboxes int      `json:"sandboxes"`
	// Paused (in Usage): how many of the sandboxes are paused. They hold
	// their memory at its paused size, and no CPU.
	Paused int `json:"paused,omitempty"`
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
	// InfraError, when set, says the call failed because of the platform,
	// not the task, and why (its node was lost, its agent restarted
	// mid-call, the platform shut it down, an internal error): a trainer
	// masks such a rollout rather than scoring it.
	InfraError string `json:"infra_error,omitempty"`
}

// How a node loads layers (Node.LayerLoading).
const (
	LayersEager = "eager"
	LayersLazy  = "lazy"
)

// LayerCacheStats are a lazily loading node's chunk cache totals since
// its layer server started (it outlives agent restarts). A "chunk" read
// or fetch here is one piece: a 64 KiB block of a chunk, or a whole chunk
// of a layer whose manifest lists no blocks.
type LayerCacheStats struct {
	Hits         int64 `json:"hits"`          // chunk reads served from the local cache
	Misses       int64 `json:"misses"`        // chunk reads that waited for a fetch
	Fetches      int64 `json:"fetches"`       // chunks fetched from the blob store
	FetchErrors  int64 `json:"fetch_errors"`  // failed fetch attempts
	FetchedBytes int64 `json:"fetched_bytes"` // from the blob store
	WrittenBytes int64 `json:"written_bytes"` // to the node's disk
	Evicted      int64 `json:"evicted"`       // chunks removed for room
	UsedBytes    int64 `json:"used_bytes"`    // held now
	LimitBytes   int64 `json:"limit_bytes"`
	// FetchMs is the time spent fetching, summed over fetches.
	FetchMs int64 `json:"fetch_ms"`
	// PrefetchedBytes are the bytes of FetchedBytes fetched ahead of any
	// read by replaying layers' prefetch traces.
	PrefetchedBytes int64 `json:"prefetched_bytes"`
}

// LayerTrace is a prefetch trace a node recorded (Node.PrefetchTraces):
// a blob in the blob store listing the order in which the node's
// sandboxes first read the chunks of a layer.
type LayerTrace struct {
	Layer string    `json:"layer"` // the layer's manifest digest
	Trace string    `json:"trace"` // the trace blob's digest
	At    time.Time `json:"at"`    // when it was stored
}

// ErrorBody wraps Error on the wire.
type ErrorBody struct {
	Error Error `json:"error"`
}

// Stable error codes. Clients switch on these, never on messages.
const (
	CodeInvalid = "invalid_argument" // 400
	// CodeTooLarge (400, limits.go) is a field over its documented limit.
	CodeUnauthenticated    = "unauthenticated"     // 401
	CodeForbidden          = "forbidden"           // 403
	CodeNotFound           = "not_found"           // 404
	CodeSandboxNotFound    = "sandbox_not_found"   // 404
	CodeImageNotFound      = "image_not_found"     // 404
	CodeLayerNotFound      = "layer_not_found"     // 404
	CodeEnvNotFound        = "env_not_found"       // 404
	CodeFileNotFound       = "file_not_found"      // 404
	CodeNotSupported       = "not_supported"       // 400: the sandbox's backend has no such call
	CodeConflict           = "conflict"            // 409
	CodeSquashRunning      = "squash_running"      // 409: a squash of the environment is under way
	CodeLayerExists        = "layer_exists"        // 409
	CodeEnvExists          = "env_exists"          // 409
	CodeLayerInUse         = "layer_in_use"        // 409
	CodeExhausted          = "resource_exhausted"  // 429
	CodeNodeFull           = "node_full"           // 429
	CodeUnavailable        = "unavailable"         // 503
	CodeNoCapacity         = "no_capacity"         // 503: no matching node has room
	CodeNoMatchingNode     = "no_matching_node"    // 503: no healthy node has the backend, pool and labels
	CodeBackendUnavailable = "backend_unavailable" // 503
	// CodeImageUnavailable: the sandbox's image cannot be read (its node
	// loads layers on demand, and the blob store cannot be reached or
	// holds a corrupt chunk). The platform's doing, not the workload's.
	CodeImageUnavailable = "image_unavailable" // 503
	// CodeDiskQuotaUnsupported: the create asks for a disk (or inode) limit
	// that the node, or every node that could take it, cannot enforce.
	CodeDiskQuotaUnsupported = "disk_quota_unsupported" // 503
	CodeSandboxLost          = "sandbox_lost"           // 503: its node is unreachable or left; GET answers state "lost"
	CodeNodeUnreachable      = "node_unreachable"       // 503: the node did not answer
	CodeInternal             = "internal"               // 500
)

// CodeSandboxGone (409 Conflict) says the platform ended the sandbox under
// the call, or before it could be answered, and why: the message names the
// reason ("ttl expired", "idle timeout", "deleted", "node shutting down").
// It is also the answer to an idempotency key replayed after its sandbox
// was deleted. It is never the workload's doing: a trainer should mask the
// rollout rather than score it. 409 like sandbox_not_running, rather than
// 410, so that every client that knows the status classes knows it.
const CodeSandboxGone = "sandbox_gone"

// CodeSandboxBusy (409 Conflict): the sandbox cannot be paused while
// calls on it are in flight; pause it when they end.
const CodeSandboxBusy = "sandbox_busy"

// PauseSelector is the body of POST /v1/sandboxes:pause and
// /v1/sandboxes:resume: every sandbox carrying all of Labels in Project's
// subtree (the caller's scope when empty), across nodes. At least one of
// the two must be given.
type PauseSelector struct {
	Labels  map[string]string `json:"labels,omitempty"`
	Project string            `json:"project,omitempty"`
}

// BulkPauseResult answers a PauseSelector: each sandbox it matched, and
// per node how many were paused (or resumed) and how many failed.
type BulkPauseResult struct {
	Sandboxes []BulkPauseItem          `json:"sandboxes"`
	Nodes     map[string]BulkNodeCount `json:"nodes"`
}

// BulkPauseEvent is one line of a bulk pause or resume answered as a
// stream (Accept: application/x-ndjson): first Total, how many sandboxes
// it matched; then each Sandbox as it is done; last the Result.
type BulkPauseEvent struct {
	Total   *int             `json:"total,omitempty"`
	Sandbox *BulkPauseItem   `json:"sandbox,omitempty"`
	Result  *BulkPauseResult `json:"result,omitempty"`
}

// BulkPauseItem is one sandbox of a bulk pause or resume: its state after
// it, or why it failed.
type BulkPauseItem struct {
	ID    string `json:"id"`
	Node  string `json:"node"`
	State string `json:"state,omitempty"`
	Error *Error `json:"error,omitempty"`
}

// BulkNodeCount is one node's part of a bulk pause or resume.
type BulkNodeCount struct {
	Done   int `json:"done"`
	Failed int `json:"failed"`
}

// SandboxUpdate is the body of PATCH /v1/sandboxes/{id}: what changes of a
// live sandbox. TTL counts from the update (the sandbox then ends that
// long from now: longer or shorter than before); IdleTimeout and
// AutoPause replace the old ones (0 turns them off). Labels are merged:
// a key with a value sets it, a key with null removes it; warren.dev/
// labels are the platform's and cannot change.
type SandboxUpdate struct {
	TTL         *Duration          `json:"ttl,omitempty"`
	IdleTimeout *Duration          `json:"idle_timeout,omitempty"`
	AutoPause   *Duration          `json:"auto_pause,omitempty"`
	Labels      map[string]*string `json:"labels,omitempty"`
}

// Labels of rollout workers and the sandboxes they drive
// (CreateSandboxRequest.Worker, WorkerOf).
const (
	LabelWorker   = "warren.dev/worker"    // "true" on a worker
	LabelWorkerOf = "warren.dev/worker-of" // the worker's id, on the sandboxes it drives
)

// LabelPrefixPlatform starts the labels the platform sets (LabelGang,
// LabelForkOf, ...): an update cannot change them.
const LabelPrefixPlatform = "warren.dev/"

// JournalEntry is one call on a sandbox, as its node recorded it (GET
// /v1/sandboxes/{id}/journal): what was asked, when, how long it took and
// how it ended, with a bounded head and tail of an exec's output.
type JournalEntry struct {
	Seq  int64     `json:"seq"`  // 1, 2, ... per sandbox
	Time time.Time `json:"time"` // when the call started
	// Verb is exec, write_file, read_file, write_tar, read_tar, stat,
	// pause, resume, update or snapshot.
	Verb string   `json:"verb"`
	Argv []string `json:"argv,omitempty"`
	Cmd  string   `json:"cmd,omitempty"`
	Cwd  string   `json:"cwd,omitempty"`
	User string   `json:"user,omitempty"`
	Path string   `json:"path,omitempty"`
	// By is who paused or resumed (api.PauseInfo.By, ResumedBy).
	By string `json:"by,omitempty"`

	DurationMS float64 `json:"duration_ms"`
	// An exec's end: ExitCode (with Signal and TimedOut); any call's
	// failure: Error (the API error it answered).
	ExitCode *int   `json:"exit_code,omitempty"`
	Signal   string `json:"signal,omitempty"`
	TimedOut bool   `json:"timed_out,omitempty"`
	Error    *Error `json:"error,omitempty"`
	// An exec's output: byte counts, and its first and last
	// JournalOutputBytes (head and tail; the tail only past the head).
	StdoutBytes int64  `json:"stdout_bytes,omitempty"`
	StderrBytes int64  `json:"stderr_bytes,omitempty"`
	StdoutHead  string `json:"stdout_head,omitempty"`
	StdoutTail  string `json:"stdout_tail,omitempty"`
	StderrHead  string `json:"stderr_head,omitempty"`
	StderrTail  string `json:"stderr_tail,omitempty"`
	// Bytes a file call moved.
	Bytes int64 `json:"bytes,omitempty"`
}

// Journal is the body of GET /v1/sandboxes/{id}/journal?since=SEQ: the
// entries after SEQ, oldest first. Dropped counts entries before them the
// node no longer keeps (it keeps the newest MaxJournalEntries).
type Journal struct {
	Sandbox string         `json:"sandbox"`
	Entries []JournalEntry `json:"entries"`
	Dropped int64          `json:"dropped,omitempty"`
}

// Journal bounds: entries kept per sandbox, and output kept per stream
// at each end.
const (
	MaxJournalEntries  = 4096
	JournalOutputBytes = 512
)
