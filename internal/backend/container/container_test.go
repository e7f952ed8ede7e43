package container

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/guard"
	"github.com/warrenhq/warren/internal/image/imagetest"
	"github.com/warrenhq/warren/internal/testutil"
)

// harness is one backend over a fresh state directory and cgroup parent,
// with a busybox layer. Its cleanup destroys whatever the test left, with
// any Container over the same directory.
type harness struct {
	t     *testing.T
	c     *Container
	cfg   Config
	layer backend.Layer
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	testutil.RequireContainers(t)
	h := &harness{t: t, layer: imagetest.BusyboxLayer(t)}
	h.cfg = Config{StateDir: t.TempDir(), CgroupParent: "/warren-test/" + randomHex(4)}
	testutil.Searchable(t, h.cfg.StateDir)
	h.restart()
	t.Cleanup(h.cleanup)
	return h
}

// newContainer is a fresh process's view of the same node, as after an
// agent restart: new layer mount table, same directories.
func (h *harness) newContainer() *Container {
	h.t.Helper()
	c, err := New(h.cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	return c
}

// restart replaces the harness's backend with a new one over the same
// state, as an agent restart would: the old one lets go of what it held.
func (h *harness) restart() {
	h.t.Helper()
	if h.c != nil {
		h.c.Close()
	}
	h.c = h.newContainer()
}

func (h *harness) cleanup() {
	ctx := context.Background()
	entries, _ := os.ReadDir(h.c.sandboxDir)
	for _, e := range entries {
		if err := h.c.Destroy(ctx, e.Name()); err != nil {
			h.t.Errorf("cleanup: %v", err)
		}
	}
	h.c.Close()
	if err := h.c.cfg.Mounts.Prune(); err != nil {
		h.t.Errorf("cleanup: %v", err)
	}
	for _, hier := range cgroupMounts(h.t) {
		dir := filepath.Join(hier, h.cfg.CgroupParent)
		os.Remove(dir)
		os.Remove(filepath.Dir(dir)) // /warren-test, if no other test uses it
	}
}

func (h *harness) spec(id string) backend.Spec {
	return backend.Spec{
		ID:        id,
		Layers:    []backend.Layer{h.layer},
		Env:       []string{"WARREN_TEST=1"},
		Resources: backend.Resources{CPU: 1, Memory: 256 << 20, PIDs: 256},
	}
}

// start creates and starts a sandbox.
func (h *harness) start(spec backend.Spec) {
	h.t.Helper()
	ctx := context.Background()
	if err := h.c.Create(ctx, spec); err != nil {
		h.t.Fatalf("create: %v", err)
	}
	if err := h.c.Start(ctx, spec.ID); err != nil {
		h.t.Fatalf("start: %v", err)
	}
}

type output struct {
	stdout, stderr string
	res            backend.ExecResult
}

// exec runs argv in id and fails the test on an error.
func (h *harness) exec(id string, req backend.ExecRequest) output {
	h.t.Helper()
	var stdout, stderr bytes.Buffer
	req.Stdout, req.Stderr = &stdout, &stderr
	if req.Timeout == 0 {
		req.Timeout = 30 * time.Second
	}
	res, err := h.c.Exec(context.Background(), id, req)
	if err != nil {
		h.t.Fatalf("exec %q: %v", req.Argv, err)
	}
	return output{stdout.String(), stderr.String(), res}
}

// sh runs a shell command in id and returns its trimmed stdout, failing the
// test unless it exits 0.
func (h *harness) sh(id, script string) string {
	h.t.Helper()
	out := h.exec(id, backend.ExecRequest{Argv: []string{"sh", "-c", script}})
	if out.res.ExitCode != 0 {
		h.t.Fatalf("sh -c %q: exit %d, stderr %q", script, out.res.ExitCode, out.stderr)
	}
	return strings.TrimSpace(out.stdout)
}

// cgroupMounts lists the mountpoints of every cgroup hierarchy.
func cgroupMounts(t testing.TB) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var dirs []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		_, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		if typ := strings.Fields(post)[0]; typ == "cgroup" || typ == "cgroup2" {
			dirs = append(dirs, strings.Fields(line)[4])
		}
	}
	return dirs
}

// mountsUnder lists mountpoints at or below dir.
func mountsUnder(t testing.TB, dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var mps []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			mps = append(mps, f[4])
		}
	}
	return mps
}

// assertGone checks that nothing of sandbox id is left on the host.
func (h *harness) assertGone(id string) {
	h.t.Helper()
	for _, l := range leftovers(h.t, h.c, id) {
		h.t.Errorf("left behind: %s", l)
	}
}

// leftovers lists what c still holds of sandbox id on the host: mounts,
// cgroups in any hierarchy, runtime state, its directory.
func leftovers(t testing.TB, c *Container, id string) []string {
	var left []string
	for _, m := range mountsUnder(t, c.dir(id)) {
		left = append(left, "mount "+m)
	}
	for _, hier := range cgroupMounts(t) {
		for _, bestEffort := range []bool{false, true} {
			if d := filepath.Join(hier, c.cgroupRel(id, bestEffort)); exists(d) {
				left = append(left, "cgroup "+d)
			}
		}
	}
	for _, rt := range []*ociRuntime{c.runc, c.gvisor} {
		if rt.hasState(id) {
			left = append(left, rt.name+" state of "+id)
		}
	}
	if d := c.dir(id); exists(d) {
		left = append(left, "sandbox directory "+d)
	}
	return left
}

func (h *harness) layerMounts() []string { return mountsUnder(h.t, h.c.cfg.Mounts.Dir()) }

func (h *harness) wantState(id string, want backend.State) backend.Status {
	h.t.Helper()
	st, err := h.c.Inspect(context.Background(), id)
	if err != nil {
		h.t.Fatalf("inspect: %v", err)
	}
	if st.State != want {
		h.t.Fatalf("state = %s (%s), want %s", st.State, st.Reason, want)
	}
	return st
}

func TestLifecycle(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	spec := h.spec("life-1")
	if err := h.c.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	st := h.wantState("life-1", backend.StateCreated)
	if st.Pid <= 0 || !st.StartedAt.IsZero() {
		t.Errorf("created status = %+v, want a pid and no start time", st)
	}
	if _, err := h.c.Exec(ctx, "life-1", backend.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("exec before start: got %v, want ErrConflict", err)
	}
	if err := h.c.Create(ctx, spec); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("second create: got %v, want ErrConflict", err)
	}
	if err := h.c.Start(ctx, "life-1"); err != nil {
		t.Fatal(err)
	}
	if err := h.c.Start(ctx, "life-1"); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("second start: got %v, want ErrConflict", err)
	}
	st = h.wantState("life-1", backend.StateRunning)
	if time.Since(st.StartedAt) > time.Minute {
		t.Errorf("StartedAt = %v", st.StartedAt)
	}

	out := h.exec("life-1", backend.ExecRequest{Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}})
	if out.stdout != "out\n" || out.stderr != "err\n" || out.res.ExitCode != 3 || out.res.Signal != "" || out.res.TimedOut {
		t.Errorf("got %+v", out)
	}
	if got := h.sh("life-1", "hostname"); got != "life-1" {
		t.Errorf("hostname = %q, want life-1", got)
	}
	if got := h.sh("life-1", "cat /proc/1/cmdline | tr '\\0' ' '"); got != "/dev/init -P" {
		t.Errorf("pid 1 = %q, want catatonit in pause mode", got)
	}

	// The init's pid is in Inspect; Wait returns once Stop killed it.
	waited := make(chan backend.Status, 1)
	go func() {
		st, err := h.c.Wait(ctx, "life-1")
		if err != nil {
			t.Error(err)
		}
		waited <- st
	}()
	if err := h.c.Stop(ctx, "life-1", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case st := <-waited:
		if st.State != backend.StateStopped {
			t.Errorf("after stop: %+v", st)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return after Stop")
	}
	h.wantState("life-1", backend.StateStopped)
	if err := h.c.Stop(ctx, "life-1", time.Second); err != nil {
		t.Errorf("stop of a stopped sandbox: %v", err)
	}

	if err := h.c.Destroy(ctx, "life-1"); err != nil {
		t.Fatal(err)
	}
	h.assertGone("life-1")
	if err := h.c.Destroy(ctx, "life-1"); err != nil {
		t.Errorf("second destroy: %v", err)
	}
	if err := h.c.Destroy(ctx, "never-was"); err != nil {
		t.Errorf("destroy of an unknown id: %v", err)
	}
	if _, err := h.c.Inspect(ctx, "life-1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("inspect after destroy: got %v, want ErrNotFound", err)
	}
	if m := h.layerMounts(); len(m) != 0 {
		t.Errorf("layer mounts left: %v", m)
	}
}

func TestDestroyRunningLeavesNothing(t *testing.T) {
	h := newHarness(t)
	h.start(h.spec("gone-1"))
	// Leave an exec cgroup behind, as an agent dying mid-exec would, and a
	// background process.
	h.sh("gone-1", "sleep 1000 > /dev/null 2>&1 &")
	if err := h.c.sandboxes["gone-1"].cg.create(execPrefix + "stale"); err != nil {
		t.Fatal(err)
	}
	if err := h.c.Destroy(context.Background(), "gone-1"); err != nil {
		t.Fatal(err)
	}
	h.assertGone("gone-1")
	if m := h.layerMounts(); len(m) != 0 {
		t.Errorf("layer mounts left: %v", m)
	}
}

func TestExecTimeoutKillsTree(t *testing.T) {
	h := newHarness(t)
	h.start(h.spec("tmo-1"))
	start := time.Now()
	out := h.exec("tmo-1", backend.ExecRequest{
		Argv:    []string{"sh", "-c", "sleep 100 & sleep 100 & echo started; sleep 100"},
		Timeout: 500 * time.Millisecond,
	})
	if !out.res.TimedOut || out.res.ExitCode != 137 || out.res.Signal != "SIGKILL" {
		t.Errorf("got %+v, want timed out with SIGKILL", out.res)
	}
	if out.stdout != "started\n" {
		t.Errorf("stdout = %q, want the output before the timeout", out.stdout)
	}
	if d := time.Since(start); d > 5*time.Second || out.res.Duration < 500*time.Millisecond {
		t.Errorf("took %v (Duration %v)", d, out.res.Duration)
	}
	// Nothing of that exec is left: only init and the ps itself.
	if ps := h.sh("tmo-1", "ps -o comm | grep -c sleep || true"); ps != "0" {
		t.Errorf("%s sleeps left after the timeout", ps)
	}
	if subs, _ := h.c.sandboxes["tmo-1"].cg.subs(); len(subs) != 0 {
		t.Errorf("exec cgroups left: %v", subs)
	}
	if got := h.sh("tmo-1", "echo alive"); got != "alive" {
		t.Errorf("sandbox after timeout: %q", got)
	}
}

func TestExecCancel(t *testing.T) {
	h := newHarness(t)
	h.start(h.spec("cancel-1"))
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	_, err := h.c.Exec(ctx, "cancel-1", backend.ExecRequest{Argv: []string{"sh", "-c", "sleep 100 & sleep 100"}, Timeout: time.Minute})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("got %v, want context.Canceled", err)
	}
	if ps := h.sh("cancel-1", "ps -o comm | grep -c sleep || true"); ps != "0" {
		t.Errorf("%s sleeps left after cancel", ps)
	}
}

func TestExecBackground(t *testing.T) {
	h := newHarness(t)
	h.start(h.spec("bg-1"))

	// A background child holding stdout does not make Exec hang: it is
	// killed shortly after the main process exits. One started alongside
	// that let go of the output is left alone.
	start := time.Now()
	out := h.exec("bg-1", backend.ExecRequest{Argv: []string{"sh", "-c", "sleep 101 >/dev/null 2>&1 & echo $!; sleep 100 & echo $!; exit 4"}})
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("exec with a background child holding stdout took %v", d)
	}
	if out.res.ExitCode != 4 || out.res.TimedOut {
		t.Errorf("got %+v, want the main process's exit code", out.res)
	}
	pids := strings.Fields(out.stdout)
	if len(pids) != 2 {
		t.Fatalf("stdout %q, want two pids", out.stdout)
	}
	if got := h.sh("bg-1", "cat /proc/"+pids[1]+"/comm 2>/dev/null || echo gone"); got != "gone" {
		t.Errorf("background child holding stdout: %q, want killed", got)
	}
	if got := h.sh("bg-1", "cat /proc/"+pids[0]+"/comm 2>/dev/null || echo gone"); got != "sleep" {
		t.Errorf("detached background child: %q, want alive", got)
	}

	// One that let go of the output lives on, outside any exec cgroup,
	// like a server started for later execs.
	start = time.Now()
	out = h.exec("bg-1", backend.ExecRequest{Argv: []string{"sh", "-c", "sleep 100 >/dev/null 2>&1 & echo $!"}})
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("exec with a detached background child took %v", d)
	}
	pid := strings.TrimSpace(out.stdout)
	if got := h.sh("bg-1", "cat /proc/"+pid+"/comm"); got != "sleep" {
		t.Errorf("detached background process: %q", got)
	}
	for _, p := range []string{pid, pids[0]} {
		if got := h.sh("bg-1", "cat /proc/"+p+"/cgroup"); strings.Contains(got, execPrefix) {
			t.Errorf("background process still in an exec cgroup: %s", got)
		}
	}
	if subs, _ := h.c.sandboxes["bg-1"].cg.subs(); len(subs) != 0 {
		t.Errorf("exec cgroups left: %v", subs)
	}
}

func TestExecResults(t *testing.T) {
	h := newHarness(t)
	spec := h.spec("res-1")
	spec.Workdir = "/tmp"
	spec.Env = []string{"A=spec", "B=spec"}
	h.start(spec)

	out := h.exec("res-1", backend.ExecRequest{Argv: []string{"no-such-command"}})
	if out.res.ExitCode != 127 || !strings.Contains(out.stderr, "not found") {
		t.Errorf("missing command: %+v", out)
	}
	out = h.exec("res-1", backend.ExecRequest{Argv: []string{"sh", "-c", "kill -9 $$"}})
	if out.res.ExitCode != 137 || out.res.Signal != "SIGKILL" || out.res.TimedOut {
		t.Errorf("killed by signal: %+v", out.res)
	}
	out = h.exec("res-1", backend.ExecRequest{Argv: []string{"sh", "-c", "exit 255"}})
	if out.res.ExitCode != 255 {
		t.Errorf("exit 255: %+v", out.res)
	}
	out = h.exec("res-1", backend.ExecRequest{
		Argv:  []string{"sh", "-c", "pwd; echo $A $B $C; echo $PATH; cat"},
		Env:   []string{"B=req", "C=req"},
		Stdin: strings.NewReader("from stdin"),
	})
	want := "/tmp\nspec req req\n/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\nfrom stdin"
	if out.stdout != want {
		t.Errorf("stdout = %q, want %q", out.stdout, want)
	}
	if got := h.sh("res-1", "cd / && exec sh -c pwd"); got != "/" {
		t.Errorf("pwd = %q", got)
	}
	out = h.exec("res-1", backend.ExecRequest{Argv: []string{"pwd"}, Cwd: "/etc"})
	if out.stdout != "/etc\n" {
		t.Errorf("cwd: %q", out.stdout)
	}
	if _, err := h.c.Exec(context.Background(), "res-1", backend.ExecRequest{Argv: []string{"pwd"}, Cwd: "/nope"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("missing cwd: got %v, want ErrInvalid", err)
	}
	if _, err := h.c.Exec(context.Background(), "res-1", backend.ExecRequest{}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("empty argv: got %v, want ErrInvalid", err)
	}
	if _, err := h.c.Exec(context.Background(), "nope", backend.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown sandbox: got %v, want ErrNotFound", err)
	}

	out = h.exec("res-1", backend.ExecRequest{Argv: []string{"sh", "-c", "id -u; id -g; grep CapEff /proc/self/status"}, User: "nobody"})
	if f := strings.Fields(out.stdout); len(f) != 4 || f[0] != "65534" || f[1] != "65534" || f[3] != "0000000000000000" {
		t.Errorf("as nobody: %q %q", out.stdout, out.stderr)
	}
	if _, err := h.c.Exec(context.Background(), "res-1", backend.ExecRequest{Argv: []string{"id"}, User: "nosuchuser"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("unknown user: got %v, want ErrInvalid", err)
	}
	// Users resolve from the environment's layers, not the sandbox's own
	// /etc/passwd: rewriting it (nobody as root, a new user) changes
	// nothing for the platform's -u.
	h.sh("res-1", "echo 'nobody:x:0:0::/:/bin/sh' > /etc/passwd; echo 'agent:x:0:0::/:/bin/sh' >> /etc/passwd")
	out = h.exec("res-1", backend.ExecRequest{Argv: []string{"id", "-u"}, User: "nobody"})
	if out.stdout != "65534\n" {
		t.Errorf("as nobody after the sandbox rewrote /etc/passwd: %q %q", out.stdout, out.stderr)
	}
	if _, err := h.c.Exec(context.Background(), "res-1", backend.ExecRequest{Argv: []string{"id"}, User: "agent"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("a user only the sandbox's /etc/passwd names: got %v, want ErrInvalid", err)
	}
}

func TestHardening(t *testing.T) {
	h := newHarness(t)
	h.start(h.spec("hard-1"))
	status := h.sh("hard-1", "grep -E '^(Seccomp|NoNewPrivs|CapEff|CapBnd):' /proc/self/status")
	// Docker's default set (0xa80425fb) without NET_RAW (bit 13) and
	// MKNOD (bit 27).
	const caps = 0xa00405fb
	for _, want := range []string{"Seccomp:\t2", "NoNewPrivs:\t1"} {
		if !strings.Contains(status, want) {
			t.Errorf("status lacks %q:\n%s", want, status)
		}
	}
	for _, line := range strings.Split(status, "\n") {
		k, v, _ := strings.Cut(line, ":")
		v = strings.TrimSpace(v)
		if k == "CapEff" || k == "CapBnd" {
			if got, _ := strconv.ParseUint(v, 16, 64); got != caps {
				t.Errorf("%s = %s, want %016x", k, v, caps)
			}
		}
	}
	for _, p := range []string{"/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug"} {
		if !exists(p) {
			continue // not in this kernel
		}
		// Masked: empty; under AppArmor's profile, not even opened.
		if got := h.sh("hard-1", "wc -c < "+p+" 2>/dev/null || echo denied"); got != "0" && !(got == "denied" && h.c.apparmor != "") {
			t.Errorf("%s readable: %s bytes", p, got)
		}
	}
	if got := h.sh("hard-1", "ls /sys/firmware | wc -l"); got != "0" {
		t.Errorf("/sys/firmware visible: %s entries", got)
	}
	// Masked directories of /proc (this host's): empty, and nothing can
	// be made in them.
	for _, p := range procDirMasks() {
		if got := h.sh("hard-1", "ls -A "+p+" | wc -l; touch "+p+"/x 2>/dev/null && echo written; true"); got != "0" {
			t.Errorf("%s: %q, want empty and read-only", p, got)
		}
	}
	// Every filesystem a sandbox mounts costs the kernel a shrinker, and
	// every memory cgroup a slot per shrinker (bench/density): the
	// sandbox's own are its root, proc, devpts, /dev/shm, mqueue and
	// sysfs (and, on cgroup v2 hosts, a bind of its cgroup, not counted);
	// the rest are binds of them or of the node's (its layers').
	devs := map[string]string{}
	for _, line := range strings.Split(h.sh("hard-1", "cat /proc/self/mountinfo"), "\n") {
		f := strings.Fields(line)
		if i := slices.Index(f, "-"); len(f) > 4 && i > 0 && i+1 < len(f) && f[i+1] != "cgroup2" {
			devs[f[2]] += f[i+1] + " " + f[4] + ", "
		}
	}
	want := 6
	if !h.c.devTemplate {
		want++ // a /dev tmpfs of its own where the node has no template (devMount)
	}
	if len(devs) > want {
		t.Errorf("the sandbox has %d filesystems, want %d at most: %v", len(devs), want, devs)
	}
	out := h.exec("hard-1", backend.ExecRequest{Argv: []string{"sh", "-c", "echo x > /proc/sys/kernel/domainname"}})
	if out.res.ExitCode == 0 {
		t.Error("/proc/sys writable")
	}
	out = h.exec("hard-1", backend.ExecRequest{Argv: []string{"mount", "-t", "tmpfs", "x", "/mnt"}})
	if out.res.ExitCode == 0 {
		t.Error("mount allowed")
	}
	if got := h.sh("hard-1", "ls /sys/class/net"); got != "lo" {
		t.Errorf("network interfaces: %q, want lo only", got)
	}
	if ps := h.exec("hard-1", backend.ExecRequest{Argv: []string{"ps", "-o", "pid,comm"}}).stdout; strings.Count(ps, "\n") != 3 {
		t.Errorf("sandbox sees more than its init and ps:\n%s", ps) // and a header
	}
	if got := h.sh("hard-1", "ls -l /dev/init | cut -c1-10; touch /dev/init 2>&1 || echo ro"); !strings.HasSuffix(got, "ro") {
		t.Errorf("init binary writable: %q", got)
	}
	// Compat (32-bit) syscalls are not allowed: a 32-bit exit(42) dies.
	if err := h.c.WriteFile(context.Background(), "hard-1", "/tmp/exit42", 0o755, bytes.NewReader(elf32Exit42())); err != nil {
		t.Fatal(err)
	}
	if out := h.exec("hard-1", backend.ExecRequest{Argv: []string{"/tmp/exit42"}}); out.res.ExitCode == 42 {
		t.Error("32-bit syscalls allowed")
	} else {
		t.Logf("32-bit binary: %+v", out.res)
	}
	// The init binary is not in the overlay's upper dir.
	if exists(filepath.Join(h.c.dir("hard-1"), "upper", "dev")) {
		t.Error("/dev created in the upper dir")
	}
}

// TestExecEntry checks what an exec's process gets from warren-enter: the
// sandbox's cgroups (its exec cgroup where there is one, the sandbox's in
// every other hierarchy), the init's seccomp filters, and a trusted shell
// for Shell requests that the sandbox can neither replace nor write.
func TestExecEntry(t *testing.T) {
	h := newHarness(t)
	h.start(h.spec("ent-1"))

	init, err := seccompFilterCount(h.c.sandboxes["ent-1"].init.pid)
	if err != nil {
		t.Fatal(err)
	}
	if got := h.sh("ent-1", "sed -n 's/^Seccomp_filters:\t//p' /proc/self/status"); got != strconv.Itoa(init) {
		t.Errorf("exec runs %s seccomp filters, the init %d", got, init)
	}
	// Inside the sandbox's cgroup namespace its own cgroups are "/", and
	// an exec's own sub-cgroup /exec-...
	var subs int
	for _, line := range strings.Split(h.sh("ent-1", "cat /proc/self/cgroup"), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			t.Fatalf("/proc/self/cgroup: %q", line)
		}
		switch p := f[2]; {
		case strings.HasPrefix(p, "/"+execPrefix):
			subs++
		case p != "/":
			t.Errorf("exec in cgroup %q outside the sandbox's: %s", p, line)
		}
	}
	if subs != 1 {
		t.Errorf("exec in %d exec sub-cgroups, want 1", subs)
	}

	// Nothing in the sandbox's view of its mounts names the host's paths.
	if mi := h.sh("ent-1", "cat /proc/self/mountinfo /proc/self/mounts"); strings.Contains(mi, h.c.cfg.StateDir) ||
		!strings.Contains(mi, " /.warren/init /dev/init ro,") {
		t.Errorf("the sandbox's mount table names the state directory %s, or not the platform's init:\n%s", h.c.cfg.StateDir, mi)
	}
	// /dev: the node's read-only template where the state directory
	// holds device nodes (not nodev: the cgroup-v2 guest's /tmp is), its
	// devices working, the sandbox's own shm.
	var sfs unix.Statfs_t
	if err := unix.Statfs(h.cfg.StateDir, &sfs); err != nil {
		t.Fatal(err)
	}
	if nodev := sfs.Flags&unix.ST_NODEV != 0; h.c.devTemplate == nodev {
		t.Errorf("/dev template %v on a state directory mounted nodev=%v", h.c.devTemplate, nodev)
	} else if h.c.devTemplate {
		got := h.sh("ent-1", "echo x > /dev/null && head -c 4 /dev/urandom | wc -c && echo y > /dev/shm/y && cat /dev/shm/y && "+
			"ls /dev/fd/ >/dev/null && (touch /dev/x 2>/dev/null || echo ro) && grep -c ' /.warren/dev /dev ro,' /proc/self/mountinfo")
		if got != "4\ny\nro\n1" {
			t.Errorf("/dev from the template: %q", got)
		}
	}
	// The platform's files are covered, read-only, and stay the node's.
	if got := h.sh("ent-1", "ls -A /.warren; touch /.warren/x 2>/dev/null || echo ro"); got != "ro" {
		t.Errorf("/.warren: %q, want empty and read-only", got)
	}

	// The agent replaces /bin/sh and /bin/bash: Shell requests still run
	// the platform's shell; argv requests run what the sandbox has.
	h.sh("ent-1", "for s in /bin/sh /bin/bash; do rm -f $s; printf '#!/bin/busybox sh\necho pwned\n' > $s; chmod +x $s; done")
	out := h.exec("ent-1", backend.ExecRequest{Shell: "echo \"shell $BASH_VERSION\"; readlink /proc/$$/exe; echo x > /proc/$$/exe || echo refused"})
	if out.res.ExitCode != 0 || !strings.HasPrefix(out.stdout, "shell 5.") || !strings.Contains(out.stdout, "memfd:warren-sh") ||
		!strings.HasSuffix(out.stdout, "refused\n") {
		t.Errorf("trusted shell: %+v", out)
	}
	if got := h.exec("ent-1", backend.ExecRequest{Argv: []string{"sh", "-c", "true"}}).stdout; got != "pwned\n" {
		t.Errorf("argv sh ran %q, want the sandbox's own (pwned)", got)
	}
	if got := h.exec("ent-1", backend.ExecRequest{Shell: "exit 3"}).res.ExitCode; got != 3 {
		t.Errorf("shell exit 3: got %d", got)
	}
	if _, err := h.c.Exec(context.Background(), "ent-1", backend.ExecRequest{Shell: "true", Argv: []string{"true"}}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("shell and argv: got %v, want ErrInvalid", err)
	}
	// Landlock, where the kernel applies it: no device node anywhere
	// (refused by Landlock before the missing CAP_MKNOD: EACCES, not
	// EPERM); FIFOs and renames across directories as usual.
	if _, _, ok := guard.LandlockRules(); ok {
		out = h.exec("ent-1", backend.ExecRequest{Shell: "mknod /tmp/null c 1 3"})
		if out.res.ExitCode == 0 || !strings.Contains(out.stderr, "Permission denied") {
			t.Errorf("mknod under Landlock: %+v", out)
		}
		out = h.exec("ent-1", backend.ExecRequest{Shell: "mkfifo /tmp/f && mkdir -p /root/d && mv /tmp/f /root/d/f && ls /root/d"})
		if out.stdout != "f\n" {
			t.Errorf("fifo and rename under Landlock: %+v", out)
		}
	}
	// A shell as a non-root user, in a directory it may not enter.
	out = h.exec("ent-1", backend.ExecRequest{Shell: "id -u; pwd", User: "nobody", Cwd: "/tmp"})
	if out.stdout != "65534\n/tmp\n" {
		t.Errorf("shell as nobody: %+v", out)
	}
	h.sh("ent-1", "mkdir -m 700 /private")
	if _, err := h.c.Exec(context.Background(), "ent-1", backend.ExecRequest{Argv: []string{"true"}, User: "nobody", Cwd: "/private"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("cwd the user may not enter: got %v, want ErrInvalid", err)
	}
}

// TestUserNS checks each sandbox's user namespace: an unprivileged host
// range of its own, files of the host's root nobody's inside, the upper
// layer on disk in the sandbox's own ids (nothing chowned), and the
// platform's file calls and execs speaking the sandbox's ids.
func TestUserNS(t *testing.T) {
	h := newHarness(t)
	if err := h.c.UserNS(); err != nil {
		// tmpfs can idmap from Linux 6.3 (scripts/test-cgroup-v2's guest
		// runs 6.1 with TMPDIR on tmpfs): there the fallback must hold,
		// sandboxes as the host's root; anywhere else it is a failure.
		var st unix.Statfs_t
		if unix.Statfs(h.cfg.StateDir, &st) != nil || st.Type != unix.TMPFS_MAGIC {
			testutil.Unavailable(t, "no user namespaces: %v", err)
		}
		t.Logf("state directory on tmpfs that cannot idmap (%v): checking the fallback", err)
		h.start(h.spec("uns-0"))
		if got := strings.Fields(h.sh("uns-0", "cat /proc/self/uid_map")); len(got) != 3 || got[1] != "0" {
			t.Errorf("without a user namespace: uid_map %q", got)
		}
		return
	}
	h.start(h.spec("uns-1"))
	h.start(h.spec("uns-2"))
	ctx := context.Background()

	var bases []uint64
	for _, id := range []string{"uns-1", "uns-2"} {
		f := strings.Fields(h.sh(id, "cat /proc/self/uid_map"))
		if len(f) != 3 || f[0] != "0" || f[2] != "65536" {
			t.Fatalf("%s: uid_map %q", id, f)
		}
		b, _ := strconv.ParseUint(f[1], 10, 32)
		if b < idBase {
			t.Errorf("%s: root is host uid %d, inside the host's own ids", id, b)
		}
		bases = append(bases, b)
	}
	if bases[0] == bases[1] {
		t.Errorf("two sandboxes share host ids %d", bases[0])
	}
	base := bases[0]
	// The host's root owns /dev/init: nobody inside, and root inside
	// cannot change it.
	if got := h.sh("uns-1", "stat -c %u /dev/init; chmod 777 /dev/init 2>/dev/null || echo refused"); got != "65534\nrefused" {
		t.Errorf("/dev/init inside: %q", got)
	}
	// What root inside writes is root's inside, its own ids on disk, and
	// the sandbox's root's host id through the merged root.
	h.sh("uns-1", "echo x > /tmp/f; chown 1000:1000 /tmp/f; touch /tmp/g")
	for name, want := range map[string]uint32{"f": 1000, "g": 0} {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(h.c.writableDir("uns-1"), "upper", "tmp", name), &st); err != nil || st.Uid != want {
			t.Errorf("upper/tmp/%s on disk: uid %d, %v; want %d", name, st.Uid, err, want)
		}
		sb, err := h.c.get("uns-1")
		if err != nil {
			t.Fatal(err)
		}
		err = sb.withRoot(func(root string) error { return unix.Stat(filepath.Join(root, "tmp", name), &st) })
		if err != nil || uint64(st.Uid) != base+uint64(want) {
			t.Errorf("rootfs/tmp/%s from the host: uid %d, %v; want %d", name, st.Uid, err, base+uint64(want))
		}
	}
	// File calls: a written file is root's inside; a tar's owners arrive
	// and leave as the sandbox's ids.
	if err := h.c.WriteFile(ctx, "uns-1", "/tmp/w", 0o644, strings.NewReader("w")); err != nil {
		t.Fatal(err)
	}
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	tw.WriteHeader(&tar.Header{Name: "owned", Mode: 0o644, Size: 1, Uid: 1000, Gid: 1000, Typeflag: tar.TypeReg})
	tw.Write([]byte("o"))
	tw.Close()
	if err := h.c.WriteTar(ctx, "uns-1", "/tmp", &tb); err != nil {
		t.Fatal(err)
	}
	if got := h.sh("uns-1", "stat -c %u:%g /tmp/w /tmp/owned"); got != "0:0\n1000:1000" {
		t.Errorf("owners inside of files the platform wrote: %q", got)
	}
	var out bytes.Buffer
	if err := h.c.ReadTar(ctx, "uns-1", "/tmp/owned", &out); err != nil {
		t.Fatal(err)
	}
	if hdr, err := tar.NewReader(&out).Next(); err != nil || hdr.Uid != 1000 {
		t.Errorf("tar out: %+v, %v; want uid 1000", hdr, err)
	}
	if got := h.exec("uns-1", backend.ExecRequest{Argv: []string{"id", "-u"}, User: "nobody"}).stdout; got != "65534\n" {
		t.Errorf("exec -u nobody: %q", got)
	}
	// After an agent restart the sandbox keeps its range.
	c2 := h.newContainer()
	defer c2.Close()
	if _, err := c2.Recover(ctx, h.spec("uns-1")); err != nil {
		t.Fatal(err)
	}
	var o bytes.Buffer
	if _, err := c2.Exec(ctx, "uns-1", backend.ExecRequest{Argv: []string{"cat", "/proc/self/uid_map"}, Stdout: &o, Timeout: 30 * time.Second}); err != nil ||
		!strings.Contains(o.String(), strconv.FormatUint(base, 10)) {
		t.Errorf("exec after a restart: %q, %v", o.String(), err)
	}
	if r, err := c2.ids.alloc("uns-3"); err != nil || uint64(r.base) == base {
		t.Errorf("a new sandbox after a restart got range %d (%v), the recovered one's", r.base, err)
	}
}

// elf32Exit42 is a minimal i386 ELF executable doing exit(42) with int 0x80.
func elf32Exit42() []byte {
	const base, ehdr, phdr = 0x08048000, 52, 32
	code := []byte{0xb8, 1, 0, 0, 0, 0xbb, 42, 0, 0, 0, 0xcd, 0x80} // mov eax,1; mov ebx,42; int 0x80
	total := uint32(ehdr + phdr + len(code))
	var b bytes.Buffer
	b.Write([]byte{0x7f, 'E', 'L', 'F', 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	binary.Write(&b, binary.LittleEndian, struct {
		Type, Machine                                        uint16
		Version, Entry, Phoff, Shoff, Flags                  uint32
		Ehsize, Phentsize, Phnum, Shentsize, Shnum, Shstrndx uint16
	}{2, 3, 1, base + ehdr + phdr, ehdr, 0, 0, ehdr, phdr, 1, 0, 0, 0})
	binary.Write(&b, binary.LittleEndian, [8]uint32{1, 0, base, base, total, total, 5, 0x1000})
	b.Write(code)
	return b.Bytes()
}

func TestLimits(t *testing.T) {
	h := newHarness(t)
	spec := h.spec("lim-1")
	spec.Resources = backend.Resources{CPU: 0.5, Memory: 64 << 20, PIDs: 32}
	h.start(spec)

	// tail keeps its last line in memory: all of a newline-free input.
	out := h.exec("lim-1", backend.ExecRequest{Argv: []string{"sh", "-c", "head -c 300m /dev/zero | tail"}})
	if out.res.ExitCode == 0 {
		t.Errorf("300 MiB in a 64 MiB sandbox: %+v %q", out.res, out.stderr)
	}
	t.Logf("memory hog: %+v %q", out.res, out.stderr)
	if got := h.sh("lim-1", "echo ok"); got != "ok" {
		t.Error("sandbox dead after OOM")
	}

	// Fork bomb: at most 32 processes, and the sandbox survives.
	out = h.exec("lim-1", backend.ExecRequest{
		Argv:    []string{"sh", "-c", "for i in $(seq 100); do sleep 30 >/dev/null 2>&1 & done 2>/dev/null"},
		Timeout: 10 * time.Second,
	})
	t.Logf("fork bomb: %+v", out.res)
	st, err := h.c.readRuncState("lim-1")
	if err != nil {
		t.Fatal(err)
	}
	pidsDir := st.CgroupPaths["pids"]
	if pidsDir == "" {
		pidsDir = st.CgroupPaths[""]
	}
	b, err := os.ReadFile(filepath.Join(pidsDir, "pids.current"))
	if err != nil {
		t.Fatal(err)
	}
	if n := mustAtoi(t, strings.TrimSpace(string(b))); n < 10 || n > 32 {
		t.Errorf("%d pids in use with a limit of 32", n)
	}
	if err := h.c.Stop(context.Background(), "lim-1", 0); err != nil {
		t.Fatal(err)
	}
	h.c.Destroy(context.Background(), "lim-1")
	h.start(spec)

	for _, f := range []string{"/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu.max"} {
		if got := h.exec("lim-1", backend.ExecRequest{Argv: []string{"cat", f}}); got.res.ExitCode == 0 {
			if q := strings.Fields(got.stdout)[0]; q != "50000" {
				t.Errorf("%s = %q, want 50000", f, got.stdout)
			}
		}
	}
}

func mustAtoi(t *testing.T, s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return n
}

func TestSharedLayer(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	h.start(h.spec("share-1"))
	h.start(h.spec("share-2"))
	if m := h.layerMounts(); len(m) != 1 {
		t.Fatalf("layer mounts = %v, want one shared", m)
	}
	if n := h.c.cfg.Mounts.Refs(h.layer.Digest); n != 2 {
		t.Errorf("refs = %d, want 2", n)
	}
	// Writes stay in each sandbox's upper dir.
	h.sh("share-1", "echo one > /etc/motd")
	if out := h.exec("share-2", backend.ExecRequest{Argv: []string{"cat", "/etc/motd"}}); out.res.ExitCode == 0 {
		t.Error("share-2 sees share-1's write")
	}
	if err := h.c.Destroy(ctx, "share-1"); err != nil {
		t.Fatal(err)
	}
	if m := h.layerMounts(); len(m) != 1 {
		t.Fatalf("layer mounts after one destroy = %v", m)
	}
	if got := h.sh("share-2", "echo still"); got != "still" {
		t.Error("share-2 broken")
	}
	if err := h.c.Destroy(ctx, "share-2"); err != nil {
		t.Fatal(err)
	}
	if m := h.layerMounts(); len(m) != 0 {
		t.Errorf("layer mounts after both destroys = %v", m)
	}
}

func TestRecover(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	spec := h.spec("rec-1")
	h.start(spec)
	h.sh("rec-1", "echo kept > /tmp/state")
	created := h.spec("rec-2")
	if err := h.c.Create(ctx, created); err != nil {
		t.Fatal(err)
	}
	h.start(h.spec("rec-3"))
	before := h.wantState("rec-1", backend.StateRunning)

	// A new agent process over the same directories.
	h.restart()
	if _, err := h.c.Inspect(ctx, "rec-1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("inspect before recover: %v", err)
	}
	st, err := h.c.Recover(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != backend.StateRunning || st.Pid != before.Pid || !st.StartedAt.Equal(before.StartedAt) || st.Reason != "" {
		t.Errorf("recovered %+v, want %+v", st, before)
	}
	if got := h.sh("rec-1", "cat /tmp/state"); got != "kept" {
		t.Errorf("state after recover: %q", got)
	}
	// Its mounts are in its own namespace only (package mountns): none in
	// the host's table; the new process reaches its files all the same.
	if m := mountsUnder(t, h.c.sandboxDir); len(m) != 0 {
		t.Errorf("sandbox mounts in the host's mount table: %q", m)
	}
	var b bytes.Buffer
	if err := h.c.ReadFile(ctx, "rec-1", "/tmp/state", &b); err != nil || b.String() != "kept\n" {
		t.Errorf("ReadFile after recover: %q, %v", b.String(), err)
	}
	if st, err := h.c.Recover(ctx, created); err != nil || st.State != backend.StateCreated {
		t.Errorf("recover created: %+v, %v", st, err)
	}
	if err := h.c.Start(ctx, "rec-2"); err != nil {
		t.Errorf("start after recover: %v", err)
	}
	if n := h.c.cfg.Mounts.Refs(h.layer.Digest); n != 2 {
		t.Errorf("refs after recovering 2 sandboxes = %d", n)
	}
	// rec-3 is never recovered: Prune must leave its layer (shared with
	// the others) alone, and destroying it must work.
	if err := h.c.cfg.Mounts.Prune(); err != nil {
		t.Fatal(err)
	}
	if m := h.layerMounts(); len(m) != 1 {
		t.Errorf("layer mounts after prune: %v", m)
	}
	if err := h.c.Destroy(ctx, "rec-3"); err != nil {
		t.Fatal(err)
	}
	h.assertGone("rec-3")

	// A recovered sandbox can be waited on and stopped.
	waited := make(chan error, 1)
	go func() {
		_, err := h.c.Wait(ctx, "rec-1")
		waited <- err
	}()
	if err := h.c.Stop(ctx, "rec-1", 0); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waited:
		if err != nil {
			t.Error(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait on a recovered sandbox did not return")
	}
	// A dead sandbox recovers as stopped.
	h.restart()
	if st, err := h.c.Recover(ctx, spec); err != nil || st.State != backend.StateStopped {
		t.Errorf("recover of a dead sandbox: %+v, %v", st, err)
	}
	if _, err := h.c.Recover(ctx, h.spec("rec-none")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("recover of an unknown sandbox: got %v, want ErrNotFound", err)
	}
	for _, id := range []string{"rec-1", "rec-2"} {
		if err := h.c.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
		h.assertGone(id)
	}
	if m := h.layerMounts(); len(m) != 1 {
		// rec-2 was not recovered by this last Container: its layer
		// reference is gone with the old one, and Prune takes the mount.
		if err := h.c.cfg.Mounts.Prune(); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.c.cfg.Mounts.Prune(); err != nil {
		t.Fatal(err)
	}
	if m := h.layerMounts(); len(m) != 0 {
		t.Errorf("layer mounts left: %v", m)
	}
}

// TestSurvivesAgentKill creates a sandbox from a child process, kills the
// child with SIGKILL, and recovers the sandbox here.
func TestSurvivesAgentKill(t *testing.T) {
	if os.Getenv("WARREN_TEST_AGENT_CHILD") != "" {
		agentChild()
		return
	}
	h := newHarness(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestSurvivesAgentKill$")
	cmd.Env = append(os.Environ(), "WARREN_TEST_AGENT_CHILD=1",
		"CHILD_STATE="+h.cfg.StateDir, "CHILD_CGROUP="+h.cfg.CgroupParent,
		"CHILD_LAYER="+h.layer.Digest+"="+h.layer.Path)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "ready\n" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("child said %q, %v", line, err)
	}
	cmd.Process.Kill()
	cmd.Wait()

	h.restart()
	st, err := h.c.Recover(context.Background(), h.spec("orphan-1"))
	if err != nil || st.State != backend.StateRunning {
		t.Fatalf("after the agent's death: %+v, %v", st, err)
	}
	if got := h.sh("orphan-1", "echo survived"); got != "survived" {
		t.Errorf("exec: %q", got)
	}
}

func agentChild() {
	digest, path, _ := strings.Cut(os.Getenv("CHILD_LAYER"), "=")
	c, err := New(Config{StateDir: os.Getenv("CHILD_STATE"), CgroupParent: os.Getenv("CHILD_CGROUP")})
	if err == nil {
		ctx := context.Background()
		spec := backend.Spec{ID: "orphan-1", Layers: []backend.Layer{{Digest: digest, Path: path}}}
		if err = c.Create(ctx, spec); err == nil {
			err = c.Start(ctx, spec.ID)
		}
	}
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	fmt.Println("ready")
	time.Sleep(time.Hour)
}

func TestCreateFailureUndoes(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()

	// A missing second layer: the first was mounted and must be released.
	spec := h.spec("fail-1")
	spec.Layers = append(spec.Layers, backend.Layer{Digest: "sha256:" + strings.Repeat("ab", 32), Path: "/nonexistent.erofs"})
	if err := h.c.Create(ctx, spec); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("missing layer: got %v, want ErrNotFound", err)
	}
	h.assertGone("fail-1")
	if m := h.layerMounts(); len(m) != 0 {
		t.Errorf("layer mounts left: %v", m)
	}

	// runc fails late (the init binary to bind-mount is missing).
	cfg := h.cfg
	cfg.InitPath = "/nonexistent/catatonit"
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, h.spec("fail-2")); err == nil {
		t.Fatal("create with a missing init succeeded")
	} else if !strings.Contains(err.Error(), "catatonit") {
		t.Errorf("error does not say what failed: %v", err)
	}
	h.assertGone("fail-2")
	if m := h.layerMounts(); len(m) != 0 {
		t.Errorf("layer mounts left: %v", m)
	}

	for _, bad := range []backend.Spec{
		{ID: "", Layers: spec.Layers},
		{ID: "../x", Layers: spec.Layers},
		{ID: "nolayers"},
		{ID: "neg", Layers: spec.Layers, Resources: backend.Resources{Memory: -1}},
	} {
		if err := h.c.Create(ctx, bad); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("create %+v: got %v, want ErrInvalid", bad, err)
		}
	}
}

func TestConcurrentCreates(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	const n = 8
	fds := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	before := fds()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			id := fmt.Sprintf("par-%d", i)
			if err := h.c.Create(ctx, h.spec(id)); err != nil {
				t.Error(err)
				return
			}
			if err := h.c.Start(ctx, id); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("par-%d", i)
		if got := h.sh(id, "hostname"); got != id {
			t.Errorf("hostname %q in %s", got, id)
		}
	}
	// An idle sandbox costs the agent no descriptor here (its root is on
	// the mount shelf): a node of 10,000 must fit the host's limit.
	if d := fds() - before; d >= n {
		t.Errorf("%d idle sandboxes hold %d more descriptors", n, d)
	}
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := h.c.Destroy(ctx, fmt.Sprintf("par-%d", i)); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	for i := 0; i < n; i++ {
		h.assertGone(fmt.Sprintf("par-%d", i))
	}
	if m := h.layerMounts(); len(m) != 0 {
		t.Errorf("layer mounts left: %v", m)
	}
}

func TestAvailable(t *testing.T) {
	testutil.RequireContainers(t)
	c, err := New(Config{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Available(context.Background()); err != nil {
		t.Errorf("available: %v", err)
	}
	c, err = New(Config{StateDir: t.TempDir(), RuncPath: "/nonexistent/runc"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Available(context.Background()); !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "runc") {
		t.Errorf("without runc: got %v, want ErrUnavailable naming runc", err)
	}
	if _, err := New(Config{StateDir: "relative"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("relative StateDir: %v", err)
	}
}
