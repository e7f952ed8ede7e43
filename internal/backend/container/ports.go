package container

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/netns"
)

var (
	_ backend.PortDialer = (*Container)(nil)
	_ backend.NetNSer    = (*Container)(nil)
)

// NetNS opens the network namespace of the sandbox's init. The init is
// checked after the open, by pid and start time: a pid the init left and
// another process took is never mistaken for the sandbox's. ErrConflict
// when the sandbox is not running.
func (c *Container) NetNS(ctx context.Context, id string) (*os.File, error) {
	s, err := c.get(id)
	if err != nil {
		return nil, err
	}
	notRunning := errdefs.New(errdefs.ErrConflict, "sandbox_not_running", "sandbox %s is not running", id)
	if s.init.pid <= 0 || c.created(id) {
		return nil, notRunning
	}
	f, err := os.Open("/proc/" + strconv.Itoa(s.init.pid) + "/ns/net")
	if err != nil {
		if !s.init.alive() {
			return nil, notRunning
		}
		return nil, fmt.Errorf("network namespace of %s: %w", id, err)
	}
	if !s.init.alive() { // after the open: f is the init's, or the init is gone
		f.Close()
		return nil, notRunning
	}
	return f, nil
}

// DialPort connects to 127.0.0.1:port inside the sandbox's network
// namespace, which every container has (loopback only, unless the node
// attached more): no policy stands in the way, and nothing of the host's
// loopback is reachable this way.
func (c *Container) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, errdefs.Invalid("port %d: want 1 to 65535", port)
	}
	ns, err := c.NetNS(ctx, id)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	conn, err := netns.Dial(ctx, ns, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return nil, fmt.Errorf("sandbox %s port %d: %w", id, port, err)
	}
	return conn, nil
}
