package microvm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/backend/backendtest"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/image/imagetest"
	"github.com/warrenhq/warren/internal/testutil"
)

// harness makes MicroVM backends over one state directory.
type harness struct {
	t     *testing.T
	cfg   Config
	m     *MicroVM
	layer backend.Layer
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequireQEMU(t)
	kernel := os.Getenv(testutil.GuestKernelEnv)
	if kernel == "" {
		kernel = DefaultKernel()
	}
	if _, err := os.Stat(kernel); err != nil {
		testutil.Unavailable(t, "needs a guest kernel: set %s or run scripts/fetch-guest-kernel (%v)", testutil.GuestKernelEnv, err)
	}
	h := &harness{t: t, layer: imagetest.BusyboxLayer(t)}
	mounts := image.NewMounts(t.TempDir())
	t.Cleanup(func() { mounts.Prune() })
	h.cfg = Config{StateDir: t.TempDir(), Kernel: kernel, GuestAgent: testutil.GuestAgent(t),
		CgroupParent: "/warren-test/vm-" + filepath.Base(t.TempDir()), Mounts: mounts}
	h.m = h.reopen()
	if err := h.m.Available(context.Background()); err != nil {
		t.Fatalf("microvm unavailable: %v", err)
	}
	accel, why := h.m.Accel()
	t.Logf("accelerator %s: %s", accel, why)
	if accel == "tcg" && os.Getenv(testutil.TimeScaleEnv) == "" {
		// An emulated guest: its memory cgroup's OOM kill takes minutes
		// (file pages refault through emulated I/O first).
		t.Setenv(testutil.TimeScaleEnv, "4")
	}
	t.Cleanup(func() {
		ents, _ := os.ReadDir(h.m.dir)
		for _, e := range ents {
			h.m.Destroy(context.Background(), e.Name())
		}
	})
	return h
}

func (h *harness) reopen() *MicroVM {
	m, err := New(h.cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	return m
}

func TestConformance(t *testing.T) {
	h := newHarness(t)
	backendtest.Run(t, backendtest.Harness{
		New: func(t *testing.T) backend.Backend { return h.m },
		Reopen: func(t *testing.T, old backend.Backend) backend.Backend {
			old.(*MicroVM).Close() // as the old agent's exit would
			h.m = h.reopen()
			return h.m
		},
		Spec: func(t *testing.T, id string) backend.Spec {
			return backend.Spec{ID: id, Layers: []backend.Layer{h.layer}}
		},
		Processes: func(t *testing.T, b backend.Backend, id string) int {
			st, err := b.(*MicroVM).Stats(context.Background(), id)
			if err != nil {
				return 0
			}
			return int(st.PIDs)
		},
		Leftovers: func(t *testing.T, b backend.Backend, id string) []string {
			return leftovers(b.(*MicroVM), id)
		},
	})
}

// leftovers lists what sandbox id still holds on the host: its
// directory, a QEMU naming it, its cgroups.
func leftovers(m *MicroVM, id string) []string {
	var out []string
	dir := m.sandboxDir(id)
	if exists(dir) {
		out = append(out, "directory "+dir)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, _ := os.ReadFile(p)
		if strings.Contains(string(b), dir+"/") {
			out = append(out, "process "+filepath.Base(filepath.Dir(p)))
		}
	}
	for _, d := range m.cgroupPaths(id) {
		if d.Exists() {
			out = append(out, "cgroup "+d.Path)
		}
	}
	return out
}

// started creates and starts a sandbox from spec changed by mods.
func (h *harness) started(t *testing.T, id string, mods ...func(*backend.Spec)) string {
	t.Helper()
	spec := backend.Spec{ID: id, Layers: []backend.Layer{h.layer}}
	for _, f := range mods {
		f(&spec)
	}
	ctx := context.Background()
	if err := h.m.Create(ctx, spec); err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { h.m.Destroy(context.Background(), id) })
	if err := h.m.Start(ctx, id); err != nil {
		t.Fatalf("Start: %v", err)
	}
	return id
}

// sh runs script in sandbox id and returns its stdout, stderr and exit code.
func (h *harness) sh(t *testing.T, id, script string) (string, string, int) {
	t.Helper()
	var o, e strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := h.m.Exec(ctx, id, backend.ExecRequest{Argv: []string{"sh", "-c", script}, Stdout: &o, Stderr: &e, Timeout: time.Minute})
	if err != nil {
		console, _ := os.ReadFile(filepath.Join(h.m.sandboxDir(id), consoleFile))
		h.diagnose(t, id)
		t.Fatalf("exec %q: %v; console: %s", script, err, console)
	}
	return o.String(), e.String(), res.ExitCode
}

// TestPauseResume: a paused microVM holds no process and no memory (its
// state is a file), answers as paused, and resumes where it stopped: its
// files, and a process it ran, with the same pid.
func TestPauseResume(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	id := h.started(t, "pause1")
	out, _, _ := h.sh(t, id, "echo kept > /root/f; (while :; do sleep 1; done) </dev/null >/dev/null 2>&1 & echo $!")
	pid := strings.TrimSpace(out)
	st, _ := h.m.Inspect(ctx, id)
	qemuPid := st.Pid

	ps, err := h.m.Pause(ctx, id)
	if err != nil {
		t.Fatalf("Pause: %v", err)
	}
	t.Logf("pause: %+v", ps)
	if ps.Before <= 0 || ps.After != 0 {
		t.Errorf("pause stats %+v: want memory before > 0 and after 0", ps)
	}
	if st, _ := h.m.Inspect(ctx, id); st.State != backend.StatePaused {
		t.Errorf("state after Pause: %q, want paused", st.State)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", qemuPid)); err == nil {
		t.Errorf("QEMU (pid %d) still runs while paused", qemuPid)
	}
	if fi, err := os.Stat(filepath.Join(h.m.sandboxDir(id), stateFile)); err != nil || fi.Size() == 0 {
		t.Errorf("saved state: %v", err)
	}
	if _, err := h.m.Exec(ctx, id, backend.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Exec while paused: %v, want ErrConflict", err)
	}
	if _, err := h.m.Pause(ctx, id); err != nil {
		t.Errorf("second Pause: %v, want nil", err)
	}
	// An agent restart meanwhile: it stays paused.
	h.m.Close()
	h.m = h.reopen()
	if st, err := h.m.Recover(ctx, backend.Spec{ID: id, Layers: []backend.Layer{h.layer}}); err != nil || st.State != backend.StatePaused {
		t.Fatalf("Recover of a paused sandbox: %+v, %v", st, err)
	}
	if err := h.m.Resume(ctx, id); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	out, _, code := h.sh(t, id, "cat /root/f; kill -0 "+pid+" && echo alive")
	if code != 0 || out != "kept\nalive\n" {
		t.Errorf("after Resume: %q (exit %d), want the file and the process", out, code)
	}
	if err := h.m.Resume(ctx, id); err != nil {
		t.Errorf("second Resume: %v, want nil", err)
	}
	t.Logf("the guest agent's sessions:\n%s", grepLines(console(h.m, id), sessionLog))
}

// grepLines is the lines of s that hold sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, strings.TrimSpace(l))
		}
	}
	return strings.Join(out, "\n")
}

// TestMachineFailures: a guest that cannot boot fails Start with the
// reason and leaves nothing running; QEMU dying under a running sandbox
// makes it stopped, with a reason.
func TestMachineFailures(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	t.Run("BadKernel", func(t *testing.T) {
		bad := filepath.Join(t.TempDir(), "vmlinuz-bad")
		os.WriteFile(bad, []byte("not a kernel"), 0o644)
		os.MkdirAll(filepath.Join(filepath.Dir(bad), "modules"), 0o755)
		cfg := h.cfg
		cfg.StateDir, cfg.Kernel = t.TempDir(), bad
		cfg.Modules = filepath.Join(filepath.Dir(h.m.kernel), "..", "lib", "modules", strings.TrimPrefix(filepath.Base(h.m.kernel), "vmlinuz-"))
		m, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Create(ctx, backend.Spec{ID: "badk", Layers: []backend.Layer{h.layer}}); err != nil {
			t.Fatal(err)
		}
		defer m.Destroy(ctx, "badk")
		err = m.Start(ctx, "badk")
		t.Logf("Start with a bad kernel: %v", err)
		if err == nil {
			t.Fatal("Start with a bad kernel succeeded")
		}
		if st, _ := m.Inspect(ctx, "badk"); st.State != backend.StateStopped {
			t.Errorf("state after a failed boot: %q, want stopped", st.State)
		}
		if l := leftovers(m, "badk"); len(l) != 1 { // the directory only, until Destroy
			t.Errorf("after a failed boot: %v", l)
		}
	})
	t.Run("QEMUDies", func(t *testing.T) {
		id := h.started(t, "dies1")
		st, _ := h.m.Inspect(ctx, id)
		syscall.Kill(st.Pid, syscall.SIGKILL)
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		st, err := h.m.Wait(wctx, id)
		if err != nil || st.State != backend.StateStopped {
			t.Fatalf("Wait after QEMU died: %+v, %v", st, err)
		}
		t.Logf("status: %+v", st)
		if err := h.m.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
		if l := leftovers(h.m, id); len(l) > 0 {
			t.Errorf("after Destroy: %v", l)
		}
	})
}

// TestContainment is what a hostile workload tries against the guest
// agent from inside: find it, its secret or its port; kill its pid 1;
// mount, load modules or reboot. None of it may work, and the sandbox
// must still answer afterwards.
func TestContainment(t *testing.T) {
	h := newHarness(t)
	id := h.started(t, "hostile1")
	secret, err := os.ReadFile(filepath.Join(h.m.sandboxDir(id), secretFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, script, want string }{
		{"NoAgentProcess", "for p in /proc/[0-9]*; do cat $p/comm; done | sort -u | tr '\\n' ' '", "sh"},
		{"FwCfgMasked", "ls /sys/firmware; ls -R /sys/firmware 2>&1 | grep -c fw_cfg", "0"},
		{"NoPortOrDisks", "ls /dev | grep -Ec 'vport|vd[a-z]|pmem|mem$|kmsg'", "0"},
		{"NoMount", "mount -t tmpfs x /mnt 2>/dev/null && echo mounted || echo refused", "refused"},
		{"NoModules", "echo > /tmp/x.ko; insmod /tmp/x.ko 2>/dev/null && echo loaded || echo refused", "refused"},
		{"NoReboot", "reboot -f 2>/dev/null; sleep 1; echo still-here", "still-here"},
		{"Pid1Survives", "kill -9 1; kill -TERM 1; sleep 1; kill -0 1 && echo alive", "alive"},
		{"NoPtrace", "cat /proc/1/environ >/dev/null 2>&1 && echo read || echo refused", "refused"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, _, _ := h.sh(t, id, c.script)
			if !strings.Contains(out, c.want) {
				t.Errorf("%s: got %q, want %q in it", c.script, out, c.want)
			}
			if c.name == "NoAgentProcess" && strings.Contains(out, "init") && !strings.Contains(out, "warren") {
				t.Logf("processes: %s", out)
			}
		})
	}
	out, _, _ := h.sh(t, id, "cat /proc/cmdline; grep -rl "+string(secret)+" /etc /tmp /root /run 2>/dev/null; echo done")
	if strings.Contains(out, string(secret)) {
		t.Errorf("the sandbox's secret is visible inside: %q", out)
	}
	if out, _, code := h.sh(t, id, "echo ok"); code != 0 || out != "ok\n" {
		t.Errorf("after the attempts: %q %d", out, code)
	}
}

// TestSnapshot: the writable disk's upper directory, copied while the
// guest's filesystem is frozen, on the host in overlayfs's own format
// (a deleted lower file is a whiteout), with stripped paths and build
// residue left out; the sandbox runs on.
func TestSnapshot(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	id := h.started(t, "snap1")
	h.sh(t, id, "mkdir -p /work && echo answer > /work/out && echo secret > /work/key && rm /etc/hosts && echo x > /tmp/scratch && echo ls > /root/.ash_history")
	snap, err := h.m.Snapshot(ctx, id, backend.SnapshotRequest{Strip: []string{"/work/key"}, Residue: []string{"/tmp/*", "/root/.ash_history"}})
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	defer snap.Remove()
	t.Logf("snapshot: method %s, froze %v, residue %v", snap.Method, snap.Freeze, snap.Residue)
	if b, err := os.ReadFile(filepath.Join(snap.Upper, "work/out")); err != nil || string(b) != "answer\n" {
		t.Errorf("work/out in the snapshot: %q, %v", b, err)
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(filepath.Join(snap.Upper, "etc/hosts"), &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFCHR || st.Rdev != 0 {
		t.Errorf("etc/hosts, deleted in the sandbox: want a 0/0 whiteout, got mode %o rdev %d, %v", st.Mode, st.Rdev, err)
	}
	for _, gone := range []string{"work/key", "tmp/scratch", "root/.ash_history"} {
		if _, err := os.Lstat(filepath.Join(snap.Upper, gone)); err == nil {
			t.Errorf("%s is in the snapshot, want it stripped", gone)
		}
	}
	if out, _, _ := h.sh(t, id, "cat /work/key; echo more > /work/after"); out != "secret\n" {
		t.Errorf("the sandbox after its snapshot: %q, want its files untouched", out)
	}
	if err := snap.Remove(); err != nil {
		t.Errorf("Remove: %v", err)
	}
}
