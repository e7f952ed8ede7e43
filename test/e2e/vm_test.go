package e2e

import (
	"bytes"
	"image"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/testutil"
)

// TestUpVM imports a disk image and boots it as a vm sandbox through
// `warren up` and the CLI: the screen shows its console, typing at it
// changes the screen, exec is refused, and a microVM-only verb on it is
// not_supported.
func TestUpVM(t *testing.T) {
	disk := os.Getenv(testutil.VMDiskEnv)
	if disk == "" {
		testutil.Unavailable(t, "set %s to a disk image (scripts/build-vm-disk builds one)", testutil.VMDiskEnv)
		return
	}
	testutil.RequireContainers(t)
	testutil.RequireQEMU(t)
	c := startUp(t)
	if out := c.MustRun("image", "import", "qcow2:"+disk, "--name", "desktop"); !strings.Contains(out, "desktop@1") {
		t.Fatalf("image import qcow2: %q", out)
	}
	sb := strings.TrimSpace(c.MustRun("sandbox", "create", "--backend", "vm", "--disk-image", "desktop@1", "--memory", "1Gi", "--cpu", "2"))
	shot := filepath.Join(t.TempDir(), "shot.png")
	screen := func() image.Image {
		c.MustRun("screen", sb, "-o", shot)
		b, err := os.ReadFile(shot)
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("screen: not a PNG: %v", err)
		}
		return img
	}
	// The console comes up: the screen keeps changing until its shell
	// prompt is drawn, then stays (but for the cursor's blinking).
	deadline := time.Now().Add(testutil.Scale(4 * time.Minute))
	var before image.Image
	for stable := 0; stable < 3; {
		if time.Now().After(deadline) {
			t.Fatal("the vm's screen never settled")
		}
		time.Sleep(3 * time.Second)
		img := screen()
		if before != nil && lit(img) > 500 && pixelsDiffer(before, img) < 200 {
			stable++
		} else {
			stable = 0
		}
		before = img
	}
	c.MustRun("input", sb, "--type", "echo typed-by-warren", "--key", "Return", "--click", "20,20")
	time.Sleep(3 * time.Second)
	if d := pixelsDiffer(before, screen()); d < 400 {
		t.Errorf("typing at the console changed %d pixels", d)
	}
	if _, stderr, code := c.Run("exec", sb, "--", "true"); code == 0 || !strings.Contains(stderr, api.CodeNotSupported) && !strings.Contains(stderr, "guest agent") {
		t.Errorf("exec in a vm: exit %d, %q; want it refused", code, stderr)
	}
	c.MustRun("sandbox", "rm", sb)
}

func lit(img image.Image) int {
	n, b := 0, img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			if r, g, bl, _ := img.At(x, y).RGBA(); r|g|bl > 0x1000 {
				n++
			}
		}
	}
	return n
}

func pixelsDiffer(a, b image.Image) int {
	if a.Bounds() != b.Bounds() {
		return a.Bounds().Dx() * a.Bounds().Dy()
	}
	n, r := 0, a.Bounds()
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			if a.At(x, y) != b.At(x, y) {
				n++
			}
		}
	}
	return n
}
