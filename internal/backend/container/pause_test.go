package container

import (
	"bytes"
	"context"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/swap"
	"github.com/warrenhq/warren/internal/testutil"
)

// TestPause: a paused sandbox's processes stop (a counter it writes stands
// still), the memory charged to it shrinks (the page cache of what it
// wrote, at least: anonymous memory needs swap), its state is paused, for
// a new agent process too; resumed, it runs on where it was.
func TestPause(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	h.start(h.spec("pause-1"))
	h.sh("pause-1", `dd if=/dev/zero of=/work.bin bs=1M count=48 2>/dev/null; (i=0; while :; do i=$((i+1)); echo $i > /count; sleep 0.02; done) > /dev/null 2>&1 &
		until [ -s /count ]; do sleep 0.01; done`) // a loaded host may not have run the loop yet
	count := func() string {
		t.Helper()
		var b bytes.Buffer
		if err := h.c.ReadFile(ctx, "pause-1", "/count", &b); err != nil {
			t.Fatalf("read /count: %v", err)
		}
		return b.String()
	}
	time.Sleep(200 * time.Millisecond)

	st, err := h.c.Pause(ctx, "pause-1")
	if err != nil {
		t.Fatalf("Pause: %v", err)
	}
	t.Logf("pause: froze in %v, memory %d -> %d MiB (%s)", st.Freeze, st.Before>>20, st.After>>20, st.Reclaim)
	var fs unix.Statfs_t
	onTmpfs := unix.Statfs(h.c.writableDir("pause-1"), &fs) == nil && fs.Type == unix.TMPFS_MAGIC
	switch {
	case st.Before < 40<<20 || st.Reclaim == "" || st.Reclaim[:4] == "none":
		t.Errorf("pause stats %+v: want the 48 MiB it wrote charged, and reclaimed", st)
	case onTmpfs:
		// Its writes are tmpfs pages, which only swap takes
		// (TestPauseSwap), not page cache.
		t.Logf("the sandbox's writable layer is on tmpfs: its 48 MiB are swap-backed")
	case st.Before-st.After < 32<<20:
		t.Errorf("pause stats %+v: want the 48 MiB of page cache it wrote reclaimed", st)
	}
	c1 := count()
	time.Sleep(300 * time.Millisecond)
	if c2 := count(); c1 != c2 {
		t.Errorf("the counter moved while paused: %q -> %q", c1, c2)
	}
	h.wantState("pause-1", backend.StatePaused)
	if again, err := h.c.Pause(ctx, "pause-1"); err != nil {
		t.Errorf("Pause of a paused sandbox: %+v, %v", again, err)
	}

	// A new agent process sees it paused.
	h.restart()
	if s, err := h.c.Recover(ctx, h.spec("pause-1")); err != nil || s.State != backend.StatePaused {
		t.Fatalf("Recover of a paused sandbox: %+v, %v", s, err)
	}

	if err := h.c.Resume(ctx, "pause-1"); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	h.wantState("pause-1", backend.StateRunning)
	time.Sleep(300 * time.Millisecond)
	if c3 := count(); c3 == c1 {
		t.Errorf("the counter stands still after the resume: %q", c3)
	}
	if got := h.sh("pause-1", "wc -c < /work.bin"); got != "50331648" {
		t.Errorf("its file after the resume: %q bytes", got)
	}
	if err := h.c.Destroy(ctx, "pause-1"); err != nil {
		t.Fatal(err)
	}
	h.assertGone("pause-1")

	// A paused sandbox is destroyed like any other.
	h.start(h.spec("pause-2"))
	h.sh("pause-2", "sleep 1000 > /dev/null 2>&1 &")
	if _, err := h.c.Pause(ctx, "pause-2"); err != nil {
		t.Fatal(err)
	}
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := h.c.Destroy(dctx, "pause-2"); err != nil {
		t.Fatalf("Destroy of a paused sandbox: %v", err)
	}
	h.assertGone("pause-2")
}

// TestPauseSwap: on a node that swaps (a zram device, as `warren agent
// --swap zram:SIZE` makes), a pause pushes the sandbox's swap-backed
// memory out too (tmpfs here; anonymous memory alike): what stays charged
// is a small part of what it held. Without swap, it stays.
func TestPauseSwap(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	h.start(h.spec("pause-swap"))
	// 48 MiB in its /dev/shm (tmpfs): memory only swap can take, as
	// anonymous memory.
	h.sh("pause-swap", "dd if=/dev/zero of=/dev/shm/hog bs=1M count=48 2>/dev/null && echo ready > /ready")
	if devs, _ := swap.Devices(); len(devs) == 0 {
		st, err := h.c.Pause(ctx, "pause-swap")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("pause without swap: memory %d -> %d MiB (%s)", st.Before>>20, st.After>>20, st.Reclaim)
		if st.After < 44<<20 {
			t.Errorf("pause without swap: %+v; want the 48 MiB of tmpfs still charged", st)
		}
		if err := h.c.Resume(ctx, "pause-swap"); err != nil {
			t.Fatal(err)
		}
	}
	dev, err := swap.Zram(512 << 20)
	if err != nil {
		if testutil.Strict() {
			t.Fatalf("a zram swap device: %v", err)
		}
		t.Skip(err)
	}
	t.Cleanup(func() {
		if err := swap.Off(dev); err != nil {
			t.Errorf("swap off: %v", err)
		}
	})
	st, err := h.c.Pause(ctx, "pause-swap")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pause with swap: memory %d -> %d MiB (%s)", st.Before>>20, st.After>>20, st.Reclaim)
	if st.Before < 48<<20 || st.After > st.Before/10 {
		t.Errorf("pause stats %+v: want at most a tenth of the memory charged before left", st)
	}
	if err := h.c.Resume(ctx, "pause-swap"); err != nil {
		t.Fatal(err)
	}
	if got := h.sh("pause-swap", "cat /ready; wc -c < /dev/shm/hog"); got != "ready\n50331648" {
		t.Errorf("after the resume: %q", got)
	}
	if err := h.c.Destroy(ctx, "pause-swap"); err != nil {
		t.Fatal(err)
	}
}

// TestReclaim: reclaiming a running sandbox's memory pushes out the page
// cache of what it wrote, and it runs on with its files whole.
func TestReclaim(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	h.start(h.spec("reclaim-1"))
	h.sh("reclaim-1", `dd if=/dev/zero of=/work.bin bs=1M count=48 2>/dev/null; sleep 1000 > /dev/null 2>&1 &`)
	st, err := h.c.Reclaim(ctx, "reclaim-1")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("reclaim: memory %d -> %d MiB (%s)", st.Before>>20, st.After>>20, st.How)
	var fs unix.Statfs_t
	onTmpfs := unix.Statfs(h.c.writableDir("reclaim-1"), &fs) == nil && fs.Type == unix.TMPFS_MAGIC
	switch {
	case st.Before < 40<<20 || st.How == "":
		t.Errorf("reclaim stats %+v: want the 48 MiB it wrote charged", st)
	case !onTmpfs && st.Before-st.After < 32<<20:
		t.Errorf("reclaim stats %+v: want the 48 MiB of page cache it wrote reclaimed", st)
	}
	h.wantState("reclaim-1", backend.StateRunning)
	if got := h.sh("reclaim-1", "wc -c < /work.bin; pidof sleep > /dev/null && echo alive"); got != "50331648\nalive" {
		t.Errorf("after the reclaim: %q", got)
	}
}
