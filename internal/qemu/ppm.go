package qemu

import (
	"bufio"
	"errors"
	"fmt"
	"image"
	"io"
)

// maxPixels bounds a decoded screen (QEMU's VGA has at most 16 MiB of
// video memory, so about 4M pixels at 32 bits).
const maxPixels = 1 << 26

var errPPM = errors.New("ppm")

// decodePPM decodes a binary PPM (P6), the format QEMU's screendump
// writes: "P6", width, height and the largest sample value as decimal
// numbers separated by white space (comments from '#' to the end of a
// line allowed between them), one white space character, then the
// pixels, RGB, one byte a sample (two, big-endian, if the largest value
// is over 255). Samples are scaled to 0..255.
func decodePPM(r *bufio.Reader) (*image.RGBA, error) {
	magic := make([]byte, 2)
	if _, err := io.ReadFull(r, magic); err != nil {
		return nil, fmt.Errorf("%w: header: %v", errPPM, err)
	}
	if string(magic) != "P6" {
		return nil, fmt.Errorf("%w: magic %q, want P6", errPPM, magic)
	}
	var nums [3]int
	for i := range nums {
		n, err := ppmNumber(r)
		if err != nil {
			return nil, fmt.Errorf("%w: header: %v", errPPM, err)
		}
		nums[i] = n
	}
	w, h, maxval := nums[0], nums[1], nums[2]
	if w <= 0 || h <= 0 || w > maxPixels/h {
		return nil, fmt.Errorf("%w: size %dx%d", errPPM, w, h)
	}
	if maxval <= 0 || maxval > 65535 {
		return nil, fmt.Errorf("%w: largest sample value %d", errPPM, maxval)
	}
	// ppmNumber consumed the single white space after maxval.
	size := 1
	if maxval > 255 {
		size = 2
	}
	row := make([]byte, w*3*size)
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := 0; y < h; y++ {
		if _, err := io.ReadFull(r, row); err != nil {
			return nil, fmt.Errorf("%w: row %d of %d: %v", errPPM, y, h, err)
		}
		out := img.Pix[y*img.Stride : y*img.Stride+w*4]
		for x := 0; x < w; x++ {
			for c := 0; c < 3; c++ {
				var v int
				if size == 1 {
					v = int(row[x*3+c])
				} else {
					v = int(row[(x*3+c)*2])<<8 | int(row[(x*3+c)*2+1])
				}
				if v > maxval {
					v = maxval
				}
				if maxval != 255 {
					v = (v*255 + maxval/2) / maxval
				}
				out[x*4+c] = byte(v)
			}
			out[x*4+3] = 0xff
		}
	}
	return img, nil
}

// ppmNumber skips white space and comments, reads a decimal number and
// the one white space character that ends it.
func ppmNumber(r *bufio.Reader) (int, error) {
	var c byte
	var err error
	for {
		if c, err = r.ReadByte(); err != nil {
			return 0, err
		}
		if c == '#' {
			if _, err := r.ReadBytes('\n'); err != nil {
				return 0, err
			}
			continue
		}
		if !isPPMSpace(c) {
			break
		}
	}
	n, digits := 0, 0
	for ; c >= '0' && c <= '9'; digits++ {
		if n = n*10 + int(c-'0'); n > 1<<30 {
			return 0, errors.New("number too large")
		}
		if c, err = r.ReadByte(); err != nil {
			return 0, err
		}
	}
	if digits == 0 || !isPPMSpace(c) {
		return 0, fmt.Errorf("unexpected byte %q", c)
	}
	return n, nil
}

func isPPMSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'
}
