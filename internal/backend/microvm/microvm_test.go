package microvm

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/backend/backendtest"
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
		kernel = DefaultKernel
	}
	if _, err := os.Stat(kernel); err != nil {
		testutil.Unavailable(t, "needs a guest kernel: set %s or run scripts/fetch-guest-kernel (%v)", testutil.GuestKernelEnv, err)
	}
	h := &harness{t: t, layer: imagetest.BusyboxLayer(t)}
	h.cfg = Config{StateDir: t.TempDir(), Kernel: kernel, GuestAgent: testutil.GuestAgent(t),
		CgroupParent: "/warren-test/vm-" + filepath.Base(t.TempDir())}
	h.m = h.reopen()
	if err := h.m.Available(context.Background()); err != nil {
		t.Fatalf("microvm unavailable: %v", err)
	}
	accel, why := h.m.Accel()
	t.Logf("accelerator %s: %s", accel, why)
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
