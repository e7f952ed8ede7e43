package container

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/image"
)

// Sweep removes what this backend holds on the host for sandboxes that
// orphan claims (the agent has no record of them) and this process does
// not know: runc's state under RuncRoot (killing the container's
// processes), the sandbox's cgroups under CgroupParent in every hierarchy
// (exec sub-cgroups included), its mounts and its directory under
// StateDir; then the layer mounts no sandbox holds any more
// (image.Mounts.Prune). It returns what it removed, one line each. Call
// it once recovery is done and before the first Create.
func (c *Container) Sweep(ctx context.Context, orphan func(id string) bool) ([]string, error) {
	hiers, herr := cgroupHierarchies()
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
	for _, h := range hiers {
		entries, _ := os.ReadDir(filepath.Join(h, c.cfg.CgroupParent))
		for _, e := range entries {
			if e.IsDir() {
				add(e.Name())
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
		r, err := c.sweepOne(ctx, id, hiers)
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
// does (runc's state says which processes and cgroups are its), then
// whatever that left, such as cgroups whose runc state is gone.
func (c *Container) sweepOne(ctx context.Context, id string, hiers []string) ([]string, error) {
	var removed []string
	runcDir := filepath.Join(c.cfg.RuncRoot, id)
	hadRunc := exists(runcDir)
	var initPid int
	if st, err := c.readRuncState(id); err == nil && (initProc{pid: st.InitPid, start: st.InitStart}).alive() {
		initPid = st.InitPid
	}
	var cgroups []string
	for _, h := range hiers {
		if p := filepath.Join(h, c.cfg.CgroupParent, id); exists(p) {
			cgroups = append(cgroups, p)
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
		if exists(cg) {
			if err := removeCgroupTree(ctx, cg); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		removed = append(removed, "cgroup "+cg)
	}
	// Mounts, deepest first (MountsUnder's order).
	for _, mp := range mounts {
		if err := unmountAll(mp); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, "mount "+mp)
	}
	if hadRunc {
		if exists(runcDir) {
			// Destroy could not make runc delete it; its init is dead
			// by now (or never was), so the state is only files.
			if err := os.RemoveAll(runcDir); err != nil {
				errs = append(errs, err)
			}
		}
		if !exists(runcDir) {
			removed = append(removed, "runc state "+runcDir)
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

// removeCgroupTree kills every process in the cgroup dir and below (a
// frozen v1 cgroup is thawed first, or its tasks would never die) and
// removes the cgroups, deepest first.
func removeCgroupTree(ctx context.Context, dir string) error {
	var dirs []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	slices.Reverse(dirs) // children before their parents
	for _, d := range dirs {
		os.WriteFile(filepath.Join(d, "cgroup.kill"), []byte("1"), 0) // v2, Linux >= 5.14
		os.WriteFile(filepath.Join(d, "freezer.state"), []byte("THAWED"), 0)
		os.WriteFile(filepath.Join(d, "cgroup.freeze"), []byte("0"), 0)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, d := range dirs {
		for {
			pids := cgroupProcs(d)
			if len(pids) == 0 {
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("cgroup %s still has processes %v", d, pids)
			}
			for _, pid := range pids {
				unix.Kill(pid, unix.SIGKILL)
			}
			time.Sleep(10 * time.Millisecond)
		}
		var err error
		for i := 0; i < 50; i++ {
			if err = unix.Rmdir(d); err == nil || errors.Is(err, unix.ENOENT) {
				err = nil
				break
			}
			if !errors.Is(err, unix.EBUSY) {
				break
			}
			time.Sleep(time.Duration(i+1) * time.Millisecond)
		}
		if err != nil {
			return fmt.Errorf("remove cgroup %s: %w", d, err)
		}
	}
	return nil
}

func cgroupProcs(dir string) []int {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// cgroupHierarchies lists the mountpoints of the host's cgroup
// hierarchies (every v1 controller's and the v2 unified one) whose root is
// the cgroup root, from /proc/self/mountinfo.
func cgroupHierarchies() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		fields, typ := strings.Fields(pre), strings.Fields(post)
		if len(fields) < 5 || len(typ) == 0 || typ[0] != "cgroup" && typ[0] != "cgroup2" || fields[3] != "/" {
			continue
		}
		if mp := fields[4]; !slices.Contains(out, mp) {
			out = append(out, mp)
		}
	}
	return out, sc.Err()
}
