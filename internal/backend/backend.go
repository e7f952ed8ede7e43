// Package backend is the contract between the node agent and the ways it can
// run a sandbox (fncall, container, microvm, vm, and a fake for tests).
//
// The core interface is small: Create, Start, Wait, Stop, Destroy, Recover,
// Inspect, Capabilities. Exec, file transfer and later pause and snapshot are
// optional interfaces found at run time; each implementation states them with
// a compile-time guard such as `var _ backend.Execer = (*Container)(nil)`.
// A backend may run sandboxes under several runtimes (Spec.Runtime, such as
// the container backend's runc and gVisor); it then says per runtime what
// their sandboxes offer and whether this host runs them (Runtimes).
// Every backend passes the conformance suite in backendtest.
//
// Error kinds come from internal/errdefs: ErrNotFound for an unknown id,
// ErrInvalid for a bad spec or request, ErrUnavailable when a host feature the
// backend needs is missing (the agent reports it and keeps working).
package backend

import (
	"context"
	"image"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/warrenhq/warren/internal/errdefs"
)

// Layer is one read-only EROFS layer, already present on local disk.
type Layer struct {
	Digest string // "sha256:<hex>"
	Path   string // the EROFS image file on this host
}

// Resources are a sandbox's limits. Zero means unlimited (the agent always
// fills them in).
type Resources struct {
	CPU    float64 // cores
	Memory int64   // bytes
	PIDs   int64
	// Disk and DiskInodes limit the sandbox's writable layer; only a
	// DiskLimiter whose DiskQuota allows it takes them, others refuse.
	// Zero means no limit (the agent fills in the node's default).
	Disk       int64 // bytes
	DiskInodes int64
}

// Spec is everything a backend needs to create a sandbox. The agent persists
// it and hands it back to Recover after a restart.
type Spec struct {
	ID        string   // unique on the node; also the hostname
	Layers    []Layer  // bottom first
	Env       []string // KEY=VALUE, defaults for every exec
	Workdir   string   // default cwd for exec, "/" if empty
	Resources Resources
	// DNS are the nameservers the sandbox's /etc/resolv.conf names (the
	// node's DNS proxy); empty leaves the environment's file alone.
	DNS []string `json:",omitempty"`
	// Runtime chooses how a backend with several runtimes (Runtimes)
	// runs the sandbox; "" is its default. Persisted with the spec, so
	// Recover re-adopts the sandbox under the runtime that created it.
	Runtime string `json:",omitempty"`
	// BestEffort puts the sandbox in the best-effort QoS class: all its
	// processes, including ones started later, under SCHED_IDLE, its
	// cgroup an idle group (internal/qos). Backends that cannot refuse
	// it (QoS false in Capabilities).
	BestEffort bool `json:",omitempty"`
	// MemoryMerge opts the sandbox's memory into KSM, to be merged with
	// the equal pages of other sandboxes of its merge group (the node
	// runs one group's at a time). Only backends that are MemoryMergers
	// get it; a runtime that cannot (gVisor) ignores it.
	MemoryMerge bool `json:",omitempty"`
}

// MemoryMerger is a backend that can opt its sandboxes' memory into KSM
// (Spec.MemoryMerge). MemoryMerge says whether it can on this host: nil,
// or why not.
type MemoryMerger interface {
	MemoryMerge() error
}

// State of a sandbox as the backend sees it.
type State string

const (
	StateCreated State = "created" // prepared, not started
	StateRunning State = "running"
	StatePaused  State = "paused"
	StateStopped State = "stopped" // its init exited
)

// Status is what Inspect and Recover report.
type Status struct {
	State     State
	Pid       int       // host pid of the sandbox's init, if any
	StartedAt time.Time // zero if never started
	ExitCode  int       // when stopped
	Reason    string    // free text when something went wrong
}

// Capabilities say what a backend offers beyond the core contract, so the
// SDK can unify access without pretending the semantics are the same.
type Capabilities struct {
	Exec     bool // implements Execer
	Files    bool // implements Files
	Hostname bool // the sandbox's hostname is its id
	Isolated bool // own pid/mount/net namespaces (or a VM): the fake is not
	Limits   bool // memory, CPU and pid limits are enforced
	Recover  bool // sandboxes survive an agent restart
	Pause    bool
	Snapshot bool
	QoS      bool // runs Spec.BestEffort sandboxes as best-effort
}

// DiskQuota says whether and how a backend limits a sandbox's writable
// layer (Resources.Disk and DiskInodes) on this host.
type DiskQuota struct {
	Mechanism string // "btrfs", "xfs", "ext4", or "none" (api.DiskQuota*)
	Inodes    bool   // DiskInodes is enforced too
	Reason    string // why "none"
}

// Runtimes is a backend that runs each sandbox under one of several
// runtimes (Spec.Runtime), such as the container backend's runc and
// gVisor. Its sandboxes differ by runtime in what they offer and in
// whether this host can run them at all.
type Runtimes interface {
	// Runtimes names the runtimes Spec.Runtime may choose, the default
	// first.
	Runtimes() []string
	// RuntimeCapabilities are the Capabilities of the runtime's
	// sandboxes: at most those of Capabilities(). An optional interface
	// the backend implements may still refuse them a call it cannot
	// honour, with ErrUnavailable. ErrInvalid for an unknown runtime.
	RuntimeCapabilities(runtime string) (Capabilities, error)
	// RuntimeAvailable is Available for the runtime's sandboxes: nil,
	// or ErrUnavailable saying why this host cannot run them.
	RuntimeAvailable(ctx context.Context, runtime string) error
}

// DiskLimiter is a backend that can limit a sandbox's writable layer.
// Create refuses a disk limit it cannot enforce (ErrUnavailable, code
// disk_quota_unsupported); a backend that is not a DiskLimiter takes no
// disk limit at all.
type DiskLimiter interface {
	DiskQuota() DiskQuota
}

// Backend is the core contract.
type Backend interface {
	// Name is the backend's API name, e.g. "container".
	Name() string
	Capabilities() Capabilities
	// Available returns nil if this host can run the backend, or an
	// ErrUnavailable saying what is missing.
	Available(ctx context.Context) error

	// Create prepares the sandbox (root filesystem, limits) without starting
	// it. On error nothing is left behind.
	Create(ctx context.Context, spec Spec) error
	// Start starts a created sandbox.
	Start(ctx context.Context, id string) error
	// Wait blocks until the sandbox's init exits or ctx ends, and returns
	// its status. It works for recovered sandboxes too.
	Wait(ctx context.Context, id string) (Status, error)
	// Stop asks the sandbox to stop, killing it after grace.
	Stop(ctx context.Context, id string, grace time.Duration) error
	// Destroy stops the sandbox if needed and removes everything it holds:
	// processes, mounts, cgroups, runtime state, directories. Destroying an
	// unknown or already destroyed id is not an error.
	Destroy(ctx context.Context, id string) error
	// Inspect reports the sandbox's status; ErrNotFound if unknown.
	Inspect(ctx context.Context, id string) (Status, error)
	// Recover re-adopts a sandbox created by an earlier process of the
	// agent, from the spec it persisted. It returns the sandbox's status
	// (StateStopped if it died meanwhile); the agent decides what to do.
	Recover(ctx context.Context, spec Spec) (Status, error)
}

// ExecRequest is one command to run in a sandbox.
type ExecRequest struct {
	Argv []string // argv[0] is looked up in PATH inside the sandbox
	// Shell, if set instead of Argv, is a command line for the platform's
	// own shell (`sh -c Shell`): a backend never runs the sandbox's
	// /bin/sh for it, which the workload may have replaced.
	Shell   string
	Env     []string  // KEY=VALUE, added to the spec's Env
	Cwd     string    // default spec.Workdir
	User    string    // "", name, "uid" or "uid:gid"
	Stdin   io.Reader // nil = empty
	Stdout  io.Writer // the caller caps and frames output
	Stderr  io.Writer
	Timeout time.Duration // 0 = none; the caller always sets one
}

// ExecResult is how a command ended.
type ExecResult struct {
	ExitCode int    // 128+n when killed by signal n, as a shell reports it
	Signal   string // "SIGKILL" etc. when killed by a signal, else ""
	TimedOut bool   // Timeout passed and every process the exec started was killed
	Duration time.Duration
}

// Execer runs commands inside a sandbox from the host: nothing inside the
// sandbox serves the request. On timeout, the whole process tree of that
// exec is killed (not the sandbox) and the result says TimedOut. An exec
// whose ctx ends is killed the same way.
type Execer interface {
	Exec(ctx context.Context, id string, req ExecRequest) (ExecResult, error)
}

// FileInfo describes one path inside a sandbox.
type FileInfo struct {
	Size  int64
	Mode  uint32 // permission bits
	IsDir bool
}

// Files moves files in and out of a sandbox. Every path is resolved strictly
// inside the sandbox's root: a symlink planted inside can never make the
// host read or write outside it.
type Files interface {
	// Stat describes path; ErrNotFound if missing.
	Stat(ctx context.Context, id, path string) (FileInfo, error)
	// WriteFile creates or replaces a regular file, creating parents.
	WriteFile(ctx context.Context, id, path string, mode uint32, r io.Reader) error
	// ReadFile streams a regular file to w.
	ReadFile(ctx context.Context, id, path string, w io.Writer) error
	// WriteTar extracts a tar stream under dir, creating dir if needed.
	WriteTar(ctx context.Context, id, dir string, r io.Reader) error
	// ReadTar writes path (a file or a whole directory) to w as a tar
	// stream whose entries are named relative to path's parent.
	ReadTar(ctx context.Context, id, path string, w io.Writer) error
}

// Stats are a sandbox's resource use now, as its cgroups count it.
type Stats struct {
	CPU        time.Duration // CPU time used by every process, ever
	Memory     int64         // bytes in use now (page cache included)
	MemoryPeak int64         // the most ever in use; 0 if the host does not say
	PIDs       int64         // processes and threads now
}

// NetNSer is a backend whose sandboxes each have a Linux network
// namespace the node may enter from outside: to give the sandbox a
// network (package egress) and to reach its ports. NetNS returns an open
// descriptor of it, checked to be the running sandbox's (not a recycled
// pid's); the caller closes it.
type NetNSer interface {
	NetNS(ctx context.Context, id string) (*os.File, error)
}

// Statser reports a sandbox's resource use.
type Statser interface {
	Stats(ctx context.Context, id string) (Stats, error)
}

// Reclaimer pushes a running sandbox's memory out: what a node does for
// the sandboxes nobody has used for a while, which must keep their memory
// but seldom touch most of it. What goes: its page cache (the file pages
// of what it read and wrote) always, anonymous memory only where the
// node swaps. Touched again, it comes back (from its files, or swap).
type Reclaimer interface {
	Reclaim(ctx context.Context, id string) (ReclaimStats, error)
}

// ReclaimStats says what a Reclaim did.
type ReclaimStats struct {
	Before, After int64  // bytes charged to the sandbox before and after
	How           string // the mechanism, e.g. "memory.force_empty"
}

// Pauser holds sandboxes still and pushes their memory out, and lets
// them run again: what a node does with the sandboxes of a preempted
// trainer. A paused sandbox's processes get no CPU and its memory goes to
// swap (or zram) where the node has some; file pages go back to their
// files in any case. Its state is StatePaused (Recover says so too).
type Pauser interface {
	// Pause freezes sandbox id, then reclaims its memory as far as the
	// node can. ErrConflict when it is not running; paused already is
	// no error.
	Pause(ctx context.Context, id string) (PauseStats, error)
	// Resume thaws it; its pages come back as they are touched. Running
	// already is no error.
	Resume(ctx context.Context, id string) error
}

// PauseStats say what a Pause did.
type PauseStats struct {
	Freeze time.Duration // until every process was frozen
	// Before and After are the memory charged to the sandbox (bytes)
	// before the freeze and after the reclaim.
	Before, After int64
	// Reclaim is how memory was pushed out ("memory.reclaim",
	// "memory.force_empty"), or "none: WHY".
	Reclaim string
}

// Snapshotter captures what a sandbox wrote, for a snapshot or a fork:
// its writable layer as an overlayfs upper directory (whiteouts as 0/0
// character devices, opaque directories by the trusted.overlay.opaque
// xattr), which stacks as one more layer on the sandbox's own layers.
type Snapshotter interface {
	// Snapshot holds sandbox id still (frozen) only as long as taking a
	// copy of its writable layer needs, then lets it run on. Each path
	// in req.Strip is left out of the copy and hidden (a whiteout) where
	// a lower layer has it, then whatever req.Residue matches in it
	// (rootfs.StripAll). ErrConflict when the sandbox is not running;
	// the sandbox keeps running untouched on any error.
	Snapshot(ctx context.Context, id string, req SnapshotRequest) (*Snapshot, error)
}

// SnapshotRequest says what a Snapshot leaves out.
type SnapshotRequest struct {
	// Strip are absolute paths inside the sandbox, left out of the copy
	// with everything under them.
	Strip []string
	// Residue are patterns (rootfs.Residue) of build residue to strip
	// where the sandbox wrote it.
	Residue []string
}

// Snapshot is a copy of a sandbox's writable layer on the node's disk.
type Snapshot struct {
	Upper  string        // the copy: an overlayfs upper directory
	Freeze time.Duration // how long the sandbox was held still
	// Method is how the copy was made: "btrfs-snapshot" (one
	// transaction, blocks shared), "reflink" (files cloned, blocks
	// shared) or "copy".
	Method string
	// Residue is what req.Residue matched and was stripped.
	Residue []string
	// Remove deletes the copy; the caller must call it.
	Remove func() error
}

// Accelerated is a backend whose sandboxes are machines (QEMU): Accel
// says which accelerator they run under ("kvm" or "tcg") and why.
type Accelerated interface {
	Accel() (accel, why string)
}

// PortDialer reaches TCP ports inside a sandbox from the node, whatever
// its network policy (none included): DialPort connects to
// 127.0.0.1:port inside the sandbox's own network (for a container, from
// inside its network namespace; nothing inside the sandbox relays it).
// ErrNotFound for an unknown id, ErrConflict when the sandbox is not
// running; when nothing accepts the connection, an error wrapping
// syscall.ECONNREFUSED.
type PortDialer interface {
	DialPort(ctx context.Context, id string, port int) (net.Conn, error)
}

// ValidID checks that id can name a sandbox on a node: 1 to 128 of
// [A-Za-z0-9._-], starting with a letter or digit, so that it is a safe
// path element and hostname-like. ErrInvalid otherwise.
func ValidID(id string) error {
	if id == "" || len(id) > 128 {
		return errdefs.Invalid("sandbox id %q: want 1 to 128 characters", id)
	}
	for i, r := range id {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' ||
			i > 0 && (r == '-' || r == '_' || r == '.')
		if !ok {
			return errdefs.Invalid("sandbox id %q: want [A-Za-z0-9][A-Za-z0-9._-]*", id)
		}
	}
	return nil
}

// Displayer is a backend whose sandboxes have a screen (the vm backend):
// a screenshot of it, and keyboard and pointer input to it.
type Displayer interface {
	// Screen returns what the sandbox's display shows now. ErrConflict
	// when it is not running.
	Screen(ctx context.Context, id string) (image.Image, error)
	// Input sends events, in order. A bad event (unknown key, a point
	// off the screen) is ErrInvalid and nothing is sent.
	Input(ctx context.Context, id string, events []InputEvent) error
}

// InputEvent is one keyboard or pointer action.
type InputEvent struct {
	// Type is "text" (Text typed as on a US keyboard), "key" (Key, one
	// combination such as "Return" or "ctrl-alt-f2"), "move" (the
	// pointer to X, Y) or "click" (Button at X, Y: "left" by default,
	// "middle", "right", "wheel-up", "wheel-down").
	Type   string `json:"type"`
	Text   string `json:"text,omitempty"`
	Key    string `json:"key,omitempty"`
	X      int    `json:"x,omitempty"`
	Y      int    `json:"y,omitempty"`
	Button string `json:"button,omitempty"`
}

// DefaultPath is the PATH an exec gets when neither the sandbox's env nor
// the request sets one.
const DefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// ExecEnv is an exec's environment: base (the sandbox's), then extra
// (the request's), later keys winning, with PATH (DefaultPath) and HOME
// (/root for uid 0, else /) defaulted.
func ExecEnv(base, extra []string, uid uint32) []string {
	idx := make(map[string]int)
	var env []string
	for _, kv := range append(append([]string(nil), base...), extra...) {
		k, _, _ := strings.Cut(kv, "=")
		if i, ok := idx[k]; ok {
			env[i] = kv
			continue
		}
		idx[k] = len(env)
		env = append(env, kv)
	}
	if _, ok := idx["PATH"]; !ok {
		env = append(env, DefaultPath)
	}
	if _, ok := idx["HOME"]; !ok {
		if uid == 0 {
			env = append(env, "HOME=/root")
		} else {
			env = append(env, "HOME=/")
		}
	}
	return env
}
