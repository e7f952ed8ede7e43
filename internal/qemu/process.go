package qemu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ExitMarker starts the line a warren guest's init (guest/init) prints on
// its console last: "warren-guest: exit status N".
const ExitMarker = "warren-guest: exit status "

// Console receives a guest's serial console: it copies every byte to its
// sink and remembers the exit status line of a warren guest.
type Console struct {
	mu     sync.Mutex
	sink   io.Writer
	line   []byte
	status int
	found  bool
}

// NewConsole returns a Console writing to sink (nil discards).
func NewConsole(sink io.Writer) *Console {
	if sink == nil {
		sink = io.Discard
	}
	return &Console{sink: sink}
}

func (c *Console) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, b := range p {
		if b != '\n' {
			if len(c.line) < 4096 {
				c.line = append(c.line, b)
			}
			continue
		}
		c.scan(c.line)
		c.line = c.line[:0]
	}
	if _, err := c.sink.Write(p); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (c *Console) scan(line []byte) {
	line = bytes.TrimRight(line, "\r")
	i := bytes.Index(line, []byte(ExitMarker))
	if i < 0 {
		return
	}
	if n, err := strconv.Atoi(strings.TrimSpace(string(line[i+len(ExitMarker):]))); err == nil {
		c.status, c.found = n, true
	}
}

// ExitStatus is the status the guest reported, if it reported one.
func (c *Console) ExitStatus() (int, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.status, c.found
}

// Process is a running QEMU.
type Process struct {
	cmd     *exec.Cmd
	Console *Console
	done    chan struct{}
	err     error
}

// Start starts m with its serial console written to console. Cancelling
// ctx asks QEMU to stop (SIGTERM, which powers the machine off at once)
// and kills it if it has not exited 5 seconds later.
func Start(ctx context.Context, m Machine, console *Console) (*Process, error) {
	argv, err := m.Args()
	if err != nil {
		return nil, err
	}
	if console == nil {
		console = NewConsole(nil)
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdout = console
	var stderr bytes.Buffer
	cmd.Stderr = &limited{w: &stderr, n: 64 << 10}
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("qemu: %w", err)
	}
	p := &Process{cmd: cmd, Console: console, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		if err != nil && ctx.Err() != nil {
			err = fmt.Errorf("qemu stopped: %w", ctx.Err())
		} else if err != nil {
			err = fmt.Errorf("qemu: %w: %s", err, strings.TrimSpace(stderr.String()))
		}
		p.err = err
		close(p.done)
	}()
	return p, nil
}

// Wait waits for QEMU to exit and returns its error, if any.
func (p *Process) Wait() error {
	<-p.done
	return p.err
}

// Done is closed when QEMU has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Run boots m, waits for QEMU to end and returns the exit status the
// guest reported on its console. A guest that ends without reporting one
// (it crashed, or ctx ended first) is an error.
func Run(ctx context.Context, m Machine, console *Console) (int, error) {
	p, err := Start(ctx, m, console)
	if err != nil {
		return 0, err
	}
	werr := p.Wait()
	if st, ok := p.Console.ExitStatus(); ok && werr == nil {
		return st, nil
	}
	if werr == nil {
		werr = errors.New("qemu exited but the guest reported no exit status")
	}
	return 0, werr
}

// limited keeps the first n bytes written to it.
type limited struct {
	w io.Writer
	n int
}

func (l *limited) Write(p []byte) (int, error) {
	if k := min(len(p), l.n); k > 0 {
		l.w.Write(p[:k])
		l.n -= k
	}
	return len(p), nil
}
