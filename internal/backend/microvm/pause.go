package microvm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/qemu"
)

// A paused microVM holds no memory and no process: Pause stops the
// machine, saves its whole state (RAM and devices, as QEMU migrates it)
// to stateFile and ends QEMU; Resume starts QEMU again from that file
// (-incoming) and lets the machine run on where it stopped. The guest
// sees a session end and a new one begin on its port, nothing else; its
// clock jumps.
const (
	pausedFile = "paused" // the pause's PauseStats, JSON
	stateFile  = "state.bin"
)

var _ backend.Pauser = (*MicroVM)(nil)

// Pause implements backend.Pauser.
func (m *MicroVM) Pause(ctx context.Context, id string) (backend.PauseStats, error) {
	var ps backend.PauseStats
	s, err := m.get(id)
	if err != nil {
		return ps, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if exists(filepath.Join(s.dir, pausedFile)) {
		return ps, nil
	}
	p := s.proc
	if p == nil || !p.running() {
		return ps, errdefs.New(errdefs.ErrConflict, "sandbox_not_running", "pause %s: sandbox is not running", id)
	}
	ps.Before = m.charged(id)
	q, err := qemu.DialQMP(ctx, filepath.Join(s.dir, qmpSock))
	if err != nil {
		return ps, fmt.Errorf("pause %s: %w", id, err)
	}
	defer q.Close()
	// The session ends first, and QEMU must have seen it end (and told
	// the guest, whose port then reads end of file) before the machine
	// is saved: a guest saved in the middle of a session would wait for
	// the rest of it after the restore.
	s.guest.close()
	if err := waitDisconnected(ctx, q, "port0"); err != nil {
		return ps, fmt.Errorf("pause %s: %w", id, err)
	}
	start := time.Now()
	if err := q.Execute(ctx, "stop", nil, nil); err != nil {
		return ps, fmt.Errorf("pause %s: %w", id, err)
	}
	ps.Freeze = time.Since(start)
	state := filepath.Join(s.dir, stateFile)
	if err := migrate(ctx, q, "exec:cat > "+shellQuote(state)); err != nil {
		q.Execute(context.WithoutCancel(ctx), "cont", nil, nil) // it runs on, unpaused
		os.Remove(state)
		return ps, fmt.Errorf("pause %s: save the machine: %w", id, err)
	}
	size := fileSize(state)
	if err := writeJSON(filepath.Join(s.dir, pausedFile), ps); err != nil {
		q.Execute(context.WithoutCancel(ctx), "cont", nil, nil)
		return ps, err
	}
	q.Quit(ctx)
	select {
	case <-p.done:
	case <-time.After(killWait):
		p.kill()
		<-p.done
	}
	s.proc = nil
	s.guest.close()
	m.removeCgroup(id)
	os.Remove(filepath.Join(s.dir, pidFile))
	ps.After = 0
	ps.Reclaim = fmt.Sprintf("machine state saved to disk (%d MiB), QEMU ended", size>>20)
	writeJSON(filepath.Join(s.dir, pausedFile), ps)
	return ps, nil
}

// waitDisconnected waits until QEMU's chardev label has no client.
func waitDisconnected(ctx context.Context, q *qemu.QMP, label string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		var devs []struct {
			Label    string `json:"label"`
			Filename string `json:"filename"`
		}
		if err := q.Execute(ctx, "query-chardev", nil, &devs); err != nil {
			return err
		}
		for _, d := range devs {
			if d.Label == label && strings.HasPrefix(d.Filename, "disconnected:") {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the agent channel stays connected: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// migrate runs a QMP migration to uri and waits for it to complete.
func migrate(ctx context.Context, q *qemu.QMP, uri string) error {
	if err := q.Execute(ctx, "migrate", map[string]any{"uri": uri}, nil); err != nil {
		return err
	}
	for {
		var st struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		if err := q.Execute(ctx, "query-migrate", nil, &st); err != nil {
			return err
		}
		switch st.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("migration %s: %s", st.Status, st.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			q.Execute(context.WithoutCancel(ctx), "migrate_cancel", nil, nil)
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Resume implements backend.Pauser.
func (m *MicroVM) Resume(ctx context.Context, id string) error {
	s, err := m.get(id)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !exists(filepath.Join(s.dir, pausedFile)) {
		if s.proc != nil && s.proc.running() {
			return nil
		}
		return errdefs.New(errdefs.ErrConflict, "sandbox_not_running", "resume %s: sandbox is not paused", id)
	}
	state := filepath.Join(s.dir, stateFile)
	if err := m.boot(ctx, s, true); err != nil {
		return fmt.Errorf("resume %s: %w", id, err)
	}
	err = func() error {
		q, err := qemu.DialQMP(ctx, filepath.Join(s.dir, qmpSock))
		if err != nil {
			return err
		}
		defer q.Close()
		if err := q.Execute(ctx, "migrate-incoming", map[string]any{"uri": "exec:cat " + shellQuote(state)}, nil); err != nil {
			return err
		}
		for {
			st, err := q.Status(ctx)
			if err != nil {
				return err
			}
			if st == "paused" || st == "postmigrate" {
				break
			}
			if st != "inmigrate" && st != "prelaunch" {
				return fmt.Errorf("machine state %q while restoring", st)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
		return q.Execute(ctx, "cont", nil, nil)
	}()
	if err != nil {
		m.kill(s)
		os.Remove(filepath.Join(s.dir, stoppedFile)) // still paused: the state file is intact
		return fmt.Errorf("resume %s: restore the machine: %w", id, err)
	}
	os.Remove(filepath.Join(s.dir, pausedFile))
	os.Remove(state)
	return nil
}

// charged is the memory QEMU of sandbox id holds, as its host cgroup
// counts it (0 if unknown).
func (m *MicroVM) charged(id string) int64 {
	for _, d := range m.cgroupPaths(id) {
		for _, f := range []string{"memory.current", "memory.usage_in_bytes"} {
			if b, err := os.ReadFile(filepath.Join(d.Path, f)); err == nil {
				n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
				return n
			}
		}
	}
	return 0
}

// shellQuote quotes p for QEMU's exec: migration URIs (run by /bin/sh).
func shellQuote(p string) string { return "'" + strings.ReplaceAll(p, "'", `'\''`) + "'" }
