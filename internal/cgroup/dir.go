package cgroup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Dir is one cgroup: its directory in one hierarchy, and whether that is
// the unified (v2) one. Freezing needs the v1 freezer hierarchy or v2;
// killing works in any hierarchy (it freezes where it can).
type Dir struct {
	Path string
	V2   bool
}

// Child is the cgroup name below d.
func (d Dir) Child(name string) Dir { return Dir{Path: filepath.Join(d.Path, name), V2: d.V2} }

// Exists reports whether d's directory exists.
func (d Dir) Exists() bool {
	_, err := os.Lstat(d.Path)
	return err == nil
}

// Mkdir makes d (not its parents).
func (d Dir) Mkdir() error {
	if err := os.Mkdir(d.Path, 0o755); err != nil {
		return fmt.Errorf("cgroup: %w", err)
	}
	return nil
}

// Children lists the cgroups directly below d whose names start with
// prefix ("" for all). A missing d has none.
func (d Dir) Children(prefix string) ([]Dir, error) {
	entries, err := os.ReadDir(d.Path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Dir
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), prefix) {
			out = append(out, d.Child(e.Name()))
		}
	}
	return out, nil
}

// Tree is d and every cgroup below it, parents before children. A missing
// d has none.
func (d Dir) Tree() ([]Dir, error) {
	if !d.Exists() {
		return nil, nil
	}
	out := []Dir{d}
	for i := 0; i < len(out); i++ {
		kids, err := out[i].Children("")
		if err != nil {
			return out, err
		}
		out = append(out, kids...)
	}
	return out, nil
}

// Procs lists the processes in d itself. A missing cgroup has none.
func (d Dir) Procs() ([]int, error) {
	b, err := os.ReadFile(filepath.Join(d.Path, "cgroup.procs"))
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ENODEV) {
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

// TreeProcs lists the processes in d and below.
func (d Dir) TreeProcs() ([]int, error) {
	tree, err := d.Tree()
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, c := range tree {
		p, err := c.Procs()
		if err != nil {
			return nil, err
		}
		pids = append(pids, p...)
	}
	return pids, nil
}

// Join moves process pid into d.
func (d Dir) Join(pid int) error {
	return os.WriteFile(filepath.Join(d.Path, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0)
}

// CanFreeze reports whether d can be frozen: a v1 freezer cgroup or any v2
// one (cgroup.freeze is a core file, Linux >= 5.2).
func (d Dir) CanFreeze() bool {
	name := "freezer.state"
	if d.V2 {
		name = "cgroup.freeze"
	}
	_, err := os.Stat(filepath.Join(d.Path, name))
	return err == nil
}

// Frozen says whether d itself is frozen (its own freeze, as Freeze sets
// it; not one inherited from a parent).
func (d Dir) Frozen() bool {
	name, want := "freezer.state", "FROZEN"
	if d.V2 {
		name, want = "cgroup.freeze", "1"
	}
	b, err := os.ReadFile(filepath.Join(d.Path, name))
	return err == nil && strings.TrimSpace(string(b)) == want
}

// Freeze stops every process in d and below, and waits until the kernel
// says they are. If ctx ends first, d is thawed again before Freeze
// returns: a failed freeze never leaves a cgroup frozen.
func (d Dir) Freeze(ctx context.Context) error {
	if err := d.setFrozen(ctx, true); err != nil {
		terr := d.setFrozen(context.WithoutCancel(ctx), false)
		return errors.Join(fmt.Errorf("freeze cgroup %s: %w", d.Path, err), terr)
	}
	return nil
}

// Thaw resumes d. A missing d is thawed, and so is one being removed
// meanwhile (its files answer ENODEV once the kernel has begun removing
// it, which can be before its directory is gone).
func (d Dir) Thaw(ctx context.Context) error {
	if err := d.setFrozen(ctx, false); err != nil && !errors.Is(err, unix.ENODEV) && d.Exists() {
		return fmt.Errorf("thaw cgroup %s: %w", d.Path, err)
	}
	return nil
}

// ThawTree thaws d and every cgroup below it (each can be frozen on its
// own), parents first.
func (d Dir) ThawTree(ctx context.Context) error {
	tree, err := d.Tree()
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	for _, c := range tree {
		if c.CanFreeze() {
			if err := c.Thaw(ctx); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// thawWait bounds how long a thaw waits for the kernel to report it:
// thawing never blocks on the tasks, so this is only a backstop.
const thawWait = 5 * time.Second

func (d Dir) setFrozen(ctx context.Context, on bool) error {
	file, value, state, done := "freezer.state", "THAWED", "freezer.state", "THAWED"
	if on {
		value, done = "FROZEN", "FROZEN"
	}
	if d.V2 {
		file, value, state, done = "cgroup.freeze", "0", "cgroup.events", "frozen 0"
		if on {
			value, done = "1", "frozen 1"
		}
	}
	if err := os.WriteFile(filepath.Join(d.Path, file), []byte(value), 0); err != nil {
		return err
	}
	if !on {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), thawWait)
		defer cancel()
	}
	for wait := 100 * time.Microsecond; ; wait = min(2*wait, 10*time.Millisecond) {
		b, err := os.ReadFile(filepath.Join(d.Path, state))
		if err != nil {
			return err
		}
		if strings.Contains(string(b), done) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// freezeTry bounds one attempt to freeze a tree before killing it: a v1
// freezer can stay FREEZING while a task sleeps uninterruptibly, and the
// kill goes ahead regardless.
const freezeTry = 500 * time.Millisecond

// Kill SIGKILLs every process in d and below, including ones forked
// meanwhile, and returns once none is left or ctx ends. v2 uses
// cgroup.kill (Linux >= 5.14), which kills the subtree atomically; v1,
// and v2 without it, freeze the tree where they can so that nothing forks
// while its members are listed and killed, then always thaw it (frozen
// tasks die only once thawed). Stopped, frozen and uninterruptibly
// sleeping processes all end: SIGKILL ends the first two, and the last at
// their next return from the kernel. A missing d is not an error.
func (d Dir) Kill(ctx context.Context) error {
	if !d.Exists() {
		return nil
	}
	if d.V2 {
		err := os.WriteFile(filepath.Join(d.Path, "cgroup.kill"), []byte("1"), 0)
		if err == nil {
			// A tree frozen by an ancestor or itself keeps its
			// killed tasks until thawed.
			_ = d.ThawTree(ctx)
			return d.WaitEmpty(ctx)
		}
		if !d.Exists() {
			return nil
		}
	}
	freezable := d.CanFreeze()
	for wait := time.Millisecond; ; wait = min(2*wait, 20*time.Millisecond) {
		pids, err := d.TreeProcs()
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		if freezable {
			fctx, cancel := context.WithTimeout(ctx, freezeTry)
			_ = d.setFrozen(fctx, true) // best effort: kill regardless
			cancel()
			if pids, err = d.TreeProcs(); err != nil {
				_ = d.ThawTree(ctx)
				return err
			}
		}
		for _, pid := range pids {
			unix.Kill(pid, unix.SIGKILL)
		}
		if freezable {
			if err := d.ThawTree(ctx); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			pids, _ := d.TreeProcs()
			return fmt.Errorf("kill cgroup %s: %v still there: %w", d.Path, pids, ctx.Err())
		case <-time.After(wait):
		}
	}
}

// WaitEmpty polls until no process is left in d and below.
func (d Dir) WaitEmpty(ctx context.Context) error {
	for wait := 100 * time.Microsecond; ; wait = min(2*wait, 20*time.Millisecond) {
		pids, err := d.TreeProcs()
		if err != nil || len(pids) == 0 {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cgroup %s still has %v: %w", d.Path, pids, ctx.Err())
		case <-time.After(wait):
		}
	}
}

// Remove deletes d, which must be empty and have no children. A missing d
// is not an error. rmdir fails with EBUSY for a moment while the last
// killed task finishes exiting, so it retries, for about a second.
func (d Dir) Remove() error {
	var err error
	for i := 0; i < 45; i++ {
		err = unix.Rmdir(d.Path)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			break
		}
		time.Sleep(time.Duration(i+1) * time.Millisecond)
	}
	return fmt.Errorf("remove cgroup %s: %w", d.Path, err)
}

// RemoveTree deletes d and every cgroup below it, children first. They
// must be empty.
func (d Dir) RemoveTree() error {
	tree, err := d.Tree()
	if err != nil {
		return err
	}
	var errs []error
	for _, c := range slices.Backward(tree) {
		if err := c.Remove(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Destroy leaves nothing of d: it thaws the tree, kills every process in
// it and removes it, children first. What a start-up sweep calls on each
// of Layout.Paths.
func (d Dir) Destroy(ctx context.Context) error {
	if !d.Exists() {
		return nil
	}
	if err := d.ThawTree(ctx); err != nil {
		return err
	}
	if err := d.Kill(ctx); err != nil {
		return err
	}
	return d.RemoveTree()
}

// EnableControllers makes rel (a path below the cgroup2 mount root, such
// as "/warren/n1/fn") with its missing parents, and enables ctrls in the
// cgroup.subtree_control of root and of every level down to rel
// included, so that rel's children get them. Controllers already enabled
// are not written again. ErrNotExist-wrapped if one is not offered.
func EnableControllers(root, rel string, ctrls ...string) error {
	dir := root
	parts := strings.Split(strings.Trim(rel, "/"), "/")
	if rel == "" || rel == "/" {
		parts = nil
	}
	for i := 0; ; i++ {
		if err := enable(dir, ctrls); err != nil {
			return err
		}
		if i == len(parts) {
			return nil
		}
		dir = filepath.Join(dir, parts[i])
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("cgroup: %w", err)
		}
	}
}

func enable(dir string, ctrls []string) error {
	path := filepath.Join(dir, "cgroup.subtree_control")
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("cgroup: %w", err)
	}
	have := strings.Fields(string(b))
	for _, c := range ctrls {
		if slices.Contains(have, c) {
			continue
		}
		if err := os.WriteFile(path, []byte("+"+c), 0); err != nil {
			return fmt.Errorf("enable %s controller in %s: %w", c, dir, err)
		}
	}
	return nil
}
