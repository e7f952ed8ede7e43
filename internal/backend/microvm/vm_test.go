package microvm

import (
	"context"
	"errors"
	"image"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/testutil"
)

// TestVM boots a whole machine from an imported disk image: its screen
// shows the console, typing at it changes the screen, it pauses and
// resumes, exec is refused (no agent inside), and Stop presses the power
// button.
func TestVM(t *testing.T) {
	disk := os.Getenv(testutil.VMDiskEnv)
	if disk == "" {
		testutil.Unavailable(t, "set %s to a disk image (scripts/build-vm-disk builds one)", testutil.VMDiskEnv)
		return
	}
	testutil.RequireRoot(t)
	testutil.RequireQEMU(t)
	ctx := context.Background()
	m, err := New(Config{Kind: KindVM, StateDir: t.TempDir(), CgroupParent: "/warren-test/vm-" + filepath.Base(t.TempDir())})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Available(ctx); err != nil {
		t.Fatal(err)
	}
	if m.Name() != "vm" || m.Capabilities().Exec {
		t.Errorf("vm backend: name %q, capabilities %+v", m.Name(), m.Capabilities())
	}
	// The imported image as the node's cache holds it: a copy, linked.
	img := filepath.Join(t.TempDir(), "layer")
	if _, err := copyFile(disk, img); err != nil {
		t.Fatal(err)
	}
	// A qcow2 naming a backing file of the host is refused.
	evil := filepath.Join(t.TempDir(), "evil.qcow2")
	if out, err := runCmd("qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", "/etc/shadow", evil); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if err := m.Create(ctx, backend.Spec{ID: "evil", Layers: []backend.Layer{{Digest: "sha256:e", Path: evil}}}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Create from a qcow2 with a backing file: %v, want ErrInvalid", err)
	}

	const id = "vm1"
	if err := m.Create(ctx, backend.Spec{ID: id, Layers: []backend.Layer{{Digest: "sha256:d", Path: img}}, Resources: backend.Resources{CPU: 2, Memory: 1 << 30}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m.Destroy(context.Background(), id)
		if l := leftovers(m, id); len(l) > 0 {
			t.Errorf("after Destroy: %v", l)
		}
	})
	if err := m.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for !strings.Contains(console(m, id), testutil.VMReady) {
		if time.Since(start) > testutil.Scale(3*time.Minute) {
			t.Fatalf("the guest's shell never got ready; console:\n%s", console(m, id))
		}
		time.Sleep(time.Second)
	}
	t.Logf("shell ready after %v", time.Since(start).Round(time.Second))
	time.Sleep(2 * time.Second) // the screen settles
	before, err := m.Screen(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if lit(before) < 500 {
		t.Fatalf("the screen is blank (%d lit pixels)", lit(before))
	}
	if _, err := m.Exec(ctx, id, backend.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Exec in a vm: %v, want ErrInvalid (not supported)", err)
	}
	if err := m.Input(ctx, id, []backend.InputEvent{{Type: "key", Key: "no-such-key"}}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Input of an unknown key: %v, want ErrInvalid", err)
	}
	if err := m.Input(ctx, id, []backend.InputEvent{{Type: "text", Text: "echo warren-typed-this"}, {Type: "key", Key: "Return"}, {Type: "click", X: 10, Y: 10}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	after, err := m.Screen(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if d := differ(before, after); d < 400 {
		t.Errorf("typing at the console changed %d pixels, want the text on screen", d)
	}

	// Pause and resume: the screen comes back as it was.
	if _, err := m.Pause(ctx, id); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if err := m.Resume(ctx, id); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if _, err := m.Screen(ctx, id); err != nil {
		t.Errorf("Screen after resume: %v", err)
	}
	if err := m.Stop(ctx, id, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if st, _ := m.Inspect(ctx, id); st.State != backend.StateStopped {
		t.Errorf("after Stop: %+v", st)
	}
}

func console(m *MicroVM, id string) string {
	b, _ := os.ReadFile(filepath.Join(m.sandboxDir(id), consoleFile))
	return string(b)
}

// lit counts pixels that are not black.
func lit(img image.Image) int {
	n := 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			if r, g, bl, _ := img.At(x, y).RGBA(); r|g|bl > 0x1000 {
				n++
			}
		}
	}
	return n
}

// differ counts pixels that differ between two screens of one size.
func differ(a, b image.Image) int {
	if a.Bounds() != b.Bounds() {
		return a.Bounds().Dx() * a.Bounds().Dy()
	}
	n := 0
	r := a.Bounds()
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			if a.At(x, y) != b.At(x, y) {
				n++
			}
		}
	}
	return n
}

func runCmd(name string, args ...string) ([]byte, error) {
	return exec.Command(name, args...).CombinedOutput()
}
