package container

import (
	"context"
	"github.com/warrenhq/warren/internal/cgroup"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/backend"
)

// Sweep removes everything of sandboxes nobody recorded (a container with
// its processes, runc state, cgroups, mounts and directory; a cgroup left
// with a process and nothing else) and leaves the recorded ones alone.
func TestSweep(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	h.start(h.spec("orph-1"))
	h.sh("orph-1", "sleep 1000 >/dev/null 2>&1 &")
	kept := h.spec("kept-1")
	h.start(kept)

	// orph-2: only a cgroup, with a host process in it.
	layout, err := cgroup.Host()
	if err != nil {
		t.Fatalf("cgroup layout: %v", err)
	}
	hiers := layout.Paths(h.cfg.CgroupParent)
	sleeper := exec.Command("sleep", "1000")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	defer sleeper.Process.Kill()
	exited := make(chan struct{})
	go func() { sleeper.Wait(); close(exited) }()
	var orphanCgroup string
	for _, hier := range hiers {
		d := filepath.Join(hier.Path, "orph-2")
		if os.MkdirAll(d, 0o755) != nil {
			continue
		}
		if os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(sleeper.Process.Pid)), 0) == nil {
			orphanCgroup = d
			break
		}
		os.Remove(d)
	}
	if orphanCgroup == "" {
		t.Fatal("could not put a process in a cgroup of any hierarchy")
	}

	// A new process: it knows only the sandbox it recovered.
	c2 := h.newContainer()
	defer c2.Close()
	h.c = c2
	if st, err := c2.Recover(ctx, kept); err != nil || st.State != backend.StateRunning {
		t.Fatalf("recover kept-1: %+v, %v", st, err)
	}
	removed, err := c2.Sweep(ctx, func(id string) bool { return strings.HasPrefix(id, "orph-") || id == "kept-1" })
	if err != nil {
		t.Fatalf("Sweep: %v (removed %q)", err, removed)
	}
	all := strings.Join(removed, "\n")
	for _, want := range []string{"container init", "runc state " + filepath.Join(c2.cfg.RuncRoot, "orph-1"),
		"directory " + c2.dir("orph-1"), "cgroup " + orphanCgroup,
		"cgroup " + filepath.Join(hiers[0].Path, "orph-1")} {
		if !strings.Contains(all, want) {
			t.Errorf("removed does not list %q:\n%s", want, all)
		}
	}
	if strings.Contains(all, "kept-1") {
		t.Errorf("swept a recovered sandbox:\n%s", all)
	}
	h.assertGone("orph-1")
	h.assertGone("orph-2")
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Error("the process in orph-2's cgroup still runs")
	}
	if got := h.sh("kept-1", "echo alive"); got != "alive" {
		t.Errorf("kept-1 after the sweep: %q", got)
	}
	if len(h.layerMounts()) == 0 {
		t.Error("the sweep unmounted the layer kept-1 uses")
	}

	// Nothing left: a second sweep removes nothing.
	if again, err := c2.Sweep(ctx, func(string) bool { return true }); err != nil || len(again) != 0 {
		t.Errorf("second sweep = %q, %v; want nothing", again, err)
	}
}
