package container

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/warrenhq/warren/internal/cgroup"
	"github.com/warrenhq/warren/internal/image"
)

// Sweep removes what this backend holds on the host for sandboxes that
// orphan claims (the agent has no record of them) and this process does
// not know: runc's state under RuncRoot or runsc's under RunscRoot
// (killing the container's processes), the sandbox's cgroups under CgroupParent in every hierarchy
// (exec sub-cgroups included), its mounts and its directory under
// StateDir; then the layer mounts no sandbox holds any more
// (image.Mounts.Prune). It returns what it removed, one line each. Call
// it once recovery is done and before the first Create.
func (c *Container) Sweep(ctx context.Context, orphan func(id string) bool) ([]string, error) {
	layout, herr := cgroup.Host()
	ids := map[string]bool{}
	add := func(name string) {
		if validID(name) == nil && orphan(name) {
			ids[name] = true
		}
	}
	for _, dir := range []string{c.sandboxDir, c.cfg.RuncRoot} {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			add(e.Name())
		}
	}
	for _, id := range runscIDs(c.cfg.RunscRoot) {
		add(id)
	}
	if layout != nil {
		for _, bestEffort := range []bool{false, true} {
			for _, parent := range layout.Paths(path.Dir(c.cgroupRel("x", bestEffort))) {
				children, _ := parent.Children("")
				for _, d := range children {
					add(filepath.Base(d.Path))
				}
			}
		}
	}
	mounts, _ := image.MountsUnder(c.sandboxDir)
	for _, mp := range mounts {
		if rel, err := filepath.Rel(c.sandboxDir, mp); err == nil && rel != "." {
			add(strings.SplitN(rel, "/", 2)[0])
		}
	}

	var removed []string
	var errs []error
	if herr != nil {
		errs = append(errs, herr)
	}
	sorted := make([]string, 0, len(ids))
	for id := range ids {
		sorted = append(sorted, id)
	}
	slices.Sort(sorted)
	for _, id := range sorted {
		c.mu.Lock()
		known := c.sandboxes[id] != nil
		c.mu.Unlock()
		if known {
			continue
		}
		r, err := c.sweepOne(ctx, id, layout)
		removed = append(removed, r...)
		if err != nil {
			errs = append(errs, fmt.Errorf("sweep sandbox %s: %w", id, err))
		}
	}

	before, _ := image.MountsUnder(c.cfg.Mounts.Dir())
	if err := c.cfg.Mounts.Prune(); err != nil {
		errs = append(errs, fmt.Errorf("sweep layer mounts: %w", err))
	}
	after, _ := image.MountsUnder(c.cfg.Mounts.Dir())
	for _, mp := range before {
		if !slices.Contains(after, mp) {
			removed = append(removed, "layer mount "+mp)
		}
	}
	return removed, errors.Join(errs...)
}

// sweepOne removes everything of one unrecorded sandbox: first as Destroy
// does (its runtime's state says which processes and cgroups are its),
// then whatever that left, such as cgroups whose runtime state is gone.
func (c *Container) sweepOne(ctx context.Context, id string, layout *cgroup.Layout) ([]string, error) {
	var removed []string
	rt := c.runtimeOf(id, nil)
	hadState := rt.hasState(id)
	var initPid int
	if st, err := c.readState(rt, id); err == nil && (initProc{pid: st.InitPid, start: st.InitStart}).alive() {
		initPid = st.InitPid
	}
	var cgroups []cgroup.Dir
	if layout != nil {
		for _, bestEffort := range []bool{false, true} {
			for _, d := range layout.Paths(c.cgroupRel(id, bestEffort)) {
				if d.Exists() {
					cgroups = append(cgroups, d)
				}
			}
		}
	}
	dir := c.dir(id)
	mounts, _ := image.MountsUnder(dir)
	hadDir := exists(dir)

	var errs []error
	if err := c.Destroy(ctx, id); err != nil {
		errs = append(errs, err) // go on by hand
	}
	if initPid > 0 {
		removed = append(removed, fmt.Sprintf("container init %d of sandbox %s (killed with its processes)", initPid, id))
	}
	// Cgroups: kill what is left in them, then remove them deepest first.
	for _, cg := range cgroups {
		if err := cg.Destroy(ctx); err != nil {
			errs = append(errs, fmt.Errorf("cgroup %s: %w", cg.Path, err))
			continue
		}
		removed = append(removed, "cgroup "+cg.Path)
	}
	// Mounts, deepest first (MountsUnder's order).
	for _, mp := range mounts {
		if err := unmountAll(mp); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, "mount "+mp)
	}
	if hadState {
		// Destroy could not make the runtime delete it; its init is
		// dead by now (or never was), so the state is only files.
		for _, p := range rt.statePaths(id) {
			if err := os.RemoveAll(p); err != nil {
				errs = append(errs, err)
			}
		}
		if !rt.hasState(id) {
			removed = append(removed, rt.name+" state "+rt.statePaths(id)[0])
		}
	}
	if hadDir {
		if exists(dir) {
			if err := c.removeDir(id); err != nil {
				errs = append(errs, err)
			}
		}
		if !exists(dir) {
			removed = append(removed, "directory "+dir)
		}
	}
	return removed, errors.Join(errs...)
}
