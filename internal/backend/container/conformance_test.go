package container

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/backend/backendtest"
	"github.com/warrenhq/warren/internal/testutil"
)

func TestConformance(t *testing.T) {
	h := newHarness(t)
	backendtest.Run(t, backendtest.Harness{
		New: func(t *testing.T) backend.Backend { return h.c },
		Reopen: func(t *testing.T, old backend.Backend) backend.Backend {
			h.restart()
			return h.c
		},
		Spec: func(t *testing.T, id string) backend.Spec {
			return backend.Spec{ID: id, Layers: []backend.Layer{h.layer}}
		},
		Processes: func(t *testing.T, b backend.Backend, id string) int {
			return execProcesses(t, b.(*Container), id)
		},
		Leftovers: func(t *testing.T, b backend.Backend, id string) []string {
			return leftovers(t, b.(*Container), id)
		},
	})
}

// execProcesses counts the processes in sandbox id's cgroup and its exec
// sub-cgroups, minus the init.
func execProcesses(t *testing.T, c *Container, id string) int {
	st, err := c.readRuncState(id)
	if err != nil {
		return 0 // gone, so nothing left
	}
	dir := st.CgroupPaths["pids"]
	if dir == "" {
		dir = st.CgroupPaths[""]
	}
	n := 0
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		b, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		for _, f := range strings.Fields(string(b)) {
			if pid, _ := strconv.Atoi(f); pid != st.InitPid {
				n++
			}
		}
		return nil
	})
	return n
}

// TestConformanceGVisor runs the suite against gVisor sandboxes
// (Spec.Runtime "gvisor") of the same backend, as a node sees them: with
// the runtime's capabilities, and without the interfaces the backend
// refuses them (NetNSer, PortDialer: TestGVisorSandbox checks they
// refuse).
func TestConformanceGVisor(t *testing.T) {
	h := newHarness(t)
	requireGVisor(t, h.c)
	caps, err := h.c.RuntimeCapabilities(RuntimeGVisor)
	if err != nil {
		t.Fatal(err)
	}
	view := func(c *Container) backend.Backend { return runtimeView{c, c, c, c, caps} }
	backendtest.Run(t, backendtest.Harness{
		New: func(t *testing.T) backend.Backend { return view(h.c) },
		Reopen: func(t *testing.T, old backend.Backend) backend.Backend {
			h.restart()
			return view(h.c)
		},
		Spec: func(t *testing.T, id string) backend.Spec {
			return backend.Spec{ID: id, Layers: []backend.Layer{h.layer}, Runtime: RuntimeGVisor}
		},
		Processes: func(t *testing.T, b backend.Backend, id string) int {
			procs, err := h.c.gvisorProcs(t.Context(), id)
			if err != nil {
				return 0 // gone, so nothing left
			}
			delete(procs, 1) // the init
			return len(procs)
		},
		Leftovers: func(t *testing.T, b backend.Backend, id string) []string {
			return leftovers(t, h.c, id)
		},
	})
}

// runtimeView is a backend's sandboxes of one runtime as a node sees
// them: the runtime's capabilities, and only the interfaces it honours.
type runtimeView struct {
	backend.Backend
	backend.Execer
	backend.Files
	backend.Statser
	caps backend.Capabilities
}

func (v runtimeView) Capabilities() backend.Capabilities { return v.caps }

// requireGVisor skips t unless c runs gVisor sandboxes here. A missing
// runsc fails it under WARREN_TEST_STRICT=1; runsc that cannot run here
// skips it with the probe's reason.
func requireGVisor(t *testing.T, c *Container) {
	t.Helper()
	if _, err := os.Stat(c.cfg.RunscPath); err != nil {
		testutil.Unavailable(t, "needs runsc (gVisor; Debian's runsc package): %v", err)
	}
	if err := c.GVisorAvailable(t.Context()); err != nil {
		t.Skipf("runsc cannot run here: %v", err)
	}
}
