// Package fake is a Backend for fast tests of the layers above the backends
// (node agent, apiserver, SDKs) that needs neither root nor any host
// feature.
//
// It is NOT a sandbox and isolates nothing: each sandbox is a directory
// tree under a base directory, and Exec runs the argv as an ordinary host
// process, as the user running the tests, with the sandbox's root as its
// working directory. Never use it to run untrusted code. Only the file calls
// are confined to the sandbox's root (they go through package rootfs, like
// the container backend's).
//
// What it does model: the lifecycle states and their errors, persistence of
// state for Recover (a new Backend over the same base directory re-adopts
// sandboxes), exec exit codes, signals, timeouts and cancellation (each exec
// runs in its own process group, killed entirely), and Stop and Destroy
// killing every process an exec left behind. Layers and Resources in a Spec
// are ignored. Options inject slowness and failures for tests of upper
// layers.
//
// Layout: <base>/<id>/root is the sandbox's "/", <base>/<id>/state.json its
// persisted state.
package fake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
)

// Name is the backend's default API name.
const Name = "fake"

// Options tune a fake Backend for tests. The zero value is a fast backend
// that works.
type Options struct {
	// Name overrides the name the backend reports, e.g. to stand in for
	// "container" in placement tests. Default "fake".
	Name string
	// CreateDelay makes every Create wait this long (or until its ctx
	// ends) before doing anything, to simulate a slow backend. The id is
	// already taken meanwhile: a second Create of it is ErrConflict.
	CreateDelay time.Duration
	// CreateHook, if set, runs in every Create after CreateDelay; a
	// non-nil error fails that Create and nothing is left behind. Use it to
	// inject failures, count calls or block.
	CreateHook func(ctx context.Context, spec backend.Spec) error
	// Unavailable, if set, is what Available returns, to test how the
	// agent reports a backend that cannot run on its host.
	Unavailable error
	// Runtimes, if set, are the runtimes Spec.Runtime may name, the
	// default first (backend.Runtimes); by default the backend names
	// none, and Create refuses any. RuntimeUnavailable maps a runtime
	// to what RuntimeAvailable (and Create) return for it.
	Runtimes           []string
	RuntimeUnavailable map[string]error
}

// Backend is the fake backend. Its methods are safe for concurrent use.
type Backend struct {
	base string
	opts Options

	mu    sync.Mutex
	boxes map[string]*box

	ports ports // listeners tests put in sandboxes (ports.go)
}

var (
	_ backend.Backend = (*Backend)(nil)
	_ backend.Execer  = (*Backend)(nil)
	_ backend.Files   = (*Backend)(nil)
)

// box is one sandbox. Fields other than spec and dir are guarded by
// Backend.mu.
type box struct {
	spec  backend.Spec
	dir   string
	ready bool // false while Create is still running
	st    backend.Status
	done  chan struct{} // closed when st.State becomes stopped
}

func (x *box) root() string { return filepath.Join(x.dir, "root") }

// New returns a fake backend keeping its sandboxes under base, which is
// created if missing. A new Backend over the base of an earlier one
// re-adopts that one's sandboxes through Recover.
func New(base string, opts Options) (*Backend, error) {
	if opts.Name == "" {
		opts.Name = Name
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		return nil, fmt.Errorf("fake: %w", err)
	}
	return &Backend{base: base, opts: opts, boxes: map[string]*box{}}, nil
}

// Base is the directory holding the sandboxes.
func (b *Backend) Base() string { return b.base }

// Root is the host path of sandbox id's root directory, for tests that
// look at it directly.
func (b *Backend) Root(id string) string { return filepath.Join(b.base, id, "root") }

// Name returns the backend's API name.
func (b *Backend) Name() string { return b.opts.Name }

// Capabilities: exec, files and recovery; no isolation, hostname or limits.
func (b *Backend) Capabilities() backend.Capabilities {
	// QoS: it keeps Spec.BestEffort, which is all there is to check of
	// the layers above; the real backends' tests check the scheduling.
	return backend.Capabilities{Exec: true, Files: true, Recover: true, Snapshot: true, QoS: true}
}

// Available returns Options.Unavailable, or ErrUnavailable if there is no
// /bin/sh to run execs with.
func (b *Backend) Available(ctx context.Context) error {
	if b.opts.Unavailable != nil {
		return b.opts.Unavailable
	}
	if _, err := os.Stat("/bin/sh"); err != nil {
		return errdefs.Unavailable("fake: no /bin/sh on the host: %v", err)
	}
	return nil
}

// Create makes the sandbox's directories. ErrInvalid for a bad id,
// ErrConflict if the id is taken, also by a directory an earlier process
// left that was not recovered.
func (b *Backend) Create(ctx context.Context, spec backend.Spec) error {
	if err := validID(spec.ID); err != nil {
		return err
	}
	if err := b.checkRuntime(ctx, spec); err != nil {
		return err
	}
	x := &box{spec: spec, dir: filepath.Join(b.base, spec.ID), done: make(chan struct{}),
		st: backend.Status{State: backend.StateCreated}}
	b.mu.Lock()
	_, taken := b.boxes[spec.ID]
	if !taken {
		_, err := os.Lstat(x.dir)
		taken = err == nil
	}
	if taken {
		b.mu.Unlock()
		return errdefs.New(errdefs.ErrConflict, "sandbox_exists", "fake: sandbox %s already exists", spec.ID)
	}
	b.boxes[spec.ID] = x // reserved, not ready
	b.mu.Unlock()

	err := b.create(ctx, x)
	b.mu.Lock()
	defer b.mu.Unlock()
	if err != nil {
		delete(b.boxes, spec.ID)
		return err
	}
	x.ready = true
	return nil
}

func (b *Backend) create(ctx context.Context, x *box) (err error) {
	if d := b.opts.CreateDelay; d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if h := b.opts.CreateHook; h != nil {
		if err := h(ctx, x.spec); err != nil {
			return err
		}
	}
	defer func() {
		if err != nil {
			os.RemoveAll(x.dir)
		}
	}()
	if err := os.Mkdir(x.dir, 0o700); err != nil {
		return fmt.Errorf("fake: create %s: %w", x.spec.ID, err)
	}
	if err := os.Mkdir(x.root(), 0o755); err != nil {
		return fmt.Errorf("fake: create %s: %w", x.spec.ID, err)
	}
	return save(x.dir, x.st)
}

// Start marks a created sandbox running. ErrConflict if it is not in the
// created state.
func (b *Backend) Start(ctx context.Context, id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	x, err := b.get(id)
	if err != nil {
		return err
	}
	if x.st.State != backend.StateCreated {
		return errdefs.New(errdefs.ErrConflict, "sandbox_not_created", "fake: start %s: sandbox is %s", id, x.st.State)
	}
	st := backend.Status{State: backend.StateRunning, StartedAt: time.Now()}
	if err := save(x.dir, st); err != nil {
		return err
	}
	x.st = st
	return nil
}

// Wait blocks until the sandbox is stopped (by Stop or Destroy) or ctx
// ends.
func (b *Backend) Wait(ctx context.Context, id string) (backend.Status, error) {
	b.mu.Lock()
	x, err := b.get(id)
	b.mu.Unlock()
	if err != nil {
		return backend.Status{}, err
	}
	select {
	case <-x.done:
		b.mu.Lock()
		defer b.mu.Unlock()
		return x.st, nil
	case <-ctx.Done():
		return backend.Status{}, ctx.Err()
	}
}

// Stop kills every process the sandbox's execs started (SIGTERM, then
// SIGKILL after grace) and marks it stopped with exit code 0. Stopping a
// stopped sandbox does nothing.
func (b *Backend) Stop(ctx context.Context, id string, grace time.Duration) error {
	b.mu.Lock()
	x, err := b.get(id)
	b.mu.Unlock()
	if err != nil {
		return err
	}
	killAll(ctx, x.root(), grace)
	b.mu.Lock()
	defer b.mu.Unlock()
	if !x.stop("stopped") {
		return nil
	}
	return save(x.dir, x.st)
}

// stop moves x to the stopped state and wakes its waiters; false if it
// was stopped already. Backend.mu is held.
func (x *box) stop(reason string) bool {
	if x.st.State == backend.StateStopped {
		return false
	}
	x.st.State, x.st.Reason = backend.StateStopped, reason
	close(x.done)
	return true
}

// Destroy kills the sandbox's processes and removes its directory, also
// when this process does not know the id (a sandbox of an earlier process
// that was never recovered). Unknown ids are not an error.
func (b *Backend) Destroy(ctx context.Context, id string) error {
	if err := validID(id); err != nil {
		return nil // nothing can exist under an invalid id
	}
	b.mu.Lock()
	x := b.boxes[id]
	if x != nil && x.ready {
		delete(b.boxes, id)
		x.stop("destroyed")
	}
	b.mu.Unlock()
	if x != nil && !x.ready {
		return nil // still being created: its Create cleans up on failure
	}
	dir := filepath.Join(b.base, id)
	killAll(ctx, filepath.Join(dir, "root"), 0)
	if err := removeAll(dir); err != nil {
		return fmt.Errorf("fake: destroy %s: %w", id, err)
	}
	return nil
}

// Inspect reports the sandbox's status. ErrNotFound if unknown.
func (b *Backend) Inspect(ctx context.Context, id string) (backend.Status, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	x, err := b.get(id)
	if err != nil {
		return backend.Status{}, err
	}
	return x.st, nil
}

// Recover re-adopts a sandbox from its state file, as left by this or an
// earlier Backend over the same base. ErrNotFound if it has none.
func (b *Backend) Recover(ctx context.Context, spec backend.Spec) (backend.Status, error) {
	if err := validID(spec.ID); err != nil {
		return backend.Status{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if x, ok := b.boxes[spec.ID]; ok {
		if !x.ready {
			return backend.Status{}, errdefs.New(errdefs.ErrConflict, "sandbox_busy", "fake: sandbox %s is being created", spec.ID)
		}
		return x.st, nil
	}
	dir := filepath.Join(b.base, spec.ID)
	st, err := load(dir)
	if err != nil {
		return backend.Status{}, err
	}
	x := &box{spec: spec, dir: dir, ready: true, st: st, done: make(chan struct{})}
	if st.State == backend.StateStopped {
		close(x.done)
	}
	b.boxes[spec.ID] = x
	return st, nil
}

// get returns the ready box for id. b.mu is held.
func (b *Backend) get(id string) (*box, error) {
	x := b.boxes[id]
	if x == nil || !x.ready {
		return nil, errdefs.New(errdefs.ErrNotFound, "sandbox_not_found", "fake: sandbox %s not found", id)
	}
	return x, nil
}

// validID keeps ids safe as path elements (same rule as the container
// backend).
func validID(id string) error { return backend.ValidID(id) }

// stateVersion is the version of state.json this code writes and reads.
const stateVersion = 1

type stateFile struct {
	Version int            `json:"version"`
	Status  backend.Status `json:"status"`
}

// save writes st to dir/state.json atomically.
func save(dir string, st backend.Status) error {
	b, err := json.Marshal(stateFile{Version: stateVersion, Status: st})
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "state.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("fake: save state: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "state.json")); err != nil {
		return fmt.Errorf("fake: save state: %w", err)
	}
	return nil
}

func load(dir string) (backend.Status, error) {
	b, err := os.ReadFile(filepath.Join(dir, "state.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return backend.Status{}, errdefs.New(errdefs.ErrNotFound, "sandbox_not_found",
			"fake: sandbox %s has no state on this node", filepath.Base(dir))
	}
	if err != nil {
		return backend.Status{}, fmt.Errorf("fake: load state: %w", err)
	}
	var f stateFile
	if err := json.Unmarshal(b, &f); err != nil {
		return backend.Status{}, fmt.Errorf("fake: load state of %s: %w", filepath.Base(dir), err)
	}
	if f.Version != stateVersion {
		return backend.Status{}, errdefs.Invalid("fake: state of %s has version %d, want %d", filepath.Base(dir), f.Version, stateVersion)
	}
	return f.Status, nil
}

// removeAll removes dir even when the sandbox left read-only directories
// in it, which stop an unprivileged os.RemoveAll.
func removeAll(dir string) error {
	if os.RemoveAll(dir) == nil {
		return nil
	}
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			os.Chmod(p, 0o700)
		}
		return nil
	})
	return os.RemoveAll(dir)
}
