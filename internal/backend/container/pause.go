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

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/cgroup"
	"github.com/warrenhq/warren/internal/errdefs"
)

var _ backend.Pauser = (*Container)(nil)

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
	if !s.init.alive() || c.created(id) {
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
	return nil
}

// paused says whether s's cgroup is frozen (by a Pause).
func (s *sandbox) paused() bool {
	if s.cg.base.Path == "" {
		return false
	}
	name, want := "freezer.state", "FROZEN"
	if s.cg.base.V2 {
		name, want = "cgroup.freeze", "1"
	}
	b, err := os.ReadFile(filepath.Join(s.cg.base.Path, name))
	return err == nil && strings.TrimSpace(string(b)) == want
}

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
	b, err := os.ReadFile(filepath.Join(d.Path, name))
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// reclaim pushes out up to n bytes charged to d and names how.
func reclaim(d cgroup.Dir, n int64) (string, error) {
	if d.V2 {
		// EAGAIN: less could go than was asked (no swap for the
		// anonymous part); what could go went.
		err := os.WriteFile(filepath.Join(d.Path, "memory.reclaim"), []byte(strconv.FormatInt(max(n, 4096), 10)), 0)
		if err != nil && !errors.Is(err, unix.EAGAIN) {
			return "", fmt.Errorf("memory.reclaim: %w", err)
		}
		return "memory.reclaim", nil
	}
	if err := os.WriteFile(filepath.Join(d.Path, "memory.force_empty"), []byte("0"), 0); err != nil {
		return "", fmt.Errorf("memory.force_empty: %w", err)
	}
	return "memory.force_empty", nil
}
