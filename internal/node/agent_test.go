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
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/backend/fake"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/image/imagetest"
)

// newAgent starts an agent over a fake backend named "container" in dir.
func newAgent(t *testing.T, dir string, mod func(*Config)) *Agent {
	t.Helper()
	b, err := fake.New(filepath.Join(dir, "fake"), fake.Options{Name: api.BackendContainer})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		ID:           "n1",
		StateDir:     filepath.Join(dir, "state"),
		Backends:     []backend.Backend{b},
		Images:       imagetest.Busybox,
		Layers:       imagetest.NoLayers{},
		ReapInterval: 20 * time.Millisecond,
		Log:          slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if mod != nil {
		mod(&cfg)
	}
	a, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

func mustCreate(t *testing.T, a *Agent, req api.CreateSandboxRequest) api.Sandbox {
	t.Helper()
	if req.Image == "" {
		req.Image = "busybox"
	}
	sb, err := a.Create(context.Background(), req)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	return sb
}

func TestLifecycle(t *testing.T) {
	ctx := context.Background()
	a := newAgent(t, t.TempDir(), nil)
	sb := mustCreate(t, a, api.CreateSandboxRequest{Labels: map[string]string{"task": "demo"}})
	if sb.State != api.StateRunning {
		t.Fatalf("state = %q, want running", sb.State)
	}
	if node, err := NodeOf(sb.ID); err != nil || node != "n1" {
		t.Fatalf("NodeOf(%q) = %q, %v; want n1", sb.ID, node, err)
	}
	if sb.Resources.CPU != 1 || sb.Resources.Memory != 512<<20 || sb.ExpiresAt == nil {
		t.Errorf("defaults not applied: %+v", sb)
	}
	other := mustCreate(t, a, api.CreateSandboxRequest{})

	list, _ := a.List(ctx, Filter{Labels: map[string]string{"task": "demo"}})
	if len(list) != 1 || list[0].ID != sb.ID {
		t.Errorf("List(task=demo) = %v, want just %s", ids(list), sb.ID)
	}
	if list, _ := a.List(ctx, Filter{}); len(list) != 2 {
		t.Errorf("List() has %d sandboxes, want 2", len(list))
	}

	res, err := a.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "echo hello; echo oops >&2; exit 3"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Stdout != "hello\n" || res.Stderr != "oops\n" || res.ExitCode != 3 || res.TimedOut {
		t.Errorf("exec = %+v, want hello/oops/3", res)
	}

	if err := a.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Get(ctx, sb.ID); !errors.Is(err, errdefs.ErrNotFound) || errdefs.Code(err) != api.CodeSandboxNotFound {
		t.Errorf("Get after delete: %v, want sandbox_not_found", err)
	}
	if err := a.Delete(ctx, sb.ID); err != nil {
		t.Errorf("second Delete: %v, want nil (idempotent)", err)
	}
	if _, err := os.Stat(a.recordPath(sb.ID)); !os.IsNotExist(err) {
		t.Errorf("record left after delete: %v", err)
	}
	if got := a.Status().Usage.Sandboxes; got != 1 {
		t.Errorf("usage after delete = %d sandboxes, want 1", got)
	}
	if _, err := a.Get(ctx, other.ID); err != nil {
		t.Errorf("the other sandbox: %v", err)
	}
}

func ids(list []api.Sandbox) []string {
	var out []string
	for _, s := range list {
		out = append(out, s.ID)
	}
	return out
}

func TestCreateValidation(t *testing.T) {
	a := newAgent(t, t.TempDir(), nil)
	for _, tc := range []struct {
		name string
		req  api.CreateSandboxRequest
		kind error
		code string
	}{
		{"no image", api.CreateSandboxRequest{}, errdefs.ErrInvalid, ""},
		{"unknown image", api.CreateSandboxRequest{Image: "nope"}, errdefs.ErrNotFound, api.CodeImageNotFound},
		{"unknown backend", api.CreateSandboxRequest{Image: "busybox", Backend: "lxc"}, errdefs.ErrInvalid, ""},
		{"backend not here", api.CreateSandboxRequest{Image: "busybox", Backend: api.BackendVM}, errdefs.ErrUnavailable, api.CodeBackendUnavailable},
		{"negative cpu", api.CreateSandboxRequest{Image: "busybox", Resources: api.Resources{CPU: -1}}, errdefs.ErrInvalid, ""},
		{"huge cpu", api.CreateSandboxRequest{Image: "busybox", Resources: api.Resources{CPU: 1e6}}, errdefs.ErrInvalid, ""},
		{"tiny memory", api.CreateSandboxRequest{Image: "busybox", Resources: api.Resources{Memory: 1024}}, errdefs.ErrInvalid, ""},
		{"memory under 16Mi", api.CreateSandboxRequest{Image: "busybox", Resources: api.Resources{Memory: 12 << 20}}, errdefs.ErrInvalid, ""},
		{"huge memory", api.CreateSandboxRequest{Image: "busybox", Resources: api.Resources{Memory: 1 << 60}}, errdefs.ErrInvalid, ""},
		{"few pids", api.CreateSandboxRequest{Image: "busybox", Resources: api.Resources{PIDs: 2}}, errdefs.ErrInvalid, ""},
		{"short ttl", api.CreateSandboxRequest{Image: "busybox", TTL: api.Duration(time.Millisecond)}, errdefs.ErrInvalid, ""},
		{"bad label", api.CreateSandboxRequest{Image: "busybox", Labels: map[string]string{"bad key": "v"}}, errdefs.ErrInvalid, ""},
		{"bad env", api.CreateSandboxRequest{Image: "busybox", Env: map[string]string{"A=B": "v"}}, errdefs.ErrInvalid, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := a.Create(context.Background(), tc.req)
			if !errors.Is(err, tc.kind) {
				t.Fatalf("err = %v, want kind %v", err, tc.kind)
			}
			if tc.code != "" && errdefs.Code(err) != tc.code {
				t.Errorf("code = %q, want %q", errdefs.Code(err), tc.code)
			}
		})
	}
	if n := a.Status().Usage; n.Sandboxes != 0 || n.CPU != 0 || n.Memory != 0 {
		t.Errorf("refused creates left a reservation: %+v", n)
	}
}

func TestAdmission(t *testing.T) {
	ctx := context.Background()
	a := newAgent(t, t.TempDir(), func(c *Config) { c.Limits = Limits{Sandboxes: 2, Memory: 1 << 30} })
	s1 := mustCreate(t, a, api.CreateSandboxRequest{Resources: api.Resources{Memory: 256 << 20}})
	mustCreate(t, a, api.CreateSandboxRequest{Resources: api.Resources{Memory: 256 << 20}})
	_, err := a.Create(ctx, api.CreateSandboxRequest{Image: "busybox", Resources: api.Resources{Memory: 256 << 20}})
	if !errors.Is(err, errdefs.ErrExhausted) || errdefs.Code(err) != api.CodeNodeFull || errdefs.RetryAfter(err) <= 0 {
		t.Fatalf("third create: %v (code %q, retry %v), want node_full with a retry hint", err, errdefs.Code(err), errdefs.RetryAfter(err))
	}
	if err := a.Delete(ctx, s1.ID); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, a, api.CreateSandboxRequest{Resources: api.Resources{Memory: 256 << 20}})
	// With room for more sandboxes, memory is what refuses: 1Gi reserved of 1Gi.
	a.cfg.Limits.Sandboxes = 10
	mustCreate(t, a, api.CreateSandboxRequest{Resources: api.Resources{Memory: 256 << 20}})
	mustCreate(t, a, api.CreateSandboxRequest{Resources: api.Resources{Memory: 256 << 20}})
	if _, err := a.Create(ctx, api.CreateSandboxRequest{Image: "busybox", Resources: api.Resources{Memory: 256 << 20}}); !errors.Is(err, errdefs.ErrExhausted) {
		t.Fatalf("create past memory: %v, want ErrExhausted", err)
	}
}

func TestCreateFailureReleases(t *testing.T) {
	dir := t.TempDir()
	b, err := fake.New(filepath.Join(dir, "fake"), fake.Options{Name: api.BackendContainer,
		CreateHook: func(context.Context, backend.Spec) error { return errors.New("disk on fire") }})
	if err != nil {
		t.Fatal(err)
	}
	a := newAgent(t, dir, func(c *Config) { c.Backends = []backend.Backend{b} })
	if _, err := a.Create(context.Background(), api.CreateSandboxRequest{Image: "busybox"}); err == nil || !strings.Contains(err.Error(), "disk on fire") {
		t.Fatalf("Create = %v, want the backend's error", err)
	}
	if u := a.Status().Usage; u.Sandboxes != 0 {
		t.Errorf("failed create left usage %+v", u)
	}
	if entries, _ := os.ReadDir(a.cfg.StateDir); len(entries) != 0 {
		t.Errorf("failed create left records: %v", entries)
	}
}

func TestExecOutput(t *testing.T) {
	ctx := context.Background()
	a := newAgent(t, t.TempDir(), nil)
	sb := mustCreate(t, a, api.CreateSandboxRequest{})

	res, err := a.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "yes | head -c 3000000", MaxOutput: 1000}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Stdout) != 1000 || !res.StdoutTruncated || res.StdoutBytes != 3000000 {
		t.Errorf("capped exec: %d bytes kept, truncated %v, total %d; want 1000, true, 3000000",
			len(res.Stdout), res.StdoutTruncated, res.StdoutBytes)
	}

	res, err = a.Exec(ctx, sb.ID, api.ExecRequest{Cmd: `printf 'a\377b'`}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.StdoutEncoding != api.EncodingBase64 || res.Stdout != "Yf9i" {
		t.Errorf("binary output = %q (%q), want base64 Yf9i", res.Stdout, res.StdoutEncoding)
	}

	res, err = a.Exec(ctx, sb.ID, api.ExecRequest{Argv: []string{"cat"}, Stdin: "aGk=", StdinEncoding: api.EncodingBase64}, nil, nil)
	if err != nil || res.Stdout != "hi" {
		t.Errorf("stdin base64: %q, %v; want hi", res.Stdout, err)
	}

	var out, errb bytes.Buffer
	res, err = a.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "echo out; echo err >&2"}, &out, &errb)
	if err != nil || out.String() != "out\n" || errb.String() != "err\n" || res.Stdout != "" {
		t.Errorf("streamed exec: out %q err %q res %+v %v", out.String(), errb.String(), res, err)
	}

	start := time.Now()
	res, err = a.Exec(ctx, sb.ID, api.ExecRequest{Argv: []string{"sleep", "60"}, Timeout: api.Duration(200 * time.Millisecond)}, nil, nil)
	if err != nil || !res.TimedOut || time.Since(start) > 10*time.Second {
		t.Errorf("timeout: %+v %v after %v, want timed_out quickly", res, err, time.Since(start))
	}

	for _, bad := range []api.ExecRequest{
		{},
		{Argv: []string{"a"}, Cmd: "b"},
		{Argv: []string{""}},
		{Cmd: "true", Cwd: "relative"},
		{Cmd: "true", Env: map[string]string{"1x": "y"}},
		{Cmd: "true", StdinEncoding: "rot13"},
		{Cmd: "true", Stdin: "!!", StdinEncoding: api.EncodingBase64},
		{Cmd: "true", Timeout: api.Duration(48 * time.Hour)},
	} {
		if _, err := a.Exec(ctx, sb.ID, bad, nil, nil); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Exec(%+v) = %v, want ErrInvalid", bad, err)
		}
	}
	if _, err := a.Exec(ctx, "n1-aaaaaaaaaaaaaaaa", api.ExecRequest{Cmd: "true"}, nil, nil); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("exec unknown sandbox: %v, want ErrNotFound", err)
	}
	if _, err := a.Exec(ctx, "../../etc", api.ExecRequest{Cmd: "true"}, nil, nil); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("exec malformed id: %v, want ErrInvalid", err)
	}
}

func TestFiles(t *testing.T) {
	ctx := context.Background()
	a := newAgent(t, t.TempDir(), nil)
	sb := mustCreate(t, a, api.CreateSandboxRequest{})
	if err := a.WriteFile(ctx, sb.ID, "/work/a.txt", 0o600, strings.NewReader("data")); err != nil {
		t.Fatal(err)
	}
	fi, err := a.Stat(ctx, sb.ID, "/work/a.txt")
	if err != nil || fi.Size != 4 || fi.Mode != 0o600 || fi.IsDir {
		t.Errorf("Stat = %+v, %v", fi, err)
	}
	var buf bytes.Buffer
	if err := a.ReadFile(ctx, sb.ID, "/work/a.txt", &buf); err != nil || buf.String() != "data" {
		t.Errorf("ReadFile = %q, %v", buf.String(), err)
	}
	_, err = a.Stat(ctx, sb.ID, "/work/missing")
	if !errors.Is(err, errdefs.ErrNotFound) || errdefs.Code(err) != api.CodeFileNotFound {
		t.Errorf("Stat missing = %v (code %q), want file_not_found", err, errdefs.Code(err))
	}
	for _, p := range []string{"", "relative", "/a\x00b"} {
		if _, err := a.Stat(ctx, sb.ID, p); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Stat(%q) = %v, want ErrInvalid", p, err)
		}
	}
	if err := a.WriteFile(ctx, sb.ID, "/x", 0o170000, strings.NewReader("")); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("WriteFile with type bits: %v, want ErrInvalid", err)
	}
}

func TestReap(t *testing.T) {
	ctx := context.Background()
	a := newAgent(t, t.TempDir(), nil)
	ttl := mustCreate(t, a, api.CreateSandboxRequest{TTL: api.Duration(time.Second)})
	idle := mustCreate(t, a, api.CreateSandboxRequest{IdleTimeout: api.Duration(time.Second)})
	busy := mustCreate(t, a, api.CreateSandboxRequest{IdleTimeout: api.Duration(time.Second)})
	keep := mustCreate(t, a, api.CreateSandboxRequest{})
	deadline := time.Now().Add(2500 * time.Millisecond)
	for time.Now().Before(deadline) {
		a.Exec(ctx, busy.ID, api.ExecRequest{Cmd: "true"}, nil, nil)
		time.Sleep(100 * time.Millisecond)
	}
	for _, id := range []string{ttl.ID, idle.ID} {
		if _, err := a.Get(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("%s not reaped: %v", id, err)
		}
	}
	for _, id := range []string{busy.ID, keep.ID} {
		if _, err := a.Get(ctx, id); err != nil {
			t.Errorf("%s reaped too early: %v", id, err)
		}
	}
}

func TestRecover(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a := newAgent(t, dir, nil)
	sb := mustCreate(t, a, api.CreateSandboxRequest{Labels: map[string]string{"k": "v"}, Project: "research/rl"})
	dead := mustCreate(t, a, api.CreateSandboxRequest{})
	if err := a.WriteFile(ctx, sb.ID, "/state.txt", 0o644, strings.NewReader("kept")); err != nil {
		t.Fatal(err)
	}
	a.Close()

	// The agent died in the middle of a create: its record says creating.
	half := record{Sandbox: api.Sandbox{ID: "n1-bbbbbbbbbbbbbbbb", Backend: api.BackendContainer, State: api.StateCreating,
		Resources: api.Resources{CPU: 1, Memory: 64 << 20}}}
	if err := a.writeRecord(half); err != nil {
		t.Fatal(err)
	}
	// And one sandbox died while the agent was down.
	b := a.backends[api.BackendContainer]
	if err := b.Stop(ctx, dead.ID, 0); err != nil {
		t.Fatal(err)
	}

	a2 := newAgent(t, dir, nil)
	got, err := a2.Get(ctx, sb.ID)
	if err != nil || got.State != api.StateRunning || got.Labels["k"] != "v" || got.Project != "research/rl" {
		t.Fatalf("recovered sandbox = %+v, %v; want running with its labels and project", got, err)
	}
	res, err := a2.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "cat state.txt", Cwd: "/"}, nil, nil)
	if err != nil || res.Stdout != "kept" {
		t.Errorf("exec after recovery = %q, %v; want kept", res.Stdout, err)
	}
	if got, err := a2.Get(ctx, dead.ID); err != nil || got.State != api.StateFailed {
		t.Errorf("sandbox that died while down = %+v, %v; want failed", got, err)
	}
	if _, err := a2.Get(ctx, half.Sandbox.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("half-created sandbox: %v, want cleaned up", err)
	}
	if u := a2.Status().Usage; u.Sandboxes != 2 {
		t.Errorf("recovered usage = %+v, want 2 sandboxes", u)
	}
	if err := a2.Delete(ctx, dead.ID); err != nil {
		t.Errorf("delete failed sandbox: %v", err)
	}
}

func TestWatchMarksFailed(t *testing.T) {
	ctx := context.Background()
	a := newAgent(t, t.TempDir(), nil)
	sb := mustCreate(t, a, api.CreateSandboxRequest{})
	if err := a.backends[api.BackendContainer].Stop(ctx, sb.ID, 0); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, _ := a.Get(ctx, sb.ID)
		if got.State == api.StateFailed && got.Reason != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("state = %q after the init died, want failed", got.State)
		}
		time.Sleep(20 * time.Millisecond)
	}
	_, err := a.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "true"}, nil, nil)
	if !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("exec in failed sandbox: %v, want ErrConflict", err)
	}
}

func TestUnavailableBackendReported(t *testing.T) {
	dir := t.TempDir()
	b, _ := fake.New(filepath.Join(dir, "fake"), fake.Options{Name: api.BackendContainer,
		Unavailable: errdefs.Unavailable("erofs not supported")})
	a := newAgent(t, dir, func(c *Config) { c.Backends = []backend.Backend{b} })
	st := a.Status()
	if st.Healthy || len(st.Problems) != 1 || !strings.Contains(st.Problems[0], "erofs not supported") {
		t.Errorf("status = %+v, want unhealthy with the reason", st)
	}
	_, err := a.Create(context.Background(), api.CreateSandboxRequest{Image: "busybox"})
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("create on unavailable backend: %v, want ErrUnavailable", err)
	}
}

// layerImages is an Images that also resolves explicit layer stacks.
type layerImages struct{ imagetest.Images }

func (layerImages) ResolveLayers(_ context.Context, refs []string) (api.Image, error) {
	img := api.Image{Name: strings.Join(refs, "+")}
	for i := range refs {
		img.Layers = append(img.Layers, "sha256:"+strings.Repeat(string(rune('a'+i)), 64))
	}
	return img, nil
}

// TestImageDefaults: an environment's env, workdir and user become the
// sandbox's defaults; the request's env wins; the layers are listed.
func TestImageDefaults(t *testing.T) {
	ctx := context.Background()
	digest := "sha256:" + strings.Repeat("1", 64)
	imgs := layerImages{imagetest.Images{"env@1": {
		Name: "env@1", Layers: []string{digest},
		Env: map[string]string{"A": "img", "B": "img"}, Workdir: "/work", User: "nobody",
	}}}
	a := newAgent(t, t.TempDir(), func(c *Config) { c.Images = imgs })
	sb := mustCreate(t, a, api.CreateSandboxRequest{Image: "env@1", Env: map[string]string{"B": "req"}})
	if sb.Image != "env@1" || len(sb.Layers) != 1 || sb.Layers[0] != digest || sb.Workdir != "/work" || sb.User != "nobody" ||
		sb.Env["A"] != "img" || sb.Env["B"] != "req" {
		t.Fatalf("sandbox: got %+v", sb)
	}
	res, err := a.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "echo $A $B", User: "0", Cwd: "/"}, nil, nil)
	if err != nil || res.Stdout != "img req\n" {
		t.Errorf("exec env: %q, %v; want the image's A and the request's B", res.Stdout, err)
	}

	sb, err = a.Create(ctx, api.CreateSandboxRequest{Layers: []string{"base@1", "tk@2"}})
	if err != nil || sb.Image != "base@1+tk@2" || len(sb.Layers) != 2 {
		t.Fatalf("sandbox from layers: got %+v", sb)
	}
	if _, err := a.Create(ctx, api.CreateSandboxRequest{Image: "env@1", Layers: []string{"x@1"}}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("image and layers: got %v, want ErrInvalid", err)
	}
	plain := newAgent(t, t.TempDir(), nil)
	if _, err := plain.Create(ctx, api.CreateSandboxRequest{Layers: []string{"x@1"}}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("layers on a node without a resolver: got %v, want ErrInvalid", err)
	}
}
