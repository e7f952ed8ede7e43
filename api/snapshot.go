package api

import (
	"fmt"
	"time"
)

// SnapshotRequest is the body of POST /v1/sandboxes/{id}/snapshot: what
// the sandbox has written becomes a diff layer on top of its own layers,
// and the stack an environment, Name@Version, that any node can create
// sandboxes from (`--image name@version`). The sandbox runs on.
type SnapshotRequest struct {
	// Name of the environment (and of its diff layer). Empty: the
	// snapshot's id, for a snapshot nobody will ask for by name.
	Name string `json:"name,omitempty"`
	// Version; empty: the next integer version of Name.
	Version string `json:"version,omitempty"`
	// Strip are absolute paths inside the sandbox to leave out, with
	// everything under them, even where a lower layer has them (shell
	// histories, caches, answers a builder must not ship). A path that
	// passes through a symlink is refused: name where it points.
	Strip []string `json:"strip,omitempty"`
	// KeepResidue keeps the build residue a snapshot otherwise leaves
	// out of what the sandbox wrote: shell and REPL histories, caches
	// (~/.cache, package managers'), and the contents of /tmp and
	// /var/tmp. Stats.Residue says what was left out.
	KeepResidue bool `json:"keep_residue,omitempty"`
	// WithProcesses asks for the sandbox's running processes too (CRIU),
	// not only its files. No node takes such snapshots yet: each answers
	// 503 process_snapshot_unavailable with its reason (Node.Snapshots).
	WithProcesses bool `json:"with_processes,omitempty"`
	// Labels are recorded on the snapshot (a trajectory's step, say).
	Labels map[string]string `json:"labels,omitempty"`
}

// MaxStripPaths bounds SnapshotRequest.Strip.
const MaxStripPaths = 256

// Snapshot is a sandbox's state at one instant, kept as an environment
// whose top layer is the diff (GET /v1/snapshots/{id}).
type Snapshot struct {
	ID string `json:"id"` // "snap-<16 hex>"
	// Ref is the environment it is: "name@version".
	Ref     string `json:"ref"`
	Name    string `json:"name"`
	Version string `json:"version"`
	// Source is the sandbox it was taken from, SourceImage what that
	// sandbox was created from, Parent the snapshot that image is, if it
	// is one (the lineage).
	Source      string `json:"source"`
	SourceImage string `json:"source_image,omitempty"`
	Parent      string `json:"parent,omitempty"`
	Project     string `json:"project"`
	// Layer is the diff: what the sandbox wrote.
	Layer  EnvLayer          `json:"layer"`
	Labels map[string]string `json:"labels,omitempty"`
	// Kind is "filesystem": files only, processes start afresh.
	Kind string `json:"kind"`
	// Unpublished: the builder's, until its environment is published
	// (runners see neither).
	Unpublished bool `json:"unpublished,omitempty"`
	// Ephemeral: made by a fork, for its branches; garbage collection
	// removes it once no live sandbox uses it and no snapshot builds on
	// it (and it is older than the GC grace period).
	Ephemeral bool `json:"ephemeral,omitempty"`
	// Stats of the taking.
	Stats     SnapshotStats `json:"stats"`
	CreatedBy string        `json:"created_by,omitempty"` // the token that took it
	CreatedAt time.Time     `json:"created_at"`
}

// SnapshotKindFilesystem is the only Snapshot.Kind yet.
const SnapshotKindFilesystem = "filesystem"

// SnapshotStats say what taking a snapshot cost.
type SnapshotStats struct {
	// FreezeMS is how long the sandbox was held still (milliseconds);
	// Method how its writes were copied meanwhile ("btrfs-snapshot",
	// "reflink" or "copy").
	FreezeMS float64 `json:"freeze_ms"`
	Method   string  `json:"method"`
	// PackMS is building the diff layer and storing it; TotalMS the
	// whole call as the node saw it.
	PackMS  float64 `json:"pack_ms"`
	TotalMS float64 `json:"total_ms"`
	// Files and Bytes are what the sandbox wrote (entries, data bytes);
	// Chunks the diff layer's, of which Uploaded (UploadedBytes) were
	// new to the blob store.
	Files         int   `json:"files"`
	Bytes         int64 `json:"bytes"`
	Chunks        int   `json:"chunks"`
	Uploaded      int   `json:"uploaded"`
	UploadedBytes int64 `json:"uploaded_bytes"`
	// Residue is the build residue left out (sandbox paths, at most
	// MaxResidueShown and then a count).
	Residue []string `json:"residue,omitempty"`
}

// MaxResidueShown bounds SnapshotStats.Residue.
const MaxResidueShown = 64

// SnapshotList is the body of GET /v1/snapshots.
type SnapshotList struct {
	Snapshots []Snapshot `json:"snapshots"`
}

// Error codes of snapshots.
const (
	CodeSnapshotNotFound  = "snapshot_not_found"  // 404
	CodeSnapshotTooSparse = "snapshot_too_sparse" // 400: over MaxSnapshotHoles
	// CodeProcessSnapshotUnavailable (503): the node cannot snapshot
	// processes (WithProcesses); the message says why.
	CodeProcessSnapshotUnavailable = "process_snapshot_unavailable"
)

// MaxSnapshotHoles bounds the holes in the files a snapshot takes (their
// sizes less their data): layers keep holes as holes, but building one
// reads through them (erofs-utils 1.5 hashes every zero), ~4 s per GiB
// here, so a sandbox could otherwise make its snapshots cost hours with
// one truncate.
const MaxSnapshotHoles = 1 << 30

// PackRequest is the body of the node API's POST
// /v1/sandboxes/{id}/pack, the node's half of a snapshot: copy what the
// sandbox wrote (held still only for the copy), build it into a diff
// layer on top of the sandbox's layers, store it in the blob store and
// the node's layer cache. It registers nothing: the apiserver does.
type PackRequest struct {
	Strip []string `json:"strip,omitempty"`
	// KeepResidue: strip no build residue (a fork keeps its parent's
	// state whole).
	KeepResidue bool `json:"keep_residue,omitempty"`
	// WithProcesses asks for the running processes too; nodes answer 503
	// process_snapshot_unavailable, saying why (Node.Snapshots).
	WithProcesses bool `json:"with_processes,omitempty"`
}

// PackResult is the node's answer to a PackRequest.
type PackResult struct {
	// Digest of the diff layer's manifest (in the blob store), its
	// image's digest and size, on top of Parent (the sandbox's top
	// layer); Layers are the sandbox's layers, bottom first.
	Digest      string        `json:"digest"`
	ImageDigest string        `json:"image_digest"`
	Size        int64         `json:"size"`
	Parent      string        `json:"parent"`
	Layers      []string      `json:"layers"`
	Stats       SnapshotStats `json:"stats"`
}

// CheckSnapshot checks a snapshot request's sizes: name, version, strip
// paths and labels.
func CheckSnapshot(req *SnapshotRequest) error {
	if err := checkLen("name", req.Name, MaxRefLen); err != nil {
		return err
	}
	if err := checkLen("version", req.Version, MaxRefLen); err != nil {
		return err
	}
	if len(req.Strip) > MaxStripPaths {
		return tooMany("strip", len(req.Strip), MaxStripPaths)
	}
	for i, p := range req.Strip {
		if err := checkLen(fmt.Sprintf("strip[%d]", i), p, MaxPathLen); err != nil {
			return err
		}
	}
	return CheckLabels("labels", req.Labels, MaxLabels)
}

// ForkRequest is the body of POST /v1/sandboxes/{id}/fork: Count new
// sandboxes from the sandbox's state now (a snapshot of it), each
// isolated from its siblings and from the parent, which runs on. They
// are made as a gang (BatchCreateRequest), with the parent's backend,
// resources, network policy, TTL and idle timeout, its labels and these
// on top, and LabelForkOf and LabelSnapshot; on the parent's node when it
// has room (its layers are there), on others when it has not.
type ForkRequest struct {
	Count     int               `json:"count,omitempty"` // 1..MaxBatchCount; 0 means 1
	Labels    map[string]string `json:"labels,omitempty"`
	AllOrNone bool              `json:"all_or_none,omitempty"`
	// WithProcesses: the branches continue the parent's processes
	// (SnapshotRequest.WithProcesses; unavailable everywhere yet).
	WithProcesses bool `json:"with_processes,omitempty"`
}

// ForkResponse answers a ForkRequest: the snapshot the branches start
// from, and the gang as a batch create answers it.
type ForkResponse struct {
	Snapshot Snapshot `json:"snapshot"`
	BatchCreateResponse
}

// Labels a fork puts on its branches.
const (
	LabelForkOf   = "warren.dev/fork-of"  // the parent sandbox's id
	LabelSnapshot = "warren.dev/snapshot" // the snapshot a sandbox was made from
)

// CheckFork checks a fork request's count and labels.
func CheckFork(req *ForkRequest) error {
	if req.Count < 0 || req.Count > MaxBatchCount {
		return fmt.Errorf("count %d: want 1 to %d", req.Count, MaxBatchCount)
	}
	return CheckLabels("labels", req.Labels, MaxLabels)
}

// Lineage is the tree of GET /v1/snapshots/{ref}/lineage: where a
// snapshot (or a sandbox) comes from and what came of it.
type Lineage struct {
	// Ancestors are the snapshots it descends from, the oldest first,
	// each taken of a sandbox made from the one before; Base the
	// environment the oldest was taken on.
	Ancestors []Snapshot `json:"ancestors"`
	Base      string     `json:"base,omitempty"`
	// Root is what was asked about, with everything made from it.
	Root LineageNode `json:"root"`
}

// LineageNode is a snapshot or a sandbox in a Lineage: a snapshot's
// children are the sandboxes made from it (forks among them) and the
// snapshots taken of sandboxes no longer there; a sandbox's, the
// snapshots taken of it.
type LineageNode struct {
	Snapshot *Snapshot     `json:"snapshot,omitempty"`
	Sandbox  *Sandbox      `json:"sandbox,omitempty"`
	Children []LineageNode `json:"children,omitempty"`
}

// CodeSnapshotInUse is the 409 of deleting a snapshot that others build
// on (snapshots of sandboxes made from it, live sandboxes), unless forced.
const CodeSnapshotInUse = "snapshot_in_use"

// PublishRequest is the body of POST /v1/environments/{ref}/publish:
// the environment is published (runners may see it and create from it)
// only if Check, when given, passes: it runs as `sh -c` in a fresh
// sandbox made from the environment, and must exit 0 within Timeout
// (default 10 minutes). Its outcome is kept on the environment either
// way.
type PublishRequest struct {
	Check   string   `json:"check,omitempty"`
	Timeout Duration `json:"timeout,omitempty"`
}

// EnvCheck is how a publish check ended.
type EnvCheck struct {
	Command    string    `json:"command"`
	Passed     bool      `json:"passed"`
	ExitCode   int       `json:"exit_code"`
	TimedOut   bool      `json:"timed_out,omitempty"`
	Stdout     string    `json:"stdout"` // at most MaxCheckOutput bytes each
	Stderr     string    `json:"stderr"`
	DurationMS float64   `json:"duration_ms"`
	Sandbox    string    `json:"sandbox"` // where it ran (deleted after)
	CheckedAt  time.Time `json:"checked_at"`
}

// MaxCheckOutput bounds the output a publish check keeps.
const MaxCheckOutput = 64 << 10

// CodeCheckFailed is the 409 of a publish whose check did not pass (the
// environment stays unpublished; its check says why).
const CodeCheckFailed = "check_failed"

// CheckPublish checks a publish request's sizes.
func CheckPublish(req *PublishRequest) error {
	if err := checkLen("check", req.Check, MaxArgLen); err != nil {
		return err
	}
	if req.Timeout < 0 {
		return fmt.Errorf("timeout %v: negative", time.Duration(req.Timeout))
	}
	return nil
}
