package container

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/backend/backendtest"
)

func TestConformance(t *testing.T) {
	h := newHarness(t)
	backendtest.Run(t, backendtest.Harness{
		New: func(t *testing.T) backend.Backend { return h.c },
		Reopen: func(t *testing.T, old backend.Backend) backend.Backend {
			h.c = h.newContainer()
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
