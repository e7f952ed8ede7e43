package guard

import (
	"bytes"
	"errors"
	"io"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

func TestLimitWriter(t *testing.T) {
	tests := []struct {
		name      string
		limit     int64
		writes    []string
		want      string
		total     int64
		truncated bool
	}{
		{"under", 10, []string{"abc", "def"}, "abcdef", 6, false},
		{"exact", 6, []string{"abc", "def"}, "abcdef", 6, false},
		{"split write", 4, []string{"abc", "def"}, "abcd", 6, true},
		{"after full", 3, []string{"abc", "def", "ghi"}, "abc", 9, true},
		{"zero", 0, []string{"abc"}, "", 3, true},
		{"negative is zero", -5, []string{"abc"}, "", 3, true},
		{"empty writes", 2, []string{"", "", "a"}, "a", 1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			l := NewLimitWriter(&b, tt.limit)
			for _, w := range tt.writes {
				n, err := l.Write([]byte(w))
				if n != len(w) || err != nil {
					t.Fatalf("Write(%q) = %d, %v; want %d, nil", w, n, err, len(w))
				}
			}
			if b.String() != tt.want {
				t.Errorf("passed on %q, want %q", b.String(), tt.want)
			}
			if l.Total() != tt.total {
				t.Errorf("Total() = %d, want %d", l.Total(), tt.total)
			}
			if l.Truncated() != tt.truncated {
				t.Errorf("Truncated() = %v, want %v", l.Truncated(), tt.truncated)
			}
		})
	}
}

type brokenWriter struct{ calls int }

func (w *brokenWriter) Write(p []byte) (int, error) {
	w.calls++
	return 0, errors.New("client gone")
}

func TestLimitWriterUnderlyingError(t *testing.T) {
	w := &brokenWriter{}
	l := NewLimitWriter(w, 100)
	for i := 0; i < 3; i++ {
		if n, err := l.Write([]byte("abc")); n != 3 || err != nil {
			t.Fatalf("Write = %d, %v; want 3, nil (the producer must be drained)", n, err)
		}
	}
	if w.calls != 1 {
		t.Errorf("underlying writer called %d times after failing, want 1", w.calls)
	}
	if l.Err() == nil || l.Total() != 9 {
		t.Errorf("Err() = %v, Total() = %d; want the writer's error and 9", l.Err(), l.Total())
	}
}

func TestCaptureConcurrent(t *testing.T) {
	c := NewCapture(1000)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 100; j++ {
				c.Write([]byte("0123456789"))
			}
		}()
	}
	wg.Wait()
	if got := len(c.Bytes()); got != 1000 {
		t.Errorf("kept %d bytes, want 1000", got)
	}
	if c.Total() != 8000 || !c.Truncated() {
		t.Errorf("Total() = %d, Truncated() = %v; want 8000, true", c.Total(), c.Truncated())
	}
	if strings.Trim(string(c.Bytes()), "0123456789") != "" {
		t.Errorf("kept bytes are not whole writes: %q", c.Bytes())
	}
}

// TestCaptureDrainsProducer: a process printing far more than the cap runs
// to completion instead of blocking on a full pipe.
func TestCaptureDrainsProducer(t *testing.T) {
	out := NewCapture(DefaultOutputLimit)
	cmd := exec.Command("sh", "-c", "yes | head -c 10000000")
	cmd.Stdout = out
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	if out.Total() != 10000000 || len(out.Bytes()) != DefaultOutputLimit {
		t.Errorf("Total() = %d, kept %d; want 10000000, %d", out.Total(), len(out.Bytes()), DefaultOutputLimit)
	}
	if _, err := io.WriteString(out, "more"); err != nil {
		t.Errorf("writing past the cap: %v", err)
	}
}
