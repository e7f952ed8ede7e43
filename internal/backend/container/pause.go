package container

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/cgroup"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/qos"
)

var (
	_ backend.Pauser    = (*Container)(nil)
	_ backend.Reclaimer = (*Container)(nil)
)

// Reclaim pushes out the memory charged to a running sandbox's cgroup,
// as Pause does after it freezes it (reclaim), without freezing it: its
// page cache, and its anonymous memory where the node swaps (on cgroup
// v2, where runc forbids a running sandbox swap, its page cache only).
func (c *Container) Reclaim(ctx context.Context, id string) (backend.ReclaimStats, error) {
	s, err := c.get(id)
	if err != nil {
		return backend.ReclaimStats{}, err
	}
	if !s.init.alive() || c.created(s) {
		return backend.ReclaimStats{}, errdefs.New(errdefs.ErrConflict, "sandbox_not_running", "reclaim %s: sandbox is not running", id)
	}
	mem, ok := memDir(s.cgPath)
	if !ok {
		return backend.ReclaimStats{}, errdefs.Unavailable("reclaim %s: no memory cgroup", id)
	}
	st := backend.ReclaimStats{Before: charged(mem)}
	// Idle reclaim is background work: the kernel does it on the
	// writer's time, so the writer is an idle thread.
	err = qos.RunIdle(func() (err error) {
		st.How, err = reclaim(mem, st.Before)
		return err
	})
	if err != nil {
		return backend.ReclaimStats{}, fmt.Errorf("reclaim %s: %w", id, err)
	}
	st.After = charged(mem)
	return st, nil
}

// Pause freezes the container's cgroup (its init, every exec and what
// they started), then reclaims the memory charged to it: cgroup v2's
// memory.reclaim, v1's memory.force_empty. What goes depends on the
// node: file pages (the page cache of the sandbox's files) always,
// anonymous memory only where the node swaps (to a disk, to zram, through
// zswap). Nothing of the sandbox runs until Resume: its cgroup stays
// frozen across an agent restart, and Recover reports it paused.
func (c *Container) Pause(ctx context.Context, id string) (backend.PauseStats, error) {
	s, err := c.get(id)
	if err != nil {
		return backend.PauseStats{}, err
	}
	if !s.init.alive() || c.created(s) {
		return backend.PauseStats{}, errdefs.New(errdefs.ErrConflict, "sandbox_not_running", "pause %s: sandbox is not running", id)
	}
	s.freezeMu.Lock() // not while a snapshot freezes it: that would thaw it
	defer s.freezeMu.Unlock()
	var st backend.PauseStats
	mem, hasMem := memDir(s.cgPath)
	if hasMem {
		st.Before = charged(mem)
	}
	start := time.Now()
	if err := s.cg.base.Freeze(ctx); err != nil {
		return backend.PauseStats{}, fmt.Errorf("pause %s: %w", id, err)
	}
	st.Freeze = time.Since(start)
	st.After = st.Before
	if !hasMem {
		st.Reclaim = "none: no memory cgroup"
		return st, nil
	}
	if mem.V2 {
		// runc set memory.swap.max to 0 (a running sandbox swaps
		// nothing): let the reclaim swap it out, until Resume.
		c.allowSwap(id, mem)
	}
	st.Reclaim, err = reclaim(mem, st.Before)
	if err != nil {
		// Frozen all the same: a pause that keeps memory is a pause.
		st.Reclaim = "none: " + err.Error()
	}
	st.After = charged(mem)
	return st, nil
}

// Resume thaws the container's cgroups, every level of them.
func (c *Container) Resume(ctx context.Context, id string) error {
	s, err := c.get(id)
	if err != nil {
		return err
	}
	s.freezeMu.Lock()
	defer s.freezeMu.Unlock()
	if err := s.cg.base.ThawTree(ctx); err != nil {
		return fmt.Errorf("resume %s: %w", id, err)
	}
	if mem, ok := memDir(s.cgPath); ok && mem.V2 {
		c.restoreSwap(id, mem)
	}
	return nil
}

// allowSwap lets v2 cgroup mem swap without bound, keeping its limit in
// the sandbox's directory for restoreSwap (a new agent process finds it
// there too).
func (c *Container) allowSwap(id string, mem cgroup.Dir) {
	f := filepath.Join(mem.Path, "memory.swap.max")
	old, err := os.ReadFile(f)
	if err != nil {
		return // no swap controller: nothing to lift
	}
	keep := filepath.Join(c.dir(id), "paused-swap-max")
	if _, err := os.Stat(keep); errors.Is(err, os.ErrNotExist) {
		if err := os.WriteFile(keep, old, 0o600); err != nil {
			return
		}
	}
	os.WriteFile(f, []byte("max"), 0)
}

// restoreSwap puts back the swap limit allowSwap lifted. Pages swapped
// out stay out until touched; the limit only stops new ones.
func (c *Container) restoreSwap(id string, mem cgroup.Dir) {
	keep := filepath.Join(c.dir(id), "paused-swap-max")
	old, err := os.ReadFile(keep)
	if err != nil {
		return
	}
	if err := os.WriteFile(filepath.Join(mem.Path, "memory.swap.max"), old, 0); err == nil {
		os.Remove(keep)
	}
}

// paused says whether s's cgroup is frozen (by a Pause).
func (s *sandbox) paused() bool { return s.cg.base.Path != "" && s.cg.base.Frozen() }

// memDir is the container's memory cgroup: v1's memory hierarchy, or
// its one v2 cgroup.
func memDir(paths map[string]string) (cgroup.Dir, bool) {
	if p, ok := paths["memory"]; ok {
		return cgroup.Dir{Path: p}, true
	}
	if p, ok := paths[""]; ok {
		return cgroup.Dir{Path: p, V2: true}, true
	}
	return cgroup.Dir{}, false
}

// charged is the memory charged to d (bytes), 0 if unknown.
func charged(d cgroup.Dir) int64 {
	name := "memory.usage_in_bytes"
	if d.V2 {
		name = "memory.current"
	}
	f, err := cgroup.Open(d.Path, name, unix.O_RDONLY)
	if err != nil {
		return 0
	}
	defer f.Close()
	n, _ := f.ReadInt()
	return n
}

// reclaim pushes out up to n bytes charged to d and names how. Through
// cgroup.File, not os.WriteFile: Go's poller takes a write's EAGAIN as
// "would block" and waits for the file to become writable, which
// memory.reclaim answering EAGAIN (not all of it could go) never does.
func reclaim(d cgroup.Dir, n int64) (string, error) {
	name, value := "memory.force_empty", int64(0)
	if d.V2 {
		name, value = "memory.reclaim", max(n, 4096)
	}
	f, err := cgroup.Open(d.Path, name, unix.O_WRONLY)
	if err != nil {
		return "", err
	}
	defer f.Close()
	// EAGAIN from memory.reclaim: less could go than was asked (no swap
	// for the anonymous part); what could go went.
	if err := f.WriteInt(value); err != nil && !(d.V2 && errors.Is(err, unix.EAGAIN)) {
		return "", fmt.Errorf("%s: %w", name, err)
	}
	return name, nil
}
