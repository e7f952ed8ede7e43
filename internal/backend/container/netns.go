package container

import (
	"context"
	"fmt"
	"os"
	"strconv"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
)

var _ backend.NetNSer = (*Container)(nil)

// NetNS opens the network namespace of sandbox id's init. The check after
// the open makes sure the descriptor is the container's: a pid recycled
// between the lookup and the open fails it. ErrUnavailable for a gVisor
// sandbox, whose network is the sentry's own, not that namespace's.
func (c *Container) NetNS(ctx context.Context, id string) (*os.File, error) {
	s, err := c.get(id)
	if err != nil {
		return nil, err
	}
	if s.rt.gvisor() {
		return nil, errdefs.Unavailable("sandbox %s runs under gvisor, whose network stack is its own: the node cannot reach into it", id)
	}
	p := s.init // fixed once created, as exec reads it
	if !p.alive() {
		return nil, errdefs.New(errdefs.ErrConflict, "sandbox_not_running", "sandbox %s is not running", id)
	}
	f, err := os.Open("/proc/" + strconv.Itoa(p.pid) + "/ns/net")
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: network namespace: %w", id, err)
	}
	if !p.alive() {
		f.Close()
		return nil, errdefs.New(errdefs.ErrConflict, "sandbox_not_running", "sandbox %s is not running", id)
	}
	return f, nil
}
