package container

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/cgroup"
)

// execCgroup is where a sandbox's exec sub-cgroups go: a child of the
// container's cgroup in one hierarchy. On cgroup v1 that is the freezer
// hierarchy, which can stop a tree from forking while it is killed; on v2
// it is the unified hierarchy, whose cgroup.kill kills a whole subtree
// atomically. No controller is enabled in the child, so v2's "no internal
// processes" rule does not apply to the container's cgroup.
//
// Pids and memory limits stay on the container's cgroup; an exec's
// processes count against them as before.
type execCgroup struct {
	base cgroup.Dir // the container's cgroup in that hierarchy
}

// execCgroupOf picks the hierarchy from the cgroup paths runc recorded.
func execCgroupOf(paths map[string]string) (execCgroup, error) {
	if p, ok := paths["freezer"]; ok {
		return execCgroup{base: cgroup.Dir{Path: p}}, nil
	}
	if p, ok := paths[""]; ok && len(paths) == 1 {
		return execCgroup{base: cgroup.Dir{Path: p, V2: true}}, nil
	}
	return execCgroup{}, fmt.Errorf("no freezer cgroup (v1) or unified cgroup (v2) among %v", paths)
}

// runcArg is the `runc exec --cgroup` value that puts the process in sub.
func (cg execCgroup) runcArg(sub string) string {
	if cg.base.V2 {
		return sub
	}
	return "freezer:" + sub
}

func (cg execCgroup) sub(name string) cgroup.Dir { return cg.base.Child(name) }

func (cg execCgroup) path(sub string) string { return cg.sub(sub).Path }

// create makes the sub-cgroup sub.
func (cg execCgroup) create(sub string) error {
	if err := cg.sub(sub).Mkdir(); err != nil {
		return fmt.Errorf("exec %w", err)
	}
	return nil
}

const execPrefix = "exec-"

// procs lists the pids in sub. A missing cgroup has none.
func (cg execCgroup) procs(sub string) ([]int, error) { return cg.sub(sub).Procs() }

// kill SIGKILLs every process in sub, including ones forked meanwhile and
// ones stopped, frozen or sleeping uninterruptibly, and returns once sub is
// empty; sub is never left frozen.
func (cg execCgroup) kill(ctx context.Context, sub string) error { return cg.sub(sub).Kill(ctx) }

// evacuate moves what an exec left running in sub (daemons it started in
// the background) into the container's own cgroup, where they live on like
// any other process of the sandbox. The sub-cgroup is frozen meanwhile so
// that nothing forks into it behind our back; a task moved out of a frozen
// cgroup into a thawed one is thawed by the move. Whatever happens, sub is
// thawed before evacuate returns.
func (cg execCgroup) evacuate(ctx context.Context, sub string) (err error) {
	d := cg.sub(sub)
	pids, err := d.Procs()
	if err != nil || len(pids) == 0 {
		return err
	}
	if err := d.Freeze(ctx); err != nil {
		return err
	}
	defer func() {
		if terr := d.Thaw(ctx); terr != nil {
			err = errors.Join(err, terr)
		}
	}()
	dst := filepath.Join(cg.base.Path, "cgroup.procs")
	for {
		pids, err := d.Procs()
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			err := os.WriteFile(dst, []byte(strconv.Itoa(pid)), 0)
			if err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("move %d out of exec cgroup: %w", pid, err)
			}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// remove deletes sub, which must be empty. A missing sub is not an error.
func (cg execCgroup) remove(sub string) error { return cg.sub(sub).Remove() }

// cleanup kills and removes every exec sub-cgroup, such as those left by an
// agent that died during an exec.
func (cg execCgroup) cleanup(ctx context.Context) error {
	subs, err := cg.base.Children(execPrefix)
	if err != nil {
		return err
	}
	var errs []error
	for _, sub := range subs {
		if err := sub.Destroy(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// thawAll thaws the container's cgroups in every hierarchy that freezes
// (its own and its exec sub-cgroups, each of which may have been left
// frozen): a frozen task does not die of SIGKILL until thawed, so a delete
// thaws first.
func thawAll(ctx context.Context, paths map[string]string) error {
	var errs []error
	for ctrl, p := range paths {
		if ctrl != "freezer" && ctrl != "" {
			continue
		}
		d := cgroup.Dir{Path: p, V2: ctrl == ""}
		if err := d.ThawTree(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeCgroups removes a container's cgroup directories that runc left,
// children first: its exec sub-cgroups are gone by now, but a v2 container
// may have made cgroups of its own. Missing ones are fine.
func removeCgroups(paths map[string]string) error {
	var errs []error
	for ctrl, p := range paths {
		d := cgroup.Dir{Path: p, V2: ctrl == ""}
		if err := d.RemoveTree(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// cgroupV1WithoutSwap reports a cgroup v1 memory hierarchy without swap
// accounting, where runc cannot set memory+swap limits.
func cgroupV1WithoutSwap() bool {
	l, err := cgroup.Host()
	if err != nil || l.Mode == cgroup.Unified {
		return false
	}
	dir, ok := l.V1Dir("memory", "/")
	if !ok {
		return false
	}
	return !exists(filepath.Join(dir, "memory.memsw.limit_in_bytes"))
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// subs lists the names of the exec sub-cgroups that exist.
func (cg execCgroup) subs() ([]string, error) {
	dirs, err := cg.base.Children(execPrefix)
	var names []string
	for _, d := range dirs {
		names = append(names, filepath.Base(d.Path))
	}
	return names, err
}
