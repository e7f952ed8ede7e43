package container

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/warrenhq/warren/internal/backend"
)

var _ backend.Statser = (*Container)(nil)

// Stats reads the sandbox's cgroup counters through `runc events --stats`,
// which knows both cgroup versions.
func (c *Container) Stats(ctx context.Context, id string) (backend.Stats, error) {
	if _, err := c.get(id); err != nil {
		return backend.Stats{}, err
	}
	cmd := exec.CommandContext(ctx, c.cfg.RuncPath, "--root", c.cfg.RuncRoot, "events", "--stats", id)
	cmd.Env = c.runcEnv
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return backend.Stats{}, fmt.Errorf("runc events --stats: %s", strings.TrimSpace(stderr.String()+" "+err.Error()))
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
	if err := json.Unmarshal(stdout.Bytes(), &ev); err != nil {
		return backend.Stats{}, fmt.Errorf("runc events --stats: %w", err)
	}
	d := ev.Data
	return backend.Stats{
		CPU:        time.Duration(d.CPU.Usage.Total),
		Memory:     int64(d.Memory.Usage.Usage),
		MemoryPeak: int64(d.Memory.Usage.Max),
		PIDs:       int64(d.Pids.Current),
	}, nil
}
