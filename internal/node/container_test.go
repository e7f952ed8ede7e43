package node

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/backend/container"
	"github.com/warrenhq/warren/internal/backend/fake"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/image/imagetest"
	"github.com/warrenhq/warren/internal/testutil"
)

// The backends that hold host state sweep it: a signature drifting from
// sweeper's would make Start skip them silently.
var (
	_ sweeper = (*container.Container)(nil)
	_ sweeper = (*fake.Backend)(nil)
)

// containerNode is a node over the real container backend with a busybox
// image, its state in dir and its cgroups under a parent of its own.
type containerNode struct {
	t      *testing.T
	dir    string
	id     string
	layer  backend.Layer
	parent string
	logs   *testutil.SyncBuffer
}

func newContainerNode(t *testing.T) *containerNode {
	t.Helper()
	testutil.RequireContainers(t)
	var b [4]byte
	rand.Read(b[:])
	id := "t" + hex.EncodeToString(b[:])
	n := &containerNode{t: t, dir: t.TempDir(), id: id, layer: imagetest.BusyboxLayer(t),
		parent: "/warren-test/" + id, logs: &testutil.SyncBuffer{}}
	t.Cleanup(n.cleanup)
	return n
}

// start starts a new agent process's worth of state over the node's dirs.
func (n *containerNode) start(mod func(*Config)) *Agent {
	n.t.Helper()
	mounts := image.NewMounts(filepath.Join(n.dir, "layers"))
	c, err := container.New(container.Config{StateDir: filepath.Join(n.dir, "container"), CgroupParent: n.parent, Mounts: mounts})
	if err != nil {
		n.t.Fatal(err)
	}
	cfg := Config{
		ID:           n.id,
		StateDir:     filepath.Join(n.dir, "state"),
		Backends:     []backend.Backend{c},
		Images:       imagetest.Images{"busybox": {Name: "busybox", Layers: []string{n.layer.Digest}}},
		Layers:       fixedLayer{n.layer},
		ReapInterval: 20 * time.Millisecond,
		Log:          slog.New(slog.NewTextHandler(n.logs, nil)),
	}
	if mod != nil {
		mod(&cfg)
	}
	a, err := New(context.Background(), cfg)
	if err != nil {
		n.t.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { a.Close() })
	return a
}

// cleanup ends whatever the test left, with a last agent that sweeps,
// and removes the node's cgroup parent.
func (n *containerNode) cleanup() {
	os.RemoveAll(filepath.Join(n.dir, "state"))
	n.start(nil).Close() // no records: Start sweeps everything
	hiers, _ := filepath.Glob("/sys/fs/cgroup/*")
	for _, h := range append(hiers, "/sys/fs/cgroup") {
		d := filepath.Join(h, n.parent)
		os.Remove(d)
		os.Remove(filepath.Dir(d)) // /warren-test, if no other test uses it
		if _, err := os.Stat(d); err == nil {
			n.t.Errorf("cgroup left: %s", d)
		}
	}
}

type fixedLayer struct{ l backend.Layer }

func (f fixedLayer) Fetch(context.Context, string) (backend.Layer, error) { return f.l, nil }

// The case on real containers: an exec longer than the idle
// timeout runs to its end, and the idle clock starts after it.
func TestContainerCallKeepsIdleSandboxAlive(t *testing.T) {
	n := newContainerNode(t)
	keepsAlive(t, n.start(nil), 3*time.Second)
}

func TestContainerCallCutShortIsSandboxGone(t *testing.T) {
	n := newContainerNode(t)
	a := n.start(nil)
	cases := []struct {
		name   string
		req    api.CreateSandboxRequest
		end    func(a *Agent, id string)
		reason string
	}{
		{"delete", api.CreateSandboxRequest{}, func(a *Agent, id string) { a.Delete(context.Background(), id) }, endDeleted},
		{"ttl", api.CreateSandboxRequest{TTL: api.Duration(2 * time.Second)}, nil, endTTL},
		{"shutdown", api.CreateSandboxRequest{}, func(a *Agent, _ string) { a.StopSandboxes(context.Background()) }, endShutdown},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { cutShort(t, a, tc.req, tc.end, tc.reason) })
	}
}

// A sandbox whose record is gone (the agent died before writing it, or
// someone removed it) is swept at the next start: nothing of it is left.
func TestContainerStartSweepsUnrecorded(t *testing.T) {
	ctx := context.Background()
	n := newContainerNode(t)
	a := n.start(nil)
	orphan := mustCreate(t, a, api.CreateSandboxRequest{})
	kept := mustCreate(t, a, api.CreateSandboxRequest{})
	a.Close()
	if err := os.Remove(a.recordPath(orphan.ID)); err != nil {
		t.Fatal(err)
	}

	a2 := n.start(nil)
	logs := n.logs.String()
	for _, want := range []string{"runc state", "cgroup", "mount", "directory"} {
		if !strings.Contains(logs, want) || !strings.Contains(logs, orphan.ID) {
			t.Errorf("log does not say it swept the orphan's %s:\n%s", want, logs)
		}
	}
	for _, p := range []string{
		filepath.Join(n.dir, "container", "sandboxes", orphan.ID),
		filepath.Join(n.dir, "container", "runc", orphan.ID),
		filepath.Join("/sys/fs/cgroup/pids", n.parent, orphan.ID),
		filepath.Join("/sys/fs/cgroup/memory", n.parent, orphan.ID),
		filepath.Join("/sys/fs/cgroup", n.parent, orphan.ID), // v2
	} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s: %v, want swept", p, err)
		}
	}
	if mps, _ := image.MountsUnder(filepath.Join(n.dir, "container", "sandboxes", orphan.ID)); len(mps) > 0 {
		t.Errorf("mounts left: %v", mps)
	}
	res, err := a2.Exec(ctx, kept.ID, api.ExecRequest{Cmd: "echo alive"}, nil, nil)
	if err != nil || strings.TrimSpace(res.Stdout) != "alive" {
		t.Errorf("exec in the recorded sandbox after the sweep = %+v, %v", res, err)
	}
}

// filePacker is a Packer that keeps one file of what it is given to pack.
type filePacker struct {
	name string
	got  []byte
	err  error
}

func (p *filePacker) Pack(_ context.Context, dir, parent string) (api.PackResult, error) {
	p.got, p.err = os.ReadFile(filepath.Join(dir, p.name))
	return api.PackResult{Digest: "sha256:packed", Parent: parent}, nil
}

// TestContainerGVisor: a sandbox created through the agent with runtime
// gvisor runs on gVisor's kernel (its dmesg and kernel release say so),
// execs, pauses, resumes and snapshots like any, is refused ports, and is
// re-adopted under runsc by a restarted agent.
func TestContainerGVisor(t *testing.T) {
	ctx := context.Background()
	n := newContainerNode(t)
	packer := &filePacker{name: "snap-me"}
	withPacker := func(c *Config) { c.Packer = packer }
	a := n.start(withPacker)
	st := a.Status()
	if ok, why := st.RunsRuntime(api.BackendContainer, api.RuntimeGVisor); !ok {
		testutil.Unavailable(t, "gVisor cannot run here: %s", why)
	}
	if ok, _ := st.RunsRuntime(api.BackendContainer, api.RuntimeRunc); !ok || st.Runtimes[0].Name != api.RuntimeRunc {
		t.Errorf("status runtimes %+v: want runc first, available", st.Runtimes)
	}

	start := time.Now()
	sb := mustCreate(t, a, api.CreateSandboxRequest{Runtime: api.RuntimeGVisor, Resources: api.Resources{PIDs: 64}})
	t.Logf("gvisor sandbox created in %v", time.Since(start))
	if sb.Runtime != api.RuntimeGVisor || sb.State != api.StateRunning {
		t.Fatalf("created %+v: want running under gvisor", sb)
	}
	run := func(a *Agent, cmd string) string {
		t.Helper()
		res, err := a.Exec(ctx, sb.ID, api.ExecRequest{Cmd: cmd}, nil, nil)
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec %q: %+v, %v", cmd, res, err)
		}
		return strings.TrimSpace(res.Stdout)
	}
	var host unix.Utsname
	if err := unix.Uname(&host); err != nil {
		t.Fatal(err)
	}
	uname, dmesg := run(a, "uname -a"), run(a, "dmesg")
	t.Logf("uname -a: %s\ndmesg: %.200s", uname, dmesg)
	if !strings.Contains(dmesg, "gVisor") {
		t.Errorf("dmesg inside does not name gVisor: %q", dmesg)
	}
	if release := run(a, "uname -r"); release == unix.ByteSliceToString(host.Release[:]) {
		t.Errorf("uname -r inside is the host's %q: not gVisor's kernel", release)
	}

	// Not the node's to reach: ports (nor, at create, a network).
	if _, err := a.DialPort(ctx, sb.ID, 80); errdefs.Code(err) != api.CodeNotSupported {
		t.Errorf("DialPort: %v, want not_supported", err)
	}

	run(a, "echo kept > /snap-me")
	if p, err := a.Pause(ctx, sb.ID, "caller"); err != nil || p.State != api.StatePaused {
		t.Fatalf("Pause: %+v, %v", p, err)
	}
	if _, err := a.Resume(ctx, sb.ID, "caller"); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if _, err := a.Pack(ctx, sb.ID, api.PackRequest{}); err != nil || packer.err != nil || string(packer.got) != "kept\n" {
		t.Errorf("snapshot: %v; packed /snap-me %q, %v; want %q", err, packer.got, packer.err, "kept\n")
	}

	a.Close()
	a2 := n.start(withPacker)
	if got, err := a2.Get(ctx, sb.ID); err != nil || got.State != api.StateRunning || got.Runtime != api.RuntimeGVisor {
		t.Fatalf("after an agent restart: %+v, %v; want running under gvisor", got, err)
	}
	if got := run(a2, "cat /snap-me; dmesg | grep -c gVisor"); !strings.HasPrefix(got, "kept\n") {
		t.Errorf("exec after an agent restart: %q", got)
	}
	if err := a2.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
}
