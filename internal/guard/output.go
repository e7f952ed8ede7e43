package guard

import (
	"bytes"
	"io"
	"sync"
)

// DefaultOutputLimit is how much of an exec's stdout, and separately of its
// stderr, is kept unless the caller asks otherwise: enough for any useful
// tool output, small enough that `yes` cannot exhaust the agent's memory.
const DefaultOutputLimit = 1 << 20

// LimitWriter passes at most a fixed number of bytes on to an underlying
// writer and silently discards the rest, while counting every byte.
//
// It never returns an error, not for discarded bytes and not when the
// underlying writer fails (that error is kept for Err and nothing more is
// passed on): a process writing to it is drained, never blocked or killed
// by SIGPIPE because its reader stopped. Its methods may be called from
// several goroutines; the underlying writer sees one Write at a time.
type LimitWriter struct {
	mu        sync.Mutex
	w         io.Writer
	limit     int64
	total     int64
	truncated bool
	err       error
}

// NewLimitWriter returns a LimitWriter passing the first limit bytes to w.
// A negative limit is treated as 0.
func NewLimitWriter(w io.Writer, limit int64) *LimitWriter {
	return &LimitWriter{w: w, limit: max(limit, 0)}
}

// Write passes on what still fits under the limit and reports all of p as
// written.
func (l *LimitWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	room := l.limit - min(l.total, l.limit)
	l.total += int64(len(p))
	keep := p
	if int64(len(keep)) > room {
		keep, l.truncated = keep[:room], true
	}
	if len(keep) > 0 && l.err == nil {
		n, err := l.w.Write(keep)
		if err == nil && n < len(keep) {
			err = io.ErrShortWrite
		}
		l.err = err
	}
	return len(p), nil
}

// Total is the number of bytes written to l, kept or not.
func (l *LimitWriter) Total() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}

// Truncated reports whether any byte was discarded for the limit.
func (l *LimitWriter) Truncated() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.truncated
}

// Err is the first error of the underlying writer, after which l passed
// nothing more on; nil if none.
func (l *LimitWriter) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Capture is a LimitWriter into memory, for buffered exec output.
type Capture struct {
	LimitWriter
	buf bytes.Buffer
}

// NewCapture returns a Capture that keeps the first limit bytes.
func NewCapture(limit int64) *Capture {
	c := &Capture{}
	c.LimitWriter = LimitWriter{w: &c.buf, limit: max(limit, 0)}
	return c
}

// Bytes returns a copy of the kept bytes.
func (c *Capture) Bytes() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.buf.Bytes())
}
