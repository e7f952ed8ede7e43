package regtest_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/backend/container"
	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/image/imagetest/regtest"
	"github.com/warrenhq/warren/internal/node"
	"github.com/warrenhq/warren/internal/node/nodetest"
	"github.com/warrenhq/warren/internal/store"
	"github.com/warrenhq/warren/internal/testutil"
)

// TestPublishDebian publishes both Debian runtime images and runs their
// tools in container sandboxes started from the environments: python3 in
// debian-python, a C++ build in debian-gcc.
func TestPublishDebian(t *testing.T) {
	testutil.RequireContainers(t)
	ctx := context.Background()
	bs, err := blob.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg := image.NewRegistry(store.Memory(), bs, image.WithWorkDir(t.TempDir()), image.WithLogger(quiet))

	py := regtest.PublishDebian(t, reg, "python")
	gcc := regtest.PublishDebian(t, reg, "gcc")
	if again := regtest.PublishDebian(t, reg, "gcc"); again.Layers[0].Digest != gcc.Layers[0].Digest {
		t.Errorf("publishing again: got layer %s, want %s kept", again.Layers[0].Digest, gcc.Layers[0].Digest)
	}
	for _, env := range []api.Environment{py, gcc} {
		if !strings.HasPrefix(env.Ref, "debian-") || len(env.Layers) != 1 || env.Layers[0].Ref != env.Ref || env.Layers[0].Kind != api.LayerBase {
			t.Fatalf("environment: got %+v, want one base layer of its own ref", env)
		}
		t.Logf("%s: %d MiB", env.Ref, env.Size>>20)
	}

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
	state := t.TempDir()
	ctr, err := container.New(container.Config{StateDir: filepath.Join(state, "container"), CgroupParent: cgroup})
	if err != nil {
		t.Fatal(err)
	}
	agent := nodetest.New(t, func(c *node.Config) {
		c.Backends = []backend.Backend{ctr}
		c.Images = reg
		c.Layers = image.NewCache(filepath.Join(state, "cache"), bs)
	})
	run := func(env, cmd string) string {
		t.Helper()
		sb, err := agent.Create(ctx, api.CreateSandboxRequest{Image: env, Resources: api.Resources{Memory: 512 << 20}})
		if err != nil {
			t.Fatalf("sandbox from %s: %v", env, err)
		}
		defer agent.Delete(context.Background(), sb.ID)
		res, err := agent.Exec(ctx, sb.ID, api.ExecRequest{Cmd: cmd}, nil, nil)
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("%s: %s: %+v, %v", env, cmd, res, err)
		}
		return strings.TrimSpace(res.Stdout)
	}
	if got := run(py.Ref, `python3 -c 'import ssl; print(6 * 7)'`); got != "42" {
		t.Errorf("python3 in %s: got %q, want 42", py.Ref, got)
	}
	cpp := `printf '#include <iostream>\nint main() { std::cout << 6 * 7 << std::endl; }\n' > /tmp/a.cpp && g++ -O2 -o /tmp/a /tmp/a.cpp && /tmp/a`
	if got := run(gcc.Ref, cpp); got != "42" {
		t.Errorf("g++ in %s: got %q, want 42", gcc.Ref, got)
	}
}
