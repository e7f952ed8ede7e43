package container

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
)

func TestParsePs(t *testing.T) {
	out := "UID       PID       PPID      C         TTY       STIME     TIME      CMD\n" +
		"0         1         0         0         ?         14:15     0s        catatonit\n" +
		"0         7         1         0         ?         14:15     0s        sh -c sleep 60 & sleep 60\n" +
		"1000      9         7         0         ?         14:15     0s        sleep\n"
	got, err := parsePs([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	if want := map[int]int{1: 0, 7: 1, 9: 7}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("parsePs = %v, want %v", got, want)
	}
	if _, err := parsePs([]byte("UID PID\nx y z\n")); err == nil {
		t.Error("parsePs of a malformed line: no error")
	}
}

func TestDescendants(t *testing.T) {
	procs := map[int]int{1: 0, 5: 1, 6: 5, 7: 6, 8: 1, 9: 5}
	got := descendants(procs, 5)
	if got[0] != 5 || !slices.Equal(slices.Sorted(slices.Values(got)), []int{5, 6, 7, 9}) {
		t.Errorf("descendants of 5 = %v, want 5 first, then 6, 7, 9", got)
	}
	if got := descendants(procs, 42); got != nil {
		t.Errorf("descendants of a pid not there = %v, want none", got)
	}
}

func TestRunscExitStatus(t *testing.T) {
	for _, c := range []struct {
		log            string
		exited, signal int // -1: not that way
		msg            string
	}{
		{`{"msg":"Args: [runsc exec]","level":"info"}` + "\n" + `{"msg":"Exiting with status: 768","level":"info"}`, 3, -1, ""},
		{`{"msg":"Exiting with status: 9","level":"info"}`, -1, 9, ""},
		{`{"msg":"FATAL ERROR: executing processes for container: boom","level":"warning"}`, -1, -1, "executing processes for container: boom"},
	} {
		p := filepath.Join(t.TempDir(), "log")
		if err := os.WriteFile(p, []byte(c.log+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		ws, msg, ok := runscExitStatus(p)
		switch {
		case c.exited >= 0 && (!ok || !ws.Exited() || ws.ExitStatus() != c.exited):
			t.Errorf("%s: got %v, %v; want exit %d", c.log, ws, ok, c.exited)
		case c.signal >= 0 && (!ok || !ws.Signaled() || int(ws.Signal()) != c.signal):
			t.Errorf("%s: got %v, %v; want signal %d", c.log, ws, ok, c.signal)
		case c.msg != "" && (ok || msg != c.msg):
			t.Errorf("%s: got %q, %v; want no status and %q", c.log, msg, ok, c.msg)
		}
	}
}

// TestGVisorAvailable: the probe names what keeps gVisor from running
// here (runsc missing, or the error runsc gave), and a create of a gVisor
// sandbox on such a host fails with it.
func TestGVisorAvailable(t *testing.T) {
	ctx := context.Background()
	fake := filepath.Join(t.TempDir(), "runsc")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho 'creating container: no platform for you' >&2\nexit 128\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ runsc, want string }{
		{"/nonexistent/runsc", "/nonexistent/runsc not found"},
		{fake, "runsc cannot run a sandbox on this host: creating container: no platform for you"},
	} {
		b, err := New(Config{StateDir: t.TempDir(), RunscPath: c.runsc})
		if err != nil {
			t.Fatal(err)
		}
		want := c.want
		if os.Geteuid() != 0 {
			want = "runsc needs root"
		}
		err = b.GVisorAvailable(ctx)
		if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), want) {
			t.Errorf("GVisorAvailable with %s: got %v, want ErrUnavailable saying %q", c.runsc, err, want)
		}
		if err := b.RuntimeAvailable(ctx, RuntimeGVisor); !errors.Is(err, errdefs.ErrUnavailable) {
			t.Errorf("RuntimeAvailable(gvisor) with %s: got %v, want ErrUnavailable", c.runsc, err)
		}
		spec := backend.Spec{ID: "gv-none", Layers: []backend.Layer{{Digest: "sha256:00", Path: "/nonexistent"}}, Runtime: RuntimeGVisor}
		if err := b.Create(ctx, spec); !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), want) {
			t.Errorf("Create of a gvisor sandbox with %s: got %v, want ErrUnavailable saying %q", c.runsc, err, want)
		}
	}

	b, err := New(Config{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.RuntimeCapabilities("kata"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("RuntimeCapabilities of an unknown runtime: %v, want ErrInvalid", err)
	}
	spec := backend.Spec{ID: "gv-kata", Layers: []backend.Layer{{Digest: "sha256:00", Path: "/nonexistent"}}, Runtime: "kata"}
	if err := b.Create(ctx, spec); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Create with an unknown runtime: %v, want ErrInvalid", err)
	}
	if caps, err := b.RuntimeCapabilities(RuntimeGVisor); err != nil || caps.Limits || !caps.Exec || !caps.Recover {
		t.Errorf("RuntimeCapabilities(gvisor) = %+v, %v; want Exec and Recover, not Limits", caps, err)
	}
	if caps, err := b.RuntimeCapabilities(""); err != nil || caps != b.Capabilities() {
		t.Errorf("RuntimeCapabilities(\"\") = %+v, %v; want Capabilities()", caps, err)
	}
}

// TestGVisorSandbox checks what a gVisor sandbox does beyond the
// conformance suite: the trusted shell, files the host writes and /tmp
// shared both ways, no way into its network, PIDs as RLIMIT_NPROC inside,
// pause and snapshot through its cgroup.
func TestGVisorSandbox(t *testing.T) {
	h := newHarness(t)
	requireGVisor(t, h.c)
	ctx := context.Background()
	spec := h.spec("gv-1")
	spec.Runtime, spec.Resources.PIDs = RuntimeGVisor, 32
	start := time.Now()
	h.start(spec)
	t.Logf("create and start: %v", time.Since(start))

	// The trusted shell, bound in.
	out := h.exec("gv-1", backend.ExecRequest{Shell: `echo "bash $BASH_VERSION"; exit 3`})
	if !strings.HasPrefix(out.stdout, "bash ") || out.stdout == "bash \n" || out.res.ExitCode != 3 {
		t.Errorf("Shell: got %q, exit %d; want bash's version and exit 3", out.stdout, out.res.ExitCode)
	}

	// Files both ways, /tmp included (the image's, not a tmpfs of gVisor's).
	if err := h.c.WriteFile(ctx, "gv-1", "/from-host", 0o644, strings.NewReader("host\n")); err != nil {
		t.Fatal(err)
	}
	if got := h.sh("gv-1", "cat /from-host; echo inside > /tmp/from-sandbox"); got != "host" {
		t.Errorf("a file the host wrote, read inside: %q, want %q", got, "host")
	}
	var b bytes.Buffer
	if err := h.c.ReadFile(ctx, "gv-1", "/tmp/from-sandbox", &b); err != nil || b.String() != "inside\n" {
		t.Errorf("/tmp written inside, read by the host: %q, %v; want %q", b.String(), err, "inside\n")
	}

	if _, err := h.c.NetNS(ctx, "gv-1"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("NetNS: %v, want ErrUnavailable", err)
	}
	if _, err := h.c.DialPort(ctx, "gv-1", 80); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("DialPort: %v, want ErrUnavailable", err)
	}

	// A fork bomb fails to fork (RLIMIT_NPROC), and the sandbox lives on.
	out = h.exec("gv-1", backend.ExecRequest{Argv: []string{"sh", "-c",
		"i=0; while [ $i -lt 100 ]; do sleep 30 </dev/null >/dev/null 2>&1 & echo $!; i=$((i+1)); done"}})
	if started := len(slices.Compact(slices.Sorted(slices.Values(strings.Fields(out.stdout))))); started >= 32 {
		t.Errorf("fork bomb under a 32 pids limit started %d processes, want < 32", started)
	}
	h.wantState("gv-1", backend.StateRunning)
	h.exec("gv-1", backend.ExecRequest{Argv: []string{"kill", "-9", "-1"}}) // no fork left for a shell

	h.sh("gv-1", "echo kept > /snap-me")
	if _, err := h.c.Pause(ctx, "gv-1"); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	h.wantState("gv-1", backend.StatePaused)
	if err := h.c.Resume(ctx, "gv-1"); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if got := h.sh("gv-1", "cat /snap-me"); got != "kept" {
		t.Errorf("exec after resume: %q", got)
	}
	snap, err := h.c.Snapshot(ctx, "gv-1", backend.SnapshotRequest{})
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	defer snap.Remove()
	if b, err := os.ReadFile(filepath.Join(snap.Upper, "snap-me")); err != nil || string(b) != "kept\n" {
		t.Errorf("snapshot's /snap-me: %q, %v", b, err)
	}
	t.Logf("snapshot froze the sandbox for %v (%s)", snap.Freeze, snap.Method)

	start = time.Now()
	if err := h.c.Destroy(ctx, "gv-1"); err != nil {
		t.Fatal(err)
	}
	t.Logf("destroy: %v", time.Since(start))
	h.assertGone("gv-1")
}

// TestGVisorMemoryLimit: a gVisor sandbox over its memory limit is
// stopped whole (Limits is not claimed: the host cannot kill one process
// inside), and destroyed cleanly after.
func TestGVisorMemoryLimit(t *testing.T) {
	h := newHarness(t)
	requireGVisor(t, h.c)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	spec := h.spec("gv-mem")
	spec.Runtime, spec.Resources.Memory = RuntimeGVisor, 64<<20
	h.start(spec)
	res, err := h.c.Exec(ctx, "gv-mem", backend.ExecRequest{Argv: []string{"sh", "-c", "head -c 268435456 /dev/zero | sort >/dev/null"}, Timeout: time.Minute})
	t.Logf("balloon: %+v, %v", res, err)
	if st, err := h.c.Wait(ctx, "gv-mem"); err != nil || st.State != backend.StateStopped {
		t.Errorf("a sandbox over its memory limit: %+v, %v; want it stopped", st, err)
	}
	if err := h.c.Destroy(ctx, "gv-mem"); err != nil {
		t.Fatal(err)
	}
	h.assertGone("gv-mem")
}

// TestGVisorSweep: a gVisor sandbox nobody recorded is swept like a runc
// one, its runsc state included.
func TestGVisorSweep(t *testing.T) {
	h := newHarness(t)
	requireGVisor(t, h.c)
	spec := h.spec("gv-orph")
	spec.Runtime = RuntimeGVisor
	h.start(spec)
	h.restart() // knows nothing of it
	removed, err := h.c.Sweep(context.Background(), func(string) bool { return true })
	if err != nil {
		t.Fatalf("Sweep: %v (removed %q)", err, removed)
	}
	all := strings.Join(removed, "\n")
	for _, want := range []string{"container init", "gvisor state " + runscStatePaths(h.c.cfg.RunscRoot, "gv-orph")[0], "directory " + h.c.dir("gv-orph")} {
		if !strings.Contains(all, want) {
			t.Errorf("removed does not list %q:\n%s", want, all)
		}
	}
	h.assertGone("gv-orph")
}
