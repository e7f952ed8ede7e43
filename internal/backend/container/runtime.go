package container

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/mountns"
)

// The runtimes a sandbox can run under (backend.Spec.Runtime).
const (
	// RuntimeRunc is the default ("" too): the host's kernel behind
	// namespaces, cgroups and seccomp.
	RuntimeRunc = "runc"
	// RuntimeGVisor is gVisor's runsc: a kernel in user space (the
	// sentry) between the sandbox and the host's, with no need of KVM
	// (gvisor.go).
	RuntimeGVisor = "gvisor"
)

// ociRuntime is one OCI runtime binary and its state directory. runc and
// runsc take the same bundle and the same create, start, kill, delete and
// events commands; they differ in their state files, in how an exec gets
// in and in what their sandboxes offer (gvisor.go).
type ociRuntime struct {
	name  string // RuntimeRunc or RuntimeGVisor
	path  string
	root  string   // --root
	flags []string // global flags on every call: runsc reads its configuration from each call's
	env   []string // runtimeEnv
}

func (r *ociRuntime) gvisor() bool { return r.name == RuntimeGVisor }

// command is one subcommand of the runtime.
func (r *ociRuntime) command(ctx context.Context, args ...string) *exec.Cmd {
	argv := append(append([]string{"--root", r.root}, r.flags...), args...)
	cmd := exec.CommandContext(ctx, r.path, argv...)
	cmd.Env = r.env
	return cmd
}

// run runs one subcommand whose stdio is not the container's, and returns
// its error message on failure.
func (r *ociRuntime) run(ctx context.Context, args ...string) error {
	_, err := r.output(ctx, args...)
	return err
}

// output runs one subcommand and returns its stdout.
func (r *ociRuntime) output(ctx context.Context, args ...string) ([]byte, error) {
	cmd := r.command(ctx, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = err.Error()
		}
		return nil, fmt.Errorf("%s %s: %s", filepath.Base(r.path), args[0], msg)
	}
	return stdout.Bytes(), nil
}

// create runs the runtime's `create`. The container's processes inherit
// its stdio, so it gets /dev/null and reports errors through a log file
// (runc's log and runsc's error log alike are JSON lines) instead of a
// pipe they would hold open forever. It also starts a session of its
// own: a signal to the agent's process group (Ctrl-C in a terminal) must
// not reach the sandboxes. It runs in mount namespace in, where the
// bundle's root is mounted (mountns). With mergeVia (warren-enter) it
// runs as `warren-enter merge RUNTIME ...`: the sandbox's memory merges
// (merge.go).
func (r *ociRuntime) create(ctx context.Context, id, bundle string, in *mountns.NS, mergeVia string) error {
	logPath := filepath.Join(bundle, "runtime.log")
	cmd := r.command(ctx, "--log", logPath, "--log-format", "json", "create", "--bundle", bundle, id)
	if mergeVia != "" {
		cmd.Args = append([]string{mergeVia, "merge", cmd.Path}, cmd.Args[1:]...)
		cmd.Path = mergeVia
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if r.gvisor() {
		f, err := gvisorStdio(bundle)
		if err != nil {
			return err
		}
		defer f.Close()
		cmd.Stdin, cmd.Stdout, cmd.Stderr = f, f, f
	}
	if err := in.RunCmd(cmd); err != nil {
		if msg := lastLoggedError(logPath); msg != "" {
			return fmt.Errorf("%s create: %s", filepath.Base(r.path), msg)
		}
		return fmt.Errorf("%s create: %w", filepath.Base(r.path), err)
	}
	return nil
}

// runtimeEnv is the agent's environment without the variables through
// which a runtime would hand the agent's systemd notification socket or
// its socket-activated listeners to sandboxes.
func runtimeEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES":
			continue
		}
		env = append(env, kv)
	}
	return env
}

// lastLoggedError returns the message of the last error logged as a JSON
// line ({"level": "error", "msg": ...}) in logPath, or "".
func lastLoggedError(logPath string) string {
	f, err := os.Open(logPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	var msg string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var e struct{ Level, Msg string }
		if json.Unmarshal(sc.Bytes(), &e) == nil && (e.Level == "error" || e.Level == "fatal") {
			msg = e.Msg
		}
	}
	return msg
}

// runtimeState is what the backend reads of a container's runtime state.
type runtimeState struct {
	InitPid     int
	InitStart   uint64            // /proc/<pid>/stat field 22, see initProc
	CgroupPaths map[string]string // hierarchy (controller, "" for v2) -> directory
	Created     bool              // created, not yet started
	RootPid     int               // a process whose root is the sandbox's (runc: the init; runsc: the gofer), 0 if unknown
}

// readState reads the runtime's state for id. ErrNotFound if it has none.
func (c *Container) readState(r *ociRuntime, id string) (*runtimeState, error) {
	var st *runtimeState
	var err error
	if r.gvisor() {
		st, err = c.readRunscState(id)
	} else {
		st, err = c.readRuncState(id)
	}
	if err == nil && st.InitPid <= 0 {
		err = errors.New("no init pid")
	}
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		err = fmt.Errorf("runtime state of %s: %w", id, err)
	}
	return st, err
}

// hasState reports whether the runtime holds state for id.
func (r *ociRuntime) hasState(id string) bool {
	for _, p := range r.statePaths(id) {
		if exists(p) {
			return true
		}
	}
	return false
}

// statePaths are where the runtime keeps its state of id.
func (r *ociRuntime) statePaths(id string) []string {
	if r.gvisor() {
		return runscStatePaths(r.root, id)
	}
	return []string{filepath.Join(r.root, id)}
}

// runtime returns the runtime of spec. ErrInvalid for an unknown one.
func (c *Container) runtime(spec backend.Spec) (*ociRuntime, error) {
	switch spec.Runtime {
	case "", RuntimeRunc:
		return c.runc, nil
	case RuntimeGVisor:
		return c.gvisor, nil
	}
	return nil, errdefs.Invalid("sandbox %s: unknown runtime %q (want %q or %q)", spec.ID, spec.Runtime, RuntimeRunc, RuntimeGVisor)
}

// runtimeOf returns the runtime of sandbox id: s's, or for a sandbox this
// process does not know (s nil), the one that holds state for it.
func (c *Container) runtimeOf(id string, s *sandbox) *ociRuntime {
	if s != nil {
		return s.rt
	}
	if c.gvisor.hasState(id) {
		return c.gvisor
	}
	return c.runc
}

var _ backend.Runtimes = (*Container)(nil)

// Runtimes are runc, the default, and gvisor.
func (c *Container) Runtimes() []string { return []string{RuntimeRunc, RuntimeGVisor} }

// RuntimeCapabilities: runc's sandboxes have every capability
// Capabilities names. gVisor's are not Limits: their memory and pid
// limits hold for the sandbox as a whole (one over them ends it), not for
// a process in it (gvisor.go). Nor does the node reach into their network
// (the sentry has a stack of its own): NetNS and DialPort refuse them.
func (c *Container) RuntimeCapabilities(runtime string) (backend.Capabilities, error) {
	r, err := c.runtime(backend.Spec{Runtime: runtime})
	if err != nil {
		return backend.Capabilities{}, err
	}
	caps := c.Capabilities()
	if r.gvisor() {
		caps.Limits = false
	}
	return caps, nil
}

// RuntimeAvailable is Available, and for gvisor GVisorAvailable too.
func (c *Container) RuntimeAvailable(ctx context.Context, runtime string) error {
	r, err := c.runtime(backend.Spec{Runtime: runtime})
	if err != nil {
		return err
	}
	if err := c.Available(ctx); err != nil {
		return err
	}
	if r.gvisor() {
		return c.GVisorAvailable(ctx)
	}
	return nil
}
