package node

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
)

// Memory merging (KSM) for projects that turned it on (iam
// ProjectSpec.MemoryMerge). The apiserver tells the node a create's merge
// group (api.CreateSandboxRequest.MemoryMergeGroup: never the caller's
// word); the node runs merging sandboxes of one group at a time, since
// merged pages leak by write timing to everything merged with them, and
// refuses another group's (429 node_full, which placement avoids: it
// sees the group in api.Node.MemoryMerge). Sandboxes of no group never
// merge: their backend keeps them out (QEMU's mem-merge off, no opt-in
// for containers) and their seccomp filter keeps them from opting in.

// ksmDir is the host's KSM controls (Config.KSMDir).
const ksmDir = "/sys/kernel/mm/ksm"

// mergeGroupOf returns the merge group a create joins on this node:
// its request's, where the node and the backend merge and the runtime
// can (gVisor keeps its memory in a shared file KSM does not merge); else
// "" (it runs unmerged).
func (a *Agent) mergeGroupOf(b backend.Backend, req *api.CreateSandboxRequest) string {
	if req.MemoryMergeGroup == "" || a.cfg.NoMemoryMerge || req.Runtime == api.RuntimeGVisor {
		return ""
	}
	if m, ok := b.(backend.MemoryMerger); !ok || m.MemoryMerge() != nil {
		return ""
	}
	return req.MemoryMergeGroup
}

// mergeConflict says why group may not join the node now ("" if it may).
// Under a.mu.
func (a *Agent) mergeConflict(group string) string {
	if group == "" {
		return ""
	}
	for g, n := range a.merging {
		if g != group && n > 0 {
			return fmt.Sprintf("it merges the memory of another project's sandboxes (%d of merge group %s)", n, g)
		}
	}
	return ""
}

// joinMerge and leaveMerge count a merging sandbox in or out. Under a.mu.
func (a *Agent) joinMerge(group string) {
	if group == "" {
		return
	}
	if a.merging == nil {
		a.merging = map[string]int{}
	}
	a.merging[group]++
}

func (a *Agent) leaveMerge(group string) {
	if group == "" {
		return
	}
	if a.merging[group]--; a.merging[group] <= 0 {
		delete(a.merging, group)
	}
}

// startKSM turns the host's KSM on if it is off, for the first merging
// sandbox: until then no page of the host is merged. It stays on (with
// nothing opted in, ksmd has nothing to scan).
func (a *Agent) startKSM() error {
	run := filepath.Join(a.cfg.KSMDir, "run")
	b, err := os.ReadFile(run)
	if err != nil {
		return err
	}
	if strings.TrimSpace(string(b)) != "0" {
		return nil
	}
	if err := os.WriteFile(run, []byte("1"), 0); err != nil {
		return fmt.Errorf("turn KSM on: %w", err)
	}
	a.log.Info("turned the host's KSM on for a project's sandboxes that merge memory")
	return nil
}

// mergeMechanism says how the node merges memory: "ksm", or "off: WHY".
// Called once, at New (backends probe the host).
func (a *Agent) mergeMechanism() string {
	if a.cfg.NoMemoryMerge {
		return "off: turned off (--no-memory-merge)"
	}
	var why []string
	for _, name := range slices.Sorted(maps.Keys(a.backends)) {
		m, ok := a.backends[name].(backend.MemoryMerger)
		if !ok {
			continue
		}
		err := m.MemoryMerge()
		if err == nil {
			return "ksm"
		}
		why = append(why, name+": "+err.Error())
	}
	if len(why) == 0 {
		return "off: no backend here merges memory"
	}
	return "off: " + strings.Join(why, "; ")
}

// mergeStatus is api.Node.MemoryMerge. Under a.mu.
func (a *Agent) mergeStatus() *api.NodeMemoryMerge {
	st := &api.NodeMemoryMerge{Mechanism: a.mergeHow}
	for g, n := range a.merging {
		st.Group, st.Sandboxes = g, n
	}
	if n, err := readUint(filepath.Join(a.cfg.KSMDir, "pages_sharing")); err == nil {
		st.Saved = api.Quantity(n * uint64(os.Getpagesize()))
	}
	return st
}

func readUint(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, errors.New(path + ": " + err.Error())
	}
	return n, nil
}
