package container

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/warrenhq/warren/internal/backend"
)

var _ backend.Statser = (*Container)(nil)

// Stats reads the sandbox's cgroup counters through `runc events --stats`,
// which knows both cgroup versions. runsc answers the same command from
// the sentry: its memory and processes are the sandbox's as gVisor counts
// them, not the host's tasks of the sentry.
func (c *Container) Stats(ctx context.Context, id string) (backend.Stats, error) {
	s, err := c.get(id)
	if err != nil {
		return backend.Stats{}, err
	}
	out, err := s.rt.output(ctx, "events", "--stats", id)
	if err != nil {
		return backend.Stats{}, err
	}
	var ev struct {
		Data struct {
			CPU struct {
				Usage struct {
					Total uint64 `json:"total"`
				} `json:"usage"`
			} `json:"cpu"`
			Memory struct {
				Usage struct {
					Usage uint64 `json:"usage"`
					Max   uint64 `json:"max"`
				} `json:"usage"`
			} `json:"memory"`
			Pids struct {
				Current uint64 `json:"current"`
			} `json:"pids"`
		} `json:"data"`
	}
	if err := json.Unmarshal(out, &ev); err != nil {
		return backend.Stats{}, fmt.Errorf("%s events --stats: %w", s.rt.name, err)
	}
	d := ev.Data
	return backend.Stats{
		CPU:        time.Duration(d.CPU.Usage.Total),
		Memory:     int64(d.Memory.Usage.Usage),
		MemoryPeak: int64(d.Memory.Usage.Max),
		PIDs:       int64(d.Pids.Current),
	}, nil
}
