package qemu

import (
	"context"
	"fmt"
	"image"
	"image/png"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/testutil"
)

// TestDisplayAndInput boots a full machine (q35) from a disk image, with
// a VGA display served over VNC and a USB tablet, and drives it as an
// agent would: it waits for the screen to be drawn, types a command at
// the display's console and sees the screen change and the command run
// (its output goes to the serial port), and moves and clicks the pointer.
func TestDisplayAndInput(t *testing.T) {
	disk := os.Getenv(testutil.VMDiskEnv)
	if disk == "" {
		testutil.Unavailable(t, "set %s to a disk image (scripts/build-vm-disk builds one and prints its path)", testutil.VMDiskEnv)
		return
	}
	testutil.RequireQEMU(t)
	if _, err := os.Stat(disk); err != nil {
		t.Fatalf("%s: %v", testutil.VMDiskEnv, err)
	}
	accel, why := DetectAccel()
	t.Logf("accelerator %s: %s", accel, why)
	dir := t.TempDir()
	m := Machine{
		Type: "q35", Accel: accel, CPUs: 2, MemoryMiB: 1024,
		Disks:   []Disk{{Path: disk, Format: "qcow2", Boot: true, Snapshot: true}},
		Display: &Display{VNC: filepath.Join(dir, "vnc.sock"), Pointer: USBTablet},
		QMP:     filepath.Join(dir, "qmp.sock"),
		Extra:   []string{"-S"}, // paused until the test has seen the blank screen
	}
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(4*time.Minute))
	defer cancel()
	var serial testutil.SyncBuffer
	start := time.Now()
	p, err := Start(ctx, m, NewConsole(&serial))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		p.Wait()
		if t.Failed() {
			t.Logf("serial console:\n%s", serial.String())
		}
	}()
	q, err := DialQMP(ctx, m.QMP)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	var shots []image.Image
	defer func() { // screenshots of a failed run, to look at
		if !t.Failed() || len(shots) == 0 {
			return
		}
		out, err := os.MkdirTemp("", "warren-display-")
		if err != nil {
			return
		}
		for i, img := range shots {
			if f, err := os.Create(filepath.Join(out, fmt.Sprintf("screen-%d.png", i))); err == nil {
				png.Encode(f, img)
				f.Close()
			}
		}
		t.Logf("screenshots in %s", out)
	}()
	shot := func() image.Image {
		t.Helper()
		img, err := q.Screendump(ctx)
		if err != nil {
			t.Fatalf("screendump: %v", err)
		}
		shots = append(shots, img)
		if len(shots) > 8 {
			shots = shots[1:]
		}
		return img
	}
	// poll calls cond every 250 ms until it holds or ctx ends.
	poll := func(what string, cond func() bool) {
		t.Helper()
		for !cond() {
			select {
			case <-ctx.Done():
				t.Fatalf("%s: not after %v", what, time.Since(start).Round(time.Second))
			case <-p.Done():
				t.Fatalf("%s: QEMU exited: %v", what, p.Wait())
			case <-time.After(250 * time.Millisecond):
			}
		}
		t.Logf("%s after %v", what, time.Since(start).Round(100*time.Millisecond))
	}

	// The VNC server speaks RFB.
	c, err := net.Dial("unix", m.Display.VNC)
	if err != nil {
		t.Fatal(err)
	}
	hello := make([]byte, 12)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	_, err = io.ReadFull(c, hello)
	c.Close()
	if err != nil || !strings.HasPrefix(string(hello), "RFB 003.") {
		t.Fatalf("VNC greeting %q, %v; want RFB 003.x", hello, err)
	}

	// Until the firmware draws, QEMU shows a placeholder of its own
	// ("Guest has not initialized the display"); then the firmware, boot
	// loader and guest draw.
	blank := shot()
	if err := q.Execute(ctx, "cont", nil, nil); err != nil {
		t.Fatal(err)
	}
	poll("the screen is drawn", func() bool {
		img := shot()
		d, _ := diffPixels(blank, img)
		return d > 0 && litPixels(img) > 100
	})
	poll("a shell on the display's console", func() bool { return strings.Contains(serial.String(), testutil.VMReady) })
	// The prompt is drawn soon after the shell starts; a blinking cursor
	// changes a text cell, no more.
	var before image.Image
	prev := shot()
	poll("the screen is still", func() bool {
		before = shot()
		d, _ := diffPixels(prev, before)
		prev = before
		return d < 200
	})
	t.Logf("screen %v, %d pixels lit", before.Bounds().Size(), litPixels(before))

	// Typed at the console, a command shows on the screen and runs: its
	// output, which only the shell can compute, comes out of the serial port.
	marker := fmt.Sprintf("warren-%d", rand.IntN(1e9))
	typed := time.Now()
	if err := q.TypeText(ctx, `echo "`+marker+`-$((6*7))" > /dev/ttyS0`); err != nil {
		t.Fatal(err)
	}
	if err := q.SendKeys(ctx, "Return"); err != nil {
		t.Fatal(err)
	}
	t.Logf("typed %d characters in %v", len(marker)+30, time.Since(typed).Round(10*time.Millisecond))
	poll("the command ran", func() bool { return strings.Contains(serial.String(), marker+"-42") })
	var changed int
	var where image.Rectangle
	poll("the screen shows it", func() bool {
		changed, where = diffPixels(before, shot())
		return changed > 400
	})
	t.Logf("%d pixels changed, within %v of the %v screen", changed, where, before.Bounds().Size())

	// The pointer: an absolute move and clicks at the screen's centre.
	size := before.Bounds().Size()
	if err := q.PointerMove(ctx, size.X/2, size.Y/2); err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"left", "right", "wheel-down"} {
		if err := q.Click(ctx, size.X/3, size.Y/3, b); err != nil {
			t.Fatalf("click %s: %v", b, err)
		}
	}
	if err := q.PointerMove(ctx, size.X, 0); err == nil {
		t.Errorf("a move off the screen was accepted")
	}
	if st, err := q.Status(ctx); err != nil || st != "running" {
		t.Fatalf("status %q, %v; want running", st, err)
	}
	if err := q.Quit(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("done in %v", time.Since(start).Round(100*time.Millisecond))
}

// litPixels counts the pixels of img that are not (nearly) black.
func litPixels(img image.Image) int {
	n := 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			if r, g, bl, _ := img.At(x, y).RGBA(); r|g|bl > 0x2000 {
				n++
			}
		}
	}
	return n
}

// diffPixels counts the pixels where a and b differ and bounds them; two
// screens of different sizes differ everywhere.
func diffPixels(a, b image.Image) (int, image.Rectangle) {
	if a.Bounds() != b.Bounds() {
		return a.Bounds().Dx() * a.Bounds().Dy(), a.Bounds().Union(b.Bounds())
	}
	n := 0
	var box image.Rectangle
	r := a.Bounds()
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			if a.At(x, y) != b.At(x, y) {
				n++
				box = box.Union(image.Rect(x, y, x+1, y+1))
			}
		}
	}
	return n, box
}
