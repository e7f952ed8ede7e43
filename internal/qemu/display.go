package qemu

import (
	"bufio"
	"context"
	"fmt"
	"image"
	"os"
	"path/filepath"
	"time"
)

// keyDelay is QEMU's pause between the key events of one send-key (its
// default, kbd_default_delay_ms). QEMU queues key events with these
// pauses in the guest's time and drops events beyond 1024 in its queue,
// so TypeText and SendKeys wait as long as each combination takes before
// sending the next: long text cannot overflow the queue.
const keyDelay = 10 * time.Millisecond

// absMax is the largest value of QEMU's absolute pointer axes; 0..absMax
// spans the screen.
const absMax = 0x7fff

// Screendump returns what the machine's display shows now (Machine.Display;
// with none, QEMU refuses: a *QMPError). QEMU writes the screen as a PPM
// file into a private temporary directory of this host, which it must be
// able to write (it can when it runs as this process's user); that costs
// width*height*3 bytes through the file system. The screen's size is
// remembered for PointerMove and Click.
func (q *QMP) Screendump(ctx context.Context) (image.Image, error) {
	dir, err := os.MkdirTemp("", "warren-screendump-")
	if err != nil {
		return nil, fmt.Errorf("screendump: %w", err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "screen.ppm")
	if err := q.Execute(ctx, "screendump", map[string]any{"filename": path}, nil); err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("screendump: %w", err)
	}
	defer f.Close()
	img, err := decodePPM(bufio.NewReaderSize(f, 64<<10))
	if err != nil {
		return nil, fmt.Errorf("screendump: %w", err)
	}
	q.screenMu.Lock()
	q.screen = img.Bounds().Size()
	q.screenMu.Unlock()
	return img, nil
}

// SendKeys presses each key combination in turn, its keys held together
// and released in reverse order: "Return", "ctrl-alt-f2", "ctrl+c",
// "shift-Tab", "a", "A" (shift and a), "F1", "Page_Up". Keys are joined
// by '-' or '+' and named by a single character (as typed on a US
// keyboard), a QEMU qcode ("ret", "spc", "meta_l"...) or a common or X11
// name ("Enter", "Escape", "BackSpace", "super"...); case does not
// matter except for single letters. An unknown key is an error wrapping
// ErrBadInput, and nothing is sent. It returns once QEMU has queued the
// last combination.
func (q *QMP) SendKeys(ctx context.Context, keys ...string) error {
	combos := make([][]string, len(keys))
	for i, k := range keys {
		c, err := keyCombo(k)
		if err != nil {
			return err
		}
		combos[i] = c
	}
	return q.sendCombos(ctx, combos)
}

// TypeText types text on the machine's keyboard as a US keyboard would,
// shift included: printable ASCII, '\n' (Return), '\t' (Tab). Any other
// character is an error wrapping ErrBadInput, and nothing is sent. It
// takes about 20 ms a character (40 with shift): QEMU paces key events
// so that the guest sees every one.
func (q *QMP) TypeText(ctx context.Context, text string) error {
	combos, err := textKeys(text)
	if err != nil {
		return err
	}
	return q.sendCombos(ctx, combos)
}

func (q *QMP) sendCombos(ctx context.Context, combos [][]string) error {
	for i, c := range combos {
		if i > 0 {
			// The previous combination's events are still queued in
			// QEMU, 2*len(c) pauses long.
			t := time.NewTimer(time.Duration(2*len(combos[i-1])) * keyDelay)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
		}
		keys := make([]map[string]string, len(c))
		for j, k := range c {
			keys[j] = map[string]string{"type": "qcode", "data": k}
		}
		if err := q.Execute(ctx, "send-key", map[string]any{"keys": keys}, nil); err != nil {
			return err
		}
	}
	return nil
}

// PointerMove puts the pointer at pixel (x, y) of the screen, (0, 0) at
// its top left. It needs an absolute pointer (Display.Pointer) for the
// guest to follow exactly. Pixels are scaled by the screen's size at the
// last Screendump (the image the caller looks at); with none yet,
// PointerMove takes one. A point off that screen is an error wrapping
// ErrBadInput.
func (q *QMP) PointerMove(ctx context.Context, x, y int) error {
	ev, err := q.absEvents(ctx, x, y)
	if err != nil {
		return err
	}
	return q.Execute(ctx, "input-send-event", map[string]any{"events": ev}, nil)
}

// buttons are QEMU 7.2's pointer buttons (QAPI enum InputButton).
var buttons = setOf("left", "middle", "right", "wheel-up", "wheel-down", "side", "extra", "wheel-left", "wheel-right")

// Click moves the pointer to (x, y) as PointerMove does and clicks
// button: "left" (also ""), "middle", "right", "wheel-up" and
// "wheel-down" (one step of the wheel), "wheel-left", "wheel-right",
// "side" or "extra". Press and release are two events the guest sees
// apart.
func (q *QMP) Click(ctx context.Context, x, y int, button string) error {
	if button == "" {
		button = "left"
	}
	if !buttons[button] {
		return badInput("pointer button %q", button)
	}
	ev, err := q.absEvents(ctx, x, y)
	if err != nil {
		return err
	}
	btn := func(down bool) map[string]any {
		return map[string]any{"type": "btn", "data": map[string]any{"button": button, "down": down}}
	}
	// One event batch is one report to the guest: a press and release
	// in the same batch would cancel out.
	if err := q.Execute(ctx, "input-send-event", map[string]any{"events": append(ev, btn(true))}, nil); err != nil {
		return err
	}
	return q.Execute(ctx, "input-send-event", map[string]any{"events": []map[string]any{btn(false)}}, nil)
}

// absEvents are the events that put the pointer at pixel (x, y).
func (q *QMP) absEvents(ctx context.Context, x, y int) ([]map[string]any, error) {
	q.screenMu.Lock()
	size := q.screen
	q.screenMu.Unlock()
	if size.X == 0 {
		if _, err := q.Screendump(ctx); err != nil {
			return nil, fmt.Errorf("screen size: %w", err)
		}
		q.screenMu.Lock()
		size = q.screen
		q.screenMu.Unlock()
	}
	ax, ok1 := absAxis(x, size.X)
	ay, ok2 := absAxis(y, size.Y)
	if !ok1 || !ok2 {
		return nil, badInput("point (%d, %d) is off the %dx%d screen", x, y, size.X, size.Y)
	}
	abs := func(axis string, v int) map[string]any {
		return map[string]any{"type": "abs", "data": map[string]any{"axis": axis, "value": v}}
	}
	return []map[string]any{abs("x", ax), abs("y", ay)}, nil
}

// absAxis scales pixel p of a screen n pixels wide to QEMU's 0..absMax:
// the pixel's centre, so that a guest scaling back (by n/(absMax+1), as
// Linux input stacks do) lands on the same pixel even where it rounds
// down.
func absAxis(p, n int) (int, bool) {
	if p < 0 || p >= n {
		return 0, false
	}
	return (2*p + 1) * absMax / (2 * n), true
}
