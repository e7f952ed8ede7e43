package image_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/backend/container"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/node"
	"github.com/warrenhq/warren/internal/store"
	"github.com/warrenhq/warren/internal/testutil"
)

// TestEnvironmentSandbox builds base, workspace and toolkit layers,
// composes an environment and starts a real container from it: the
// overlay stacks toolkit above workspace above base, and the
// environment's defaults apply to exec.
func TestEnvironmentSandbox(t *testing.T) {
	testutil.RequireContainers(t)
	requireBusybox(t)
	ctx := context.Background()
	bs := newBlobs(t)
	reg := image.NewRegistry(store.Memory(), bs, image.WithWorkDir(t.TempDir()), image.WithLogger(quiet))

	baseDir := filepath.Join(t.TempDir(), "base")
	must(t, image.BuildBusyboxRootfs(baseDir))
	write := func(dir string, files map[string]string) string {
		for p, body := range files {
			full := filepath.Join(dir, p)
			must(t, os.MkdirAll(filepath.Dir(full), 0o755))
			must(t, os.WriteFile(full, []byte(body), 0o644))
		}
		return dir
	}
	write(baseDir, map[string]string{"etc/stack": "base\n", "opt/from-base": "b\n", "work/shadowed": "base\n"})
	layers := []struct {
		kind, name string
		dir        string
	}{
		{api.LayerBase, "mini", baseDir},
		{api.LayerWorkspace, "task", write(t.TempDir(), map[string]string{"etc/stack": "workspace\n", "work/task.txt": "solve me\n", "work/shadowed": "workspace\n"})},
		{api.LayerToolkit, "harness", write(t.TempDir(), map[string]string{"etc/stack": "toolkit\n", "opt/harness/run": "harness\n"})},
	}
	for _, l := range layers {
		if _, err := reg.BuildLayer(ctx, image.LayerSpec{Name: l.name, Version: "1", Kind: l.kind}, l.dir); err != nil {
			t.Fatalf("build %s: %v", l.name, err)
		}
	}
	_, err := reg.CreateEnv(ctx, api.CreateEnvironmentRequest{
		Name: "task", Version: "1", Base: "mini@1", Workspace: "task@1", Toolkits: []string{"harness@1"},
		Env: map[string]string{"TASK": "42"}, Workdir: "/work", User: "nobody",
	})
	must(t, err)

	b := make([]byte, 4)
	rand.Read(b)
	cgroup := "/warren-test/" + hex.EncodeToString(b)
	t.Cleanup(func() { // after the sandboxes are gone
		dirs, _ := filepath.Glob("/sys/fs/cgroup/*" + cgroup)
		more, _ := filepath.Glob("/sys/fs/cgroup" + cgroup)
		for _, d := range append(dirs, more...) {
			os.Remove(d)
			os.Remove(filepath.Dir(d))
		}
	})
	stateDir := t.TempDir()
	ctr, err := container.New(container.Config{StateDir: filepath.Join(stateDir, "container"), CgroupParent: cgroup})
	must(t, err)
	agent, err := node.New(ctx, node.Config{
		ID:       "it1",
		StateDir: filepath.Join(stateDir, "sandboxes"),
		Backends: []backend.Backend{ctr},
		Images:   reg,
		Layers:   image.NewCache(filepath.Join(stateDir, "cache"), bs),
		Log:      quiet,
	})
	must(t, err)
	must(t, agent.Start(ctx))
	t.Cleanup(func() { agent.Close() })

	sb, err := agent.Create(ctx, api.CreateSandboxRequest{Image: "task@1", Resources: api.Resources{Memory: 128 << 20}})
	must(t, err)
	t.Cleanup(func() {
		if err := agent.Delete(context.Background(), sb.ID); err != nil {
			t.Errorf("delete: %v", err)
		}
	})
	exec := func(cmd string) string {
		t.Helper()
		res, err := agent.Exec(ctx, sb.ID, api.ExecRequest{Cmd: cmd}, nil, nil)
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec %q: %+v, %v", cmd, res, err)
		}
		return strings.TrimSpace(res.Stdout)
	}
	for cmd, want := range map[string]string{
		"cat /etc/stack":          "toolkit", // the top layer wins
		"cat /work/shadowed":      "workspace",
		"cat /work/task.txt":      "solve me",
		"cat /opt/from-base":      "b",
		"cat /opt/harness/run":    "harness",
		"pwd":                     "/work",
		"id -u":                   "65534",
		"echo $TASK":              "42",
		"ls /opt | tr '\\n' ' '":  "from-base harness",
		"touch /tmp/x && echo ok": "ok",
	} {
		if got := exec(cmd); got != want {
			t.Errorf("%s: got %q, want %q", cmd, got, want)
		}
	}
	// A write lands in the sandbox's own upper layer, not in a layer.
	res, err := agent.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "echo changed > /etc/stack && cat /etc/stack", User: "0"}, nil, nil)
	if err != nil || strings.TrimSpace(res.Stdout) != "changed" {
		t.Fatalf("write in sandbox: %+v, %v", res, err)
	}
	other, err := agent.Create(ctx, api.CreateSandboxRequest{Layers: []string{"mini@1", "harness@1"}, Resources: api.Resources{Memory: 128 << 20}})
	must(t, err)
	defer agent.Delete(context.Background(), other.ID)
	res, err = agent.Exec(ctx, other.ID, api.ExecRequest{Cmd: "cat /etc/stack; test -e /work/task.txt || echo no-task"}, nil, nil)
	if err != nil || res.Stdout != "toolkit\nno-task\n" {
		t.Errorf("sandbox from a layer list: %q, %v", res.Stdout, err)
	}

	// The layers in use cannot go.
	live := map[string][]string{}
	for _, d := range sb.Layers {
		live[d] = []string{sb.ID}
	}
	must(t, reg.DeleteEnv(ctx, "task@1"))
	if err := reg.DeleteLayer(ctx, "task@1", live); err == nil {
		t.Error("deleted the workspace layer of a live sandbox")
	}
}
