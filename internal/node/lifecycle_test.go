package node

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/backend/fake"
	"github.com/warrenhq/warren/internal/errdefs"
)

// A call in flight keeps an idle sandbox alive, and the idle clock starts
// when the call ends.
func TestCallKeepsIdleSandboxAlive(t *testing.T) {
	ctx := context.Background()
	a := newAgent(t, t.TempDir(), nil)
	keepsAlive(t, a, 2500*time.Millisecond)

	// A file transfer too: a slow upload outlasts the idle timeout.
	sb := mustCreate(t, a, api.CreateSandboxRequest{IdleTimeout: api.Duration(time.Second)})
	pr, pw := io.Pipe()
	go func() {
		for i := 0; i < 5; i++ {
			time.Sleep(500 * time.Millisecond)
			pw.Write([]byte("x"))
		}
		pw.Close()
	}()
	if err := a.WriteFile(ctx, sb.ID, "/slow", 0o644, pr); err != nil {
		t.Fatalf("slow upload: %v", err)
	}
	if got, err := a.Get(ctx, sb.ID); err != nil || got.State != api.StateRunning {
		t.Fatalf("after a 2.5s upload with a 1s idle timeout: %+v, %v; want running", got, err)
	}
}

// keepsAlive checks that an exec of d keeps a sandbox with a 1 s idle
// timeout, and that the sandbox is reaped about a second after it.
func keepsAlive(t *testing.T, a *Agent, d time.Duration) {
	t.Helper()
	ctx := context.Background()
	sb := mustCreate(t, a, api.CreateSandboxRequest{IdleTimeout: api.Duration(time.Second)})
	res, err := a.Exec(ctx, sb.ID, api.ExecRequest{Argv: []string{"sleep", seconds(d)}}, nil, nil)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec sleep %v with a 1s idle timeout = %+v, %v; want exit 0", d, res, err)
	}
	ended := time.Now()
	if got, err := a.Get(ctx, sb.ID); err != nil || got.State != api.StateRunning {
		t.Fatalf("right after the exec: %+v, %v; want running (idle counts from the call's end)", got, err)
	}
	for {
		_, err := a.Get(ctx, sb.ID)
		if errors.Is(err, errdefs.ErrNotFound) {
			if idle := time.Since(ended); idle < time.Second {
				t.Fatalf("reaped %v after the exec ended, before its 1s idle timeout", idle)
			}
			if !strings.Contains(err.Error(), endIdle) {
				t.Errorf("404 after the reap = %q, want it to say %q", err, endIdle)
			}
			return
		}
		if time.Since(ended) > 10*time.Second {
			t.Fatalf("still there 10s after the exec with a 1s idle timeout")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func seconds(d time.Duration) string { return strings.TrimSuffix(d.String(), "s") }

// The platform ending a sandbox under a call makes the call answer
// sandbox_gone naming why, never the exit code the kill left.
func TestCallCutShortIsSandboxGone(t *testing.T) {
	cases := []struct {
		name   string
		req    api.CreateSandboxRequest
		end    func(a *Agent, id string) // nil: the reaper ends it
		reason string
	}{
		{"delete", api.CreateSandboxRequest{}, func(a *Agent, id string) { a.Delete(context.Background(), id) }, endDeleted},
		{"ttl", api.CreateSandboxRequest{TTL: api.Duration(time.Second)}, nil, endTTL},
		{"shutdown", api.CreateSandboxRequest{}, func(a *Agent, _ string) { a.StopSandboxes(context.Background()) }, endShutdown},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cutShort(t, newAgent(t, t.TempDir(), nil), tc.req, tc.end, tc.reason)
		})
	}
}

func cutShort(t *testing.T, a *Agent, req api.CreateSandboxRequest, end func(*Agent, string), reason string) {
	t.Helper()
	ctx := context.Background()
	sb := mustCreate(t, a, req)
	// Two calls at once: a captured exec and a streamed one.
	var wg sync.WaitGroup
	errs := make([]error, 2)
	results := make([]api.ExecResult, 2)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out io.Writer
			if i == 1 {
				out = &bytes.Buffer{}
			}
			results[i], errs[i] = a.Exec(ctx, sb.ID, api.ExecRequest{Argv: []string{"sleep", "8"}}, out, out)
		}()
	}
	time.Sleep(300 * time.Millisecond) // both running
	start := time.Now()
	if end != nil {
		end(a, sb.ID)
	}
	wg.Wait()
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("calls answered %v after the end, want promptly", took)
	}
	for i, err := range errs {
		if errdefs.Code(err) != api.CodeSandboxGone || !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("call %d = %+v, %v; want a %s error (409)", i, results[i], err, api.CodeSandboxGone)
		}
		if !strings.Contains(err.Error(), reason) {
			t.Errorf("call %d: %q does not name the reason %q", i, err, reason)
		}
		// The platform's own ending (shutdown) is its fault; the
		// caller's delete and the sandbox's TTL are not.
		if infra := errdefs.InfraOf(err); (infra != "") != (reason == endShutdown) {
			t.Errorf("call %d ended by %s: infra %q", i, reason, infra)
		}
	}
	// A call that arrives after hears why: sandbox_gone while the end is
	// still under way, a 404 once it is done.
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := a.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "true"}, nil, nil)
		if !strings.Contains(fmtErr(err), reason) {
			t.Fatalf("exec after the end = %v; want an error naming %q", err, reason)
		}
		if errdefs.Code(err) == api.CodeSandboxNotFound {
			break
		}
		if errdefs.Code(err) != api.CodeSandboxGone || time.Now().After(deadline) {
			t.Fatalf("exec after the end = %v; want sandbox_gone, then sandbox_not_found", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func fmtErr(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// TTLs that ran out while the agent was down end the sandboxes at
// recovery, before Start returns: not at the reaper's first tick.
func TestRecoverEndsExpiredTTL(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a := newAgent(t, dir, nil)
	short := mustCreate(t, a, api.CreateSandboxRequest{TTL: api.Duration(time.Second)})
	long := mustCreate(t, a, api.CreateSandboxRequest{})
	a.Close()
	time.Sleep(1200 * time.Millisecond)

	a2 := newAgent(t, dir, func(c *Config) { c.ReapInterval = time.Hour })
	if _, err := a2.Get(ctx, short.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("sandbox whose ttl expired while down: %v, want ended at recovery", err)
	}
	if _, err := os.Stat(a2.recordPath(short.ID)); !os.IsNotExist(err) {
		t.Errorf("its record: %v, want removed", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "fake", short.ID)); !os.IsNotExist(err) {
		t.Errorf("its backend state: %v, want destroyed", err)
	}
	if got, err := a2.Get(ctx, long.ID); err != nil || got.State != api.StateRunning {
		t.Errorf("sandbox within its ttl = %+v, %v; want running", got, err)
	}
}

// Start sweeps what a backend holds for sandboxes with no record, and
// nothing else.
func TestStartSweepsUnrecorded(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a := newAgent(t, dir, nil)
	orphan := mustCreate(t, a, api.CreateSandboxRequest{})
	kept := mustCreate(t, a, api.CreateSandboxRequest{})
	// The orphan leaves a process running in the background.
	if _, err := a.Exec(ctx, orphan.ID, api.ExecRequest{Cmd: "sleep 60 >/dev/null 2>&1 &"}, nil, nil); err != nil {
		t.Fatal(err)
	}
	a.Close()
	os.Remove(a.recordPath(orphan.ID)) // as if the agent died before writing it
	other := filepath.Join(dir, "fake", "not-a-sandbox-id")
	if err := os.Mkdir(other, 0o700); err != nil {
		t.Fatal(err)
	}
	b, _ := fake.New(filepath.Join(dir, "fake"), fake.Options{})
	if b.Processes(orphan.ID) == 0 {
		t.Fatal("setup: the orphan's background process is not running")
	}

	var logs bytes.Buffer
	a2 := newAgent(t, dir, func(c *Config) { c.Log = slog.New(slog.NewTextHandler(&logs, nil)) })
	if _, err := os.Stat(filepath.Join(dir, "fake", orphan.ID)); !os.IsNotExist(err) {
		t.Errorf("orphan's directory: %v, want swept", err)
	}
	if n := b.Processes(orphan.ID); n != 0 {
		t.Errorf("orphan still has %d processes, want killed", n)
	}
	if !strings.Contains(logs.String(), "swept") || !strings.Contains(logs.String(), orphan.ID) {
		t.Errorf("log does not say what was swept:\n%s", logs.String())
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("a directory that is no sandbox's: %v, want left alone", err)
	}
	if got, err := a2.Get(ctx, kept.ID); err != nil || got.State != api.StateRunning {
		t.Errorf("recorded sandbox = %+v, %v; want running", got, err)
	}
	if res, err := a2.Exec(ctx, kept.ID, api.ExecRequest{Cmd: "true"}, nil, nil); err != nil || res.ExitCode != 0 {
		t.Errorf("exec in the recorded sandbox = %+v, %v", res, err)
	}
}

func TestStopSandboxes(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a := newAgent(t, dir, nil)
	want := map[string]bool{}
	for i := 0; i < 3; i++ {
		want[mustCreate(t, a, api.CreateSandboxRequest{}).ID] = true
	}
	ids, err := a.StopSandboxes(ctx)
	if err != nil || len(ids) != 3 {
		t.Fatalf("StopSandboxes = %v, %v; want the 3 ids", ids, err)
	}
	for _, id := range ids {
		if !want[id] {
			t.Errorf("ended %s, which is none of the created", id)
		}
	}
	if list, _ := a.List(ctx, Filter{}); len(list) != 0 {
		t.Errorf("left %d sandboxes", len(list))
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "state"))
	if len(entries) != 0 {
		t.Errorf("left %d records", len(entries))
	}
	if u := a.Status().Usage; u.Sandboxes != 0 || u.CPU != 0 || u.Memory != 0 {
		t.Errorf("usage after = %+v, want none", u)
	}
	a.Close()
	// Nothing for a new agent to re-adopt.
	if list, _ := newAgent(t, dir, nil).List(ctx, Filter{}); len(list) != 0 {
		t.Errorf("a new agent re-adopted %d sandboxes", len(list))
	}
}

// StopSandboxes waits for a create in flight and ends its sandbox too, and
// refuses creates from then on: nothing is left running after it.
func TestStopSandboxesCreateInFlight(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	entered, release := make(chan struct{}), make(chan struct{})
	b, err := fake.New(filepath.Join(dir, "fake"), fake.Options{Name: api.BackendContainer,
		CreateHook: func(context.Context, backend.Spec) error { close(entered); <-release; return nil }})
	if err != nil {
		t.Fatal(err)
	}
	a := newAgent(t, dir, func(c *Config) { c.Backends = []backend.Backend{b} })
	created := make(chan error, 1)
	go func() {
		_, err := a.Create(ctx, api.CreateSandboxRequest{Image: "busybox"})
		created <- err
	}()
	<-entered
	stopped := make(chan []string, 1)
	go func() {
		ids, _ := a.StopSandboxes(ctx)
		stopped <- ids
	}()
	waitFor(t, "StopSandboxes under way", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.shuttingDown
	})
	if _, err := a.Create(ctx, api.CreateSandboxRequest{Image: "busybox"}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("create while stopping: %v, want ErrUnavailable", err)
	}
	close(release)
	if err := <-created; err != nil {
		t.Fatalf("the create in flight: %v", err)
	}
	if ids := <-stopped; len(ids) != 1 {
		t.Errorf("StopSandboxes ended %v, want the sandbox created meanwhile", ids)
	}
	if list, _ := a.List(ctx, Filter{}); len(list) != 0 {
		t.Errorf("left %d sandboxes running", len(list))
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
