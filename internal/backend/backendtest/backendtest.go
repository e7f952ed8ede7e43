// Package backendtest is the conformance suite every backend.Backend
// passes, the fake included: the same lifecycle, exec, file, limit,
// recovery and failure cases run against each, so the node agent can rely
// on one behaviour whatever the backend.
//
// A backend's test calls Run with a Harness:
//
//	func TestConformance(t *testing.T) {
//		backendtest.Run(t, backendtest.Harness{
//			New:       func(t *testing.T) backend.Backend { ... fresh state dir ... },
//			Reopen:    func(t *testing.T, old backend.Backend) backend.Backend { ... same state dir ... },
//			Spec:      func(t *testing.T, id string) backend.Spec { ... busybox layers ... },
//			Processes: func(t *testing.T, b backend.Backend, id string) int { ... },
//		})
//	}
//
// Cases that need an optional capability (Capabilities().Exec, Files,
// Hostname, Limits, Recover) are skipped when the backend does not claim
// it, and run when it does: claiming a capability is a promise the suite
// checks.
//
// Commands are written for busybox sh and a host's /bin/sh alike, and name
// files by paths relative to the working directory "/" (the fake runs
// commands on the host with the sandbox root as their cwd, so "/work" in a
// command would be the host's).
//
// Beyond what package backend's comments say, the suite pins these
// behaviours, which the agent relies on:
//
//   - Create: ErrInvalid for an id that is not a safe path element ("",
//     "..", "a/b"); ErrConflict for an id already taken.
//   - Start of a sandbox that is not in the created state is ErrConflict;
//     Stop of a stopped one is not an error.
//   - Every call on an unknown id is ErrNotFound, except Destroy (nil).
//     Recover of a spec that was never created is ErrNotFound.
//   - Exec: ErrConflict when the sandbox is not running; ErrInvalid for an
//     empty argv or a missing cwd; a command that is not found exits 127
//     (no error); a command killed by signal n exits 128+n with Signal set.
//     When ctx ends, Exec returns an error wrapping ctx.Err() after killing
//     the exec's processes. Timeouts and cancellation of any length (over a
//     minute too) end processes blocked in the kernel, stopped or
//     ignoring signals, their children included, and Destroy afterwards
//     succeeds and leaves nothing (Harness.Leftovers). A background
//     process started by an exec
//     outlives it, and an exec whose background child keeps its output
//     pipe open still returns within seconds.
//   - Files: ErrNotFound for a missing path, ErrInvalid for reading a
//     directory as a file; no path, symlink or tar entry ever reads or
//     writes the host outside the sandbox's root.
package backendtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/testutil"
)

// Harness adapts one backend to the suite.
type Harness struct {
	// New returns a backend with fresh, empty state (its own state and
	// sandbox directories, e.g. under t.TempDir()). Required. Run calls it
	// once and shares the backend between cases, which use distinct ids.
	New func(t *testing.T) backend.Backend

	// Reopen returns a new instance over the same state as old, as the
	// agent gets after a restart: sandboxes old created must be reachable
	// through its Recover. The suite uses the new instance from then on
	// (Reopen may close old, as the process's exit would). Nil skips the
	// recovery cases.
	Reopen func(t *testing.T, old backend.Backend) backend.Backend

	// Spec returns a spec for a sandbox with this id whose image has a
	// busybox-like userland: sh, cat, echo, head, yes, sleep, mkdir, ln,
	// wc, kill, hostname, sort and mkfifo on PATH. The container backend passes a
	// busybox EROFS layer; the fake, which runs host commands, none.
	// Required. The suite may change Env, Workdir and Resources.
	Spec func(t *testing.T, id string) backend.Spec

	// Processes counts the live processes in sandbox id that execs started
	// (not the sandbox's own init), e.g. the pids of its cgroup minus
	// init. The suite uses it to check that timeouts and cancellation leave
	// nothing behind. Nil skips those checks.
	Processes func(t *testing.T, b backend.Backend, id string) int

	// Leftovers lists what the backend still holds on the host for
	// sandbox id once Destroy returned (cgroups in any hierarchy,
	// mounts, runtime state, directories), each as a short description.
	// The suite wants none. Nil skips those checks.
	Leftovers func(t *testing.T, b backend.Backend, id string) []string
}

// Run runs the whole suite against the backend h.New returns.
func Run(t *testing.T, h Harness) {
	if h.New == nil || h.Spec == nil {
		t.Fatal("backendtest: Harness.New and Harness.Spec are required")
	}
	s := &suite{h: h, b: h.New(t)}
	s.caps = s.b.Capabilities()
	t.Run("Lifecycle", s.testLifecycle)
	t.Run("Errors", s.testErrors)
	t.Run("Exec", s.testExec)
	t.Run("ExecKill", s.testExecKill)
	t.Run("ExecStubborn", s.testExecStubborn)
	t.Run("Files", s.testFiles)
	t.Run("Hostname", s.testHostname)
	t.Run("Limits", s.testLimits)
	t.Run("Recover", s.testRecover)
	t.Run("Stats", s.testStats)
	t.Run("Ports", s.testPorts)
}

type suite struct {
	h    Harness
	b    backend.Backend
	caps backend.Capabilities
}

// Timeouts. Generous: backends are slow on a loaded 2-core CI machine.
const (
	callTimeout = 2 * time.Minute // any one case
	killWithin  = 15 * time.Second
)

// ctx is a context for one case, ended with it.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), testutil.Scale(callTimeout))
	t.Cleanup(cancel)
	return c
}

// newID returns a fresh id, short enough to be a hostname.
func newID(t *testing.T) string {
	var b [5]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return "bt-" + hex.EncodeToString(b[:])
}

// spec returns a spec for a new id, changed by mods.
func (s *suite) spec(t *testing.T, mods ...func(*backend.Spec)) backend.Spec {
	spec := s.h.Spec(t, newID(t))
	for _, m := range mods {
		m(&spec)
	}
	return spec
}

// create creates a sandbox from spec and destroys it when t ends.
func (s *suite) create(t *testing.T, b backend.Backend, spec backend.Spec) {
	t.Helper()
	if err := b.Create(ctx(t), spec); err != nil {
		t.Fatalf("Create(%s): %v", spec.ID, err)
	}
	t.Cleanup(func() {
		if err := b.Destroy(context.Background(), spec.ID); err != nil {
			t.Errorf("cleanup: Destroy(%s): %v", spec.ID, err)
		}
	})
}

// running creates and starts a sandbox, returning its id.
func (s *suite) running(t *testing.T, mods ...func(*backend.Spec)) string {
	t.Helper()
	spec := s.spec(t, mods...)
	s.create(t, s.b, spec)
	if err := s.b.Start(ctx(t), spec.ID); err != nil {
		t.Fatalf("Start(%s): %v", spec.ID, err)
	}
	return spec.ID
}

// execOut is what one exec produced.
type execOut struct {
	backend.ExecResult
	stdout, stderr string
}

// exec runs req in sandbox id with buffers for stdout and stderr.
func exec(ctx context.Context, b backend.Backend, id string, req backend.ExecRequest) (execOut, error) {
	var o, e bytes.Buffer
	req.Stdout, req.Stderr = &o, &e
	if req.Timeout == 0 {
		req.Timeout = time.Minute
	}
	res, err := b.(backend.Execer).Exec(ctx, id, req)
	return execOut{ExecResult: res, stdout: o.String(), stderr: e.String()}, err
}

// sh runs script with sh -c in sandbox id, cwd "/", and fails t if Exec
// returns an error.
func (s *suite) sh(t *testing.T, id, script string, mods ...func(*backend.ExecRequest)) execOut {
	t.Helper()
	req := backend.ExecRequest{Argv: []string{"sh", "-c", script}, Cwd: "/"}
	for _, m := range mods {
		m(&req)
	}
	out, err := exec(ctx(t), s.b, id, req)
	if err != nil {
		t.Fatalf("Exec(sh -c %q): %v", script, err)
	}
	return out
}

// shOK is sh that also wants exit code 0.
func (s *suite) shOK(t *testing.T, id, script string, mods ...func(*backend.ExecRequest)) string {
	t.Helper()
	out := s.sh(t, id, script, mods...)
	if out.ExitCode != 0 {
		t.Fatalf("sh -c %q: exit code %d, want 0; stderr %q", script, out.ExitCode, out.stderr)
	}
	return out.stdout
}

// needs skips t unless the backend claims the capability.
func needs(t *testing.T, have bool, what string) {
	t.Helper()
	if !have {
		t.Skipf("backend does not claim %s", what)
	}
}

// wantErr fails t unless err is kind.
func wantErr(t *testing.T, what string, err, kind error) {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Errorf("%s: got error %v, want %v", what, err, kind)
	}
}

// eventually polls cond until it holds or d passes.
func eventually(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// noProcessesLeft checks, when the harness can count, that sandbox id has
// no exec process left.
func (s *suite) noProcessesLeft(t *testing.T, id string) {
	t.Helper()
	if s.h.Processes == nil {
		return
	}
	var n int
	if !eventually(5*time.Second, func() bool { n = s.h.Processes(t, s.b, id); return n == 0 }) {
		t.Errorf("processes left in %s: got %d, want 0", id, n)
	}
}

func trim(s string) string { return strings.TrimSpace(s) }
