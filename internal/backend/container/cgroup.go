package container

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
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
	v2   bool
	base string // the container's cgroup directory in that hierarchy
}

// execCgroupOf picks the hierarchy from the cgroup paths runc recorded.
func execCgroupOf(paths map[string]string) (execCgroup, error) {
	if p, ok := paths["freezer"]; ok {
		return execCgroup{base: p}, nil
	}
	if p, ok := paths[""]; ok && len(paths) == 1 {
		return execCgroup{v2: true, base: p}, nil
	}
	return execCgroup{}, fmt.Errorf("no freezer cgroup (v1) or unified cgroup (v2) among %v", paths)
}

// runcArg is the `runc exec --cgroup` value that puts the process in sub.
func (cg execCgroup) runcArg(sub string) string {
	if cg.v2 {
		return sub
	}
	return "freezer:" + sub
}

func (cg execCgroup) path(sub string) string { return filepath.Join(cg.base, sub) }

// create makes the sub-cgroup sub.
func (cg execCgroup) create(sub string) error {
	if err := os.Mkdir(cg.path(sub), 0o755); err != nil {
		return fmt.Errorf("exec cgroup: %w", err)
	}
	return nil
}

// subs lists the exec sub-cgroups that exist.
func (cg execCgroup) subs() ([]string, error) {
	entries, err := os.ReadDir(cg.base)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), execPrefix) {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

const execPrefix = "exec-"

// procs lists the pids in sub. A missing cgroup has none.
func (cg execCgroup) procs(sub string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(cg.path(sub), "cgroup.procs"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// freeze stops (or with false resumes) every process in sub and waits
// until the kernel reports it frozen.
func (cg execCgroup) freeze(ctx context.Context, sub string, on bool) error {
	file, value, done := "freezer.state", "THAWED", "THAWED"
	if on {
		value, done = "FROZEN", "FROZEN"
	}
	if cg.v2 {
		file, value, done = "cgroup.freeze", "0", "frozen 0"
		if on {
			value, done = "1", "frozen 1"
		}
	}
	dir := cg.path(sub)
	if err := os.WriteFile(filepath.Join(dir, file), []byte(value), 0); err != nil {
		return err
	}
	state := filepath.Join(dir, "freezer.state")
	if cg.v2 {
		state = filepath.Join(dir, "cgroup.events")
	}
	for d := 100 * time.Microsecond; ; d = min(2*d, 10*time.Millisecond) {
		b, err := os.ReadFile(state)
		if err != nil {
			return err
		}
		if strings.Contains(string(b), done) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
		}
	}
}

// kill SIGKILLs every process in sub, including ones forked meanwhile, and
// returns once sub is empty. v2 uses cgroup.kill (Linux >= 5.14); v1, and
// v2 without it, freeze the cgroup so nothing can fork while its members
// are listed and killed.
func (cg execCgroup) kill(ctx context.Context, sub string) error {
	if cg.v2 {
		err := os.WriteFile(filepath.Join(cg.path(sub), "cgroup.kill"), []byte("1"), 0)
		if err == nil || errors.Is(err, os.ErrNotExist) && !exists(cg.path(sub)) {
			return cg.waitEmpty(ctx, sub)
		}
	}
	for d := time.Millisecond; ; d = min(2*d, 20*time.Millisecond) {
		pids, err := cg.procs(sub)
		if err != nil || len(pids) == 0 {
			return err
		}
		if err := cg.freeze(ctx, sub, true); err != nil {
			return fmt.Errorf("freeze exec cgroup: %w", err)
		}
		pids, err = cg.procs(sub)
		if err != nil {
			return err
		}
		for _, pid := range pids {
			unix.Kill(pid, unix.SIGKILL)
		}
		// Frozen tasks die when thawed.
		if err := cg.freeze(ctx, sub, false); err != nil {
			return fmt.Errorf("thaw exec cgroup: %w", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
		}
	}
}

// waitEmpty polls until sub has no process.
func (cg execCgroup) waitEmpty(ctx context.Context, sub string) error {
	for d := 100 * time.Microsecond; ; d = min(2*d, 20*time.Millisecond) {
		pids, err := cg.procs(sub)
		if err != nil || len(pids) == 0 {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("exec cgroup %s still has %v: %w", sub, pids, ctx.Err())
		case <-time.After(d):
		}
	}
}

// evacuate moves what an exec left running in sub (daemons it started in
// the background) into the container's own cgroup, where they live on like
// any other process of the sandbox. The sub-cgroup is frozen meanwhile so
// that nothing forks into it behind our back; a task moved out of a frozen
// cgroup into a thawed one is thawed by the move.
func (cg execCgroup) evacuate(ctx context.Context, sub string) error {
	pids, err := cg.procs(sub)
	if err != nil || len(pids) == 0 {
		return err
	}
	if err := cg.freeze(ctx, sub, true); err != nil {
		return fmt.Errorf("freeze exec cgroup: %w", err)
	}
	dst := filepath.Join(cg.base, "cgroup.procs")
	for {
		pids, err := cg.procs(sub)
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			break
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
	return cg.freeze(ctx, sub, false)
}

// remove deletes sub, which must be empty. A missing sub is not an error.
// rmdir can fail with EBUSY for a moment while the last killed task
// finishes exiting, so it retries briefly.
func (cg execCgroup) remove(sub string) error {
	var err error
	for i := 0; i < 50; i++ {
		err = unix.Rmdir(cg.path(sub))
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			break
		}
		time.Sleep(time.Duration(i+1) * time.Millisecond)
	}
	return fmt.Errorf("remove exec cgroup %s: %w", cg.path(sub), err)
}

// cleanup kills and removes every exec sub-cgroup, such as those left by an
// agent that died during an exec.
func (cg execCgroup) cleanup(ctx context.Context) error {
	subs, err := cg.subs()
	if err != nil {
		return err
	}
	var errs []error
	for _, sub := range subs {
		if err := cg.kill(ctx, sub); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := cg.remove(sub); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeCgroups removes a container's cgroup directories that runc left,
// deepest first: its exec sub-cgroups are gone by now. Missing ones are
// fine.
func removeCgroups(paths map[string]string) error {
	var errs []error
	for _, p := range paths {
		if err := unix.Rmdir(p); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// cgroupV1WithoutSwap reports a cgroup v1 memory hierarchy without swap
// accounting, where runc cannot set memory+swap limits.
func cgroupV1WithoutSwap() bool {
	var st unix.Statfs_t
	if unix.Statfs("/sys/fs/cgroup", &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
		return false
	}
	if !exists("/sys/fs/cgroup/memory") {
		return false
	}
	return !exists("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes")
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}
