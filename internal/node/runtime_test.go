package node

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/backend/fake"
	"github.com/warrenhq/warren/internal/errdefs"
)

// specLog records the specs a fake backend is asked to create.
type specLog struct {
	mu    sync.Mutex
	specs map[string]backend.Spec
}

func (l *specLog) hook(_ context.Context, spec backend.Spec) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.specs[spec.ID] = spec
	return nil
}

func (l *specLog) get(id string) backend.Spec {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.specs[id]
}

// newRuntimeAgent is newAgent over a fake "container" backend with the
// runtimes runc and gvisor, gvisor failing with gvisorErr if set.
func newRuntimeAgent(t *testing.T, dir string, gvisorErr error) (*Agent, *specLog) {
	t.Helper()
	log := &specLog{specs: map[string]backend.Spec{}}
	opts := fake.Options{Name: api.BackendContainer, Runtimes: []string{api.RuntimeRunc, api.RuntimeGVisor}, CreateHook: log.hook}
	if gvisorErr != nil {
		opts.RuntimeUnavailable = map[string]error{api.RuntimeGVisor: gvisorErr}
	}
	b, err := fake.New(filepath.Join(dir, "fake"), opts)
	if err != nil {
		t.Fatal(err)
	}
	return newAgent(t, dir, func(c *Config) { c.Backends = []backend.Backend{b} }), log
}

// TestRuntimes: a create's runtime reaches the backend's spec (the
// default as ""), the sandbox says which it runs under, also after the
// agent restarts, and the node refuses what a gVisor sandbox cannot do:
// a network, its ports.
func TestRuntimes(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a, log := newRuntimeAgent(t, dir, nil)

	st := a.Status()
	want := []api.NodeRuntime{
		{Backend: api.BackendContainer, Name: api.RuntimeRunc, Available: true},
		{Backend: api.BackendContainer, Name: api.RuntimeGVisor, Available: true},
	}
	if !slices.Equal(st.Runtimes, want) || len(st.Problems) > 0 {
		t.Errorf("status: runtimes %+v, problems %q; want %+v and none", st.Runtimes, st.Problems, want)
	}

	for _, tc := range []struct{ ask, runtime, spec string }{
		{"", api.RuntimeRunc, ""},
		{api.RuntimeRunc, api.RuntimeRunc, ""},
		{api.RuntimeGVisor, api.RuntimeGVisor, api.RuntimeGVisor},
	} {
		sb := mustCreate(t, a, api.CreateSandboxRequest{Runtime: tc.ask})
		if sb.Runtime != tc.runtime || log.get(sb.ID).Runtime != tc.spec {
			t.Errorf("runtime %q: sandbox runtime %q, spec runtime %q; want %q and %q", tc.ask, sb.Runtime, log.get(sb.ID).Runtime, tc.runtime, tc.spec)
		}
	}

	gv := mustCreate(t, a, api.CreateSandboxRequest{Runtime: api.RuntimeGVisor})
	if _, err := a.Pause(ctx, gv.ID, "caller"); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	_, err := a.DialPort(ctx, gv.ID, 80)
	if !errors.Is(err, errdefs.ErrInvalid) || errdefs.Code(err) != api.CodeNotSupported || !strings.Contains(err.Error(), "gvisor") {
		t.Errorf("DialPort of a gvisor sandbox: %v (code %q), want 400 not_supported naming gvisor", err, errdefs.Code(err))
	}
	if got, _ := a.Get(ctx, gv.ID); got.State != api.StatePaused {
		t.Errorf("a paused gvisor sandbox is %s after a refused port call, want still paused", got.State)
	}
	open := api.NetworkOpen
	_, err = a.UpdateNetwork(ctx, gv.ID, api.NetworkUpdate{Mode: &open})
	if !errors.Is(err, errdefs.ErrInvalid) || errdefs.Code(err) != api.CodeNotSupported {
		t.Errorf("network update of a gvisor sandbox: %v (code %q), want 400 not_supported", err, errdefs.Code(err))
	}

	for _, tc := range []struct {
		name string
		req  api.CreateSandboxRequest
		msg  string
	}{
		{"unknown runtime", api.CreateSandboxRequest{Runtime: "kata"}, `runtime "kata"`},
		{"gvisor with a network", api.CreateSandboxRequest{Runtime: api.RuntimeGVisor, Network: &api.NetworkPolicy{Mode: api.NetworkOpen}}, "network must be none"},
		{"gvisor with an allowlist", api.CreateSandboxRequest{Runtime: api.RuntimeGVisor, Network: &api.NetworkPolicy{Allow: []string{"pypi.org"}}}, "network must be none"},
		{"a runtime of another backend", api.CreateSandboxRequest{Runtime: api.RuntimeGVisor, Backend: api.BackendMicroVM}, "backend microvm has no runtimes"},
	} {
		tc.req.Image = "busybox"
		_, err := a.Create(ctx, tc.req)
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want ErrInvalid saying %q", tc.name, err, tc.msg)
		}
	}

	a.Close()
	a2, _ := newRuntimeAgent(t, dir, nil)
	if got, err := a2.Get(ctx, gv.ID); err != nil || got.Runtime != api.RuntimeGVisor {
		t.Errorf("after a restart: %+v, %v; want runtime gvisor", got, err)
	}
}

// TestRuntimeUnavailable: a runtime the host cannot run is in the node's
// status with the reason, and a problem line; creates asking for it get
// 503 runtime_unavailable with that reason, the others go on.
func TestRuntimeUnavailable(t *testing.T) {
	ctx := context.Background()
	a, _ := newRuntimeAgent(t, t.TempDir(), errdefs.Unavailable("gvisor: /usr/bin/runsc not found"))
	st := a.Status()
	if ok, why := st.RunsRuntime(api.BackendContainer, api.RuntimeGVisor); ok || why != "/usr/bin/runsc not found" {
		t.Errorf("status runs gvisor: %v, %q; want false and the reason", ok, why)
	}
	if !st.Healthy || !slices.Contains(st.Problems, "container: runtime gvisor unavailable: /usr/bin/runsc not found") {
		t.Errorf("status: healthy %v, problems %q; want healthy with gvisor's problem", st.Healthy, st.Problems)
	}
	_, err := a.Create(ctx, api.CreateSandboxRequest{Image: "busybox", Runtime: api.RuntimeGVisor})
	if !errors.Is(err, errdefs.ErrUnavailable) || errdefs.Code(err) != api.CodeRuntimeUnavailable || !strings.Contains(err.Error(), "runsc not found") {
		t.Errorf("gvisor create: %v (code %q), want 503 runtime_unavailable saying why", err, errdefs.Code(err))
	}
	if sb := mustCreate(t, a, api.CreateSandboxRequest{}); sb.Runtime != api.RuntimeRunc {
		t.Errorf("default create: runtime %q, want runc", sb.Runtime)
	}
}

// TestNoRuntimes: a backend without runtimes takes no runtime, and its
// sandboxes name none.
func TestNoRuntimes(t *testing.T) {
	a := newAgent(t, t.TempDir(), nil)
	_, err := a.Create(context.Background(), api.CreateSandboxRequest{Image: "busybox", Runtime: api.RuntimeGVisor})
	if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "no runtimes") {
		t.Errorf("gvisor create on a backend without runtimes: %v, want ErrInvalid", err)
	}
	if sb := mustCreate(t, a, api.CreateSandboxRequest{}); sb.Runtime != "" {
		t.Errorf("sandbox of a backend without runtimes: runtime %q, want none", sb.Runtime)
	}
	if st := a.Status(); st.Runtimes != nil {
		t.Errorf("status runtimes %+v, want none", st.Runtimes)
	}
}
