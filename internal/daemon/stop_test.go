package daemon

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/client"
)

// By default a stopped agent leaves its sandboxes running for the next one
// to re-adopt; with StopSandboxes it ends them all, and a call in flight
// hears sandbox_gone ("node shutting down") rather than an exit code.
func TestAgentStopSandboxes(t *testing.T) {
	ctx := context.Background()
	for _, stop := range []bool{false, true} {
		name := map[bool]string{false: "keep", true: "stop"}[stop]
		t.Run(name, func(t *testing.T) {
			c := startCluster(t, "")
			mod := func(cfg *AgentConfig) { cfg.StopSandboxes = stop }
			a, err := c.startAgentWith("agent", c.nodeToken(), true, mod)
			if err != nil {
				t.Fatal(err)
			}
			c.waitHealthy(a.id)
			sb, err := c.admin.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "busybox"})
			if err != nil {
				t.Fatal(err)
			}
			execErr := make(chan error, 1)
			go func() {
				_, err := c.admin.Exec(ctx, sb.ID, api.ExecRequest{Argv: []string{"sleep", "3"}})
				execErr <- err
			}()
			time.Sleep(300 * time.Millisecond)
			if err := a.stop(); err != nil {
				t.Fatalf("agent: %v", err)
			}
			err = <-execErr
			dataDir := filepath.Join(c.dir, "agent")
			records, _ := filepath.Glob(filepath.Join(dataDir, "node", "sandboxes", "*.json")) // not their journals
			_, dirErr := os.Stat(filepath.Join(dataDir, "node", "fake", sb.ID))
			if !stop {
				// The exec in flight may finish within the stop's grace, or
				// hear sandbox_lost when its node stops answering.
				if err != nil && !errors.Is(err, client.ErrUnavailable) {
					t.Errorf("exec across a plain agent stop: %v, want it to finish or sandbox_lost", err)
				}
				if len(records) != 1 || dirErr != nil {
					t.Fatalf("after a plain stop: %d records, sandbox dir %v; want both kept", len(records), dirErr)
				}
				// The next agent on the data dir re-adopts it.
				a2, err := c.startAgentWith("agent", c.nodeToken(), true)
				if err != nil {
					t.Fatal(err)
				}
				c.waitHealthy(a2.id)
				if got, err := c.admin.GetSandbox(ctx, sb.ID); err != nil || got.State != api.StateRunning {
					t.Errorf("re-adopted sandbox = %+v, %v; want running", got, err)
				}
				return
			}
			var ce *client.Error
			if !errors.As(err, &ce) || ce.Code != api.CodeSandboxGone || !errors.Is(err, client.ErrConflict) ||
				!strings.Contains(ce.Message, "node shutting down") {
				t.Errorf("exec in flight when the agent stopped with StopSandboxes: %v; want sandbox_gone, node shutting down", err)
			}
			if len(records) != 0 || !os.IsNotExist(dirErr) {
				t.Errorf("after a stop with StopSandboxes: %d records, sandbox dir %v; want none", len(records), dirErr)
			}
		})
	}
}
