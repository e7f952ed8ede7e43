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

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/backend/container"
	"github.com/warrenhq/warren/internal/backend/fake"
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
