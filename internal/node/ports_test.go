package node

import (
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/backend/fake"
	"github.com/warrenhq/warren/internal/errdefs"
)

// newPortsAgent is newAgent with a handle on its fake backend.
func newPortsAgent(t *testing.T) (*Agent, *fake.Backend) {
	t.Helper()
	dir := t.TempDir()
	b, err := fake.New(filepath.Join(dir, "fake2"), fake.Options{Name: api.BackendContainer})
	if err != nil {
		t.Fatal(err)
	}
	a := newAgent(t, dir, func(c *Config) { c.Backends = []backend.Backend{b} })
	return a, b
}

// echo serves ln, echoing each connection back.
func echo(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() { io.Copy(c, c); c.Close() }()
	}
}

func TestDialPortErrors(t *testing.T) {
	a, b := newPortsAgent(t)
	sb := mustCreate(t, a, api.CreateSandboxRequest{})
	ctx := context.Background()

	ln, err := b.Listen(sb.ID, 8000)
	if err != nil {
		t.Fatal(err)
	}
	ln.Close() // registered, then gone: nothing listens on 8000
	for _, tc := range []struct {
		id   string
		port int
		kind error
		code string
	}{
		{sb.ID, 0, errdefs.ErrInvalid, ""},
		{sb.ID, 65536, errdefs.ErrInvalid, ""},
		{sb.ID, 8000, errdefs.ErrUnreachable, api.CodePortUnreachable},
		{"n1-aaaaaaaaaaaaaaaa", 8000, errdefs.ErrNotFound, api.CodeSandboxNotFound},
	} {
		c, err := a.DialPort(ctx, tc.id, tc.port)
		if c != nil {
			c.Close()
		}
		if !errors.Is(err, tc.kind) || tc.code != "" && errdefs.Code(err) != tc.code {
			t.Errorf("DialPort(%s, %d): %v (code %q), want %v %s", tc.id, tc.port, err, errdefs.Code(err), tc.kind, tc.code)
		}
	}
	// Each failed dial ended its call: the sandbox is not held.
	if n := a.calls(sb.ID); n != 0 {
		t.Errorf("%d calls in flight after failed dials, want 0", n)
	}
}

// An open tunnel is a call: the idle timeout waits for it to close.
func TestDialPortKeepsSandboxAlive(t *testing.T) {
	a, b := newPortsAgent(t)
	sb := mustCreate(t, a, api.CreateSandboxRequest{IdleTimeout: api.Duration(time.Second)})
	ln, err := b.Listen(sb.ID, 8000)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go echo(ln)
	c, err := a.DialPort(context.Background(), sb.ID, 8000)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(c, "x")
	buf := make([]byte, 1)
	if _, err := io.ReadFull(c, buf); err != nil || buf[0] != 'x' {
		t.Fatalf("echo: %q, %v", buf, err)
	}
	time.Sleep(2 * time.Second)
	if got, err := a.Get(context.Background(), sb.ID); err != nil || got.State != api.StateRunning {
		t.Fatalf("with a tunnel open 2s past a 1s idle timeout: %+v, %v; want it running", got.State, err)
	}
	c.Close()
	c.Close() // twice: the call ends once
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := a.Get(context.Background(), sb.ID); errors.Is(err, errdefs.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the idle sandbox was not reaped after its tunnel closed")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A Ports call holds the sandbox until done; what its dial made does not.
func TestPortsCallScope(t *testing.T) {
	a, b := newPortsAgent(t)
	sb := mustCreate(t, a, api.CreateSandboxRequest{})
	ln, err := b.Listen(sb.ID, 80)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go echo(ln)
	dial, done, err := a.Ports(context.Background(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if n := a.calls(sb.ID); n != 1 {
		t.Errorf("calls during Ports: %d, want 1", n)
	}
	c, err := dial(context.Background(), 80)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := done(nil); err != nil {
		t.Fatal(err)
	}
	if n := a.calls(sb.ID); n != 0 {
		t.Errorf("calls after done with a connection still open: %d, want 0", n)
	}
	if _, _, err := a.Ports(context.Background(), "n1-aaaaaaaaaaaaaaaa"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Ports of an unknown sandbox: %v", err)
	}
}

// calls is the number of calls in flight on sandbox id.
func (a *Agent) calls(id string) int {
	s, err := a.lookup(id)
	if err != nil {
		return -1
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}
