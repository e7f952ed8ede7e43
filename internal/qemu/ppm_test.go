package qemu

import (
	"bufio"
	"errors"
	"image/color"
	"strings"
	"testing"
)

func TestDecodePPM(t *testing.T) {
	px := func(r, g, b uint8) color.RGBA { return color.RGBA{r, g, b, 0xff} }
	for _, tc := range []struct {
		name string
		in   string
		w, h int
		want map[[2]int]color.RGBA
		err  string
	}{
		{name: "as qemu writes it", in: "P6\n2 2\n255\n" + "\xff\x00\x00\x00\xff\x00" + "\x00\x00\xff\x10\x20\x30",
			w: 2, h: 2, want: map[[2]int]color.RGBA{{0, 0}: px(255, 0, 0), {1, 0}: px(0, 255, 0), {0, 1}: px(0, 0, 255), {1, 1}: px(16, 32, 48)}},
		{name: "comments and odd spacing", in: "P6 # made by hand\n  3\t# width\n1 \r\n15 " + "\x0f\x00\x05" + "\x00\x0f\x00" + "\x0f\x0f\x0f",
			w: 3, h: 1, want: map[[2]int]color.RGBA{{0, 0}: px(255, 0, 85), {1, 0}: px(0, 255, 0), {2, 0}: px(255, 255, 255)}},
		{name: "two bytes a sample", in: "P6\n1 1\n65535\n" + "\xff\xff\x80\x00\x00\x00",
			w: 1, h: 1, want: map[[2]int]color.RGBA{{0, 0}: px(255, 128, 0)}},
		{name: "sample over maxval is clamped", in: "P6 1 1 100\n" + "\xff\x32\x00",
			w: 1, h: 1, want: map[[2]int]color.RGBA{{0, 0}: px(255, 128, 0)}},
		{name: "data may begin with white-space bytes", in: "P6\n1 1\n255\n" + "\n\n\n",
			w: 1, h: 1, want: map[[2]int]color.RGBA{{0, 0}: px(10, 10, 10)}},
		{name: "ascii ppm", in: "P3\n1 1\n255\n1 2 3\n", err: "magic"},
		{name: "png", in: "\x89PNG\r\n\x1a\n", err: "magic"},
		{name: "empty", in: "", err: "header"},
		{name: "truncated header", in: "P6\n640 480\n", err: "header"},
		{name: "zero width", in: "P6\n0 480\n255\n", err: "size"},
		{name: "huge", in: "P6\n100000 100000\n255\n", err: "size"},
		{name: "number too large", in: "P6\n99999999999 1\n255\n", err: "too large"},
		{name: "bad maxval", in: "P6\n1 1\n70000\n", err: "largest sample"},
		{name: "garbage in header", in: "P6\n1x 1\n255\n", err: "unexpected byte"},
		{name: "truncated pixels", in: "P6\n2 2\n255\n" + "\x00\x00\x00\x00\x00\x00\x00", err: "row 1 of 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			img, err := decodePPM(bufio.NewReader(strings.NewReader(tc.in)))
			if tc.err != "" {
				if err == nil || !errors.Is(err, errPPM) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v; want an error saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if b := img.Bounds(); b.Dx() != tc.w || b.Dy() != tc.h || b.Min.X != 0 || b.Min.Y != 0 {
				t.Fatalf("bounds %v, want %dx%d", b, tc.w, tc.h)
			}
			for p, want := range tc.want {
				if got := img.RGBAAt(p[0], p[1]); got != want {
					t.Errorf("pixel %v: got %v, want %v", p, got, want)
				}
			}
		})
	}
}
