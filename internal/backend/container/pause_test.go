package container

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/backend"
)

// TestPause: a paused sandbox's processes stop (a counter it writes stands
// still), the memory charged to it shrinks (the page cache of what it
// wrote, at least: anonymous memory needs swap), its state is paused, for
// a new agent process too; resumed, it runs on where it was.
func TestPause(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	h.start(h.spec("pause-1"))
	h.sh("pause-1", `dd if=/dev/zero of=/work.bin bs=1M count=48 2>/dev/null; (i=0; while :; do i=$((i+1)); echo $i > /count; sleep 0.02; done) > /dev/null 2>&1 &`)
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
	if st.Before < 40<<20 || st.Before-st.After < 32<<20 || st.Reclaim == "" || st.Reclaim[:4] == "none" {
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
	h.c = h.newContainer()
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
