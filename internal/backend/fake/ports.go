package fake

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
)

var _ backend.PortDialer = (*Backend)(nil)

// ports maps a sandbox's port to where a test's listener for it really
// is. Its zero value is empty.
type ports struct {
	mu sync.Mutex
	m  map[portKey]string
}

type portKey struct {
	id   string
	port int
}

// Listen opens a listener on the host's loopback (on a port of its own)
// that stands for port of sandbox id: DialPort(id, port) reaches it while
// it is open, whatever else listens on the host. It is how tests of the
// layers above give two sandboxes servers on the same port. The sandbox
// need not exist yet.
func (b *Backend) Listen(id string, port int) (net.Listener, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	k := portKey{id, port}
	b.ports.mu.Lock()
	if b.ports.m == nil {
		b.ports.m = map[portKey]string{}
	}
	b.ports.m[k] = ln.Addr().String()
	b.ports.mu.Unlock()
	return &registered{Listener: ln, drop: func() {
		b.ports.mu.Lock()
		if b.ports.m[k] == ln.Addr().String() {
			delete(b.ports.m, k)
		}
		b.ports.mu.Unlock()
	}}, nil
}

type registered struct {
	net.Listener
	once sync.Once
	drop func()
}

func (r *registered) Close() error {
	r.once.Do(r.drop)
	return r.Listener.Close()
}

// DialPort connects to what Listen registered for the sandbox's port, or
// else to that port on the host's loopback: the fake's execs are host
// processes, so what they listen on is the host's (the fake isolates
// nothing). ErrConflict when the sandbox is not running.
func (b *Backend) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, errdefs.Invalid("port %d: want 1 to 65535", port)
	}
	st, err := b.Inspect(ctx, id)
	if err != nil {
		return nil, err
	}
	if st.State != backend.StateRunning {
		return nil, errdefs.New(errdefs.ErrConflict, "sandbox_not_running", "fake: sandbox %s is %s, not running", id, st.State)
	}
	b.ports.mu.Lock()
	addr, ok := b.ports.m[portKey{id, port}]
	b.ports.mu.Unlock()
	if !ok {
		addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	}
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("fake: sandbox %s port %d: %w", id, port, err)
	}
	return c, nil
}
