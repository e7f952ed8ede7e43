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

// TestUpVM imports a disk image that carries the guest agent and boots
// it as a vm sandbox through `warren up` and the CLI: the screen shows
// its console, typing at it changes the screen, exec and cp reach the
// machine through its agent, and a snapshot is not_supported.
func TestUpVM(t *testing.T) {
	disk := testutil.VMDiskWithAgent(t)
	if disk == "" {
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
	// The console comes up: its login shell on tty1 says so on the
	// serial console (the node keeps it in the sandbox's directory), then
	// the screen settles (but for the cursor's blinking).
	consoleLog := filepath.Join(c.DataDir, "node", "vm", "sandboxes", sb, "console.log")
	deadline := time.Now().Add(testutil.Scale(4 * time.Minute))
	for {
		b, err := os.ReadFile(consoleLog)
		if bytes.Contains(b, []byte(testutil.VMReady)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the vm's shell never came up (%v); console:\n%s", err, b)
		}
		time.Sleep(time.Second)
	}
	var before image.Image
	for stable := 0; stable < 2; {
		if time.Now().After(deadline) {
			t.Fatal("the vm's screen never settled")
		}
		time.Sleep(time.Second)
		img := screen()
		if before != nil && lit(img) > 500 && pixelsDiffer(before, img) < 200 {
			stable++
		} else {
			stable = 0
		}
		before = img
	}
	c.MustRun("input", sb, "--type", "echo typed-by-warren", "--key", "Return", "--click", "20,20")
	// The shell echoes the line, runs it and prompts again.
	d := 0
	for end := time.Now().Add(testutil.Scale(30 * time.Second)); d < 400 && time.Now().Before(end); {
		time.Sleep(time.Second)
		d = pixelsDiffer(before, screen())
	}
	if d < 400 {
		t.Errorf("typing at the console changed %d pixels", d)
	}
	if out := c.MustRun("exec", sb, "--", "sh", "-c", "hostname; id -un"); out != "warren-vm\nroot\n" {
		t.Errorf("exec in a vm: %q, want the machine's hostname and root", out)
	}
	local := filepath.Join(t.TempDir(), "in.txt")
	if err := os.WriteFile(local, []byte("copied in\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.MustRun("cp", local, sb+":/root/in.txt")
	if out := c.MustRun("exec", sb, "--", "cat", "/root/in.txt"); out != "copied in\n" {
		t.Errorf("cp into a vm, then cat: %q", out)
	}
	if _, stderr, code := c.Run("sandbox", "snapshot", sb); code == 0 || !strings.Contains(stderr, api.CodeNotSupported) {
		t.Errorf("snapshot of a vm: exit %d, %q; want not_supported", code, stderr)
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
