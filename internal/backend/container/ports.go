package container

import (
	"context"
	"fmt"
	"net"
	"strconv"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/netns"
)

var _ backend.PortDialer = (*Container)(nil)

// DialPort connects to 127.0.0.1:port inside the sandbox's network
// namespace (NetNS, netns.go), which every container has (loopback only,
// unless the node attached a veth): no policy stands in the way, and
// nothing of the host's loopback is reachable this way. Not into a gVisor
// sandbox (NetNS).
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
