package benchup

import (
	"context"
	"path/filepath"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/client"
)

// Populate creates n sandboxes from req, conc at a time, and runs setup
// on each (i from 0); it returns the first error. The sandboxes are the
// caller's to delete (DeleteAll).
func Populate(ctx context.Context, c *client.Client, n, conc int, req api.CreateSandboxRequest, setup func(i int, sb *api.Sandbox) error) error {
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, conc)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			sb, err := c.CreateSandbox(ctx, req)
			if err == nil && setup != nil {
				err = setup(i, sb)
			}
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// DeleteAll deletes every sandbox c lists, ignoring errors: a bench's
// cleanup.
func DeleteAll(c *client.Client) {
	sbs, _ := c.ListSandboxes(context.Background(), client.ListOptions{})
	for _, sb := range sbs {
		c.DeleteSandbox(context.Background(), sb.ID)
	}
}

// Memory is what Integrate measured.
type Memory struct {
	Integral  float64 // GB x s
	Peak, End int64   // bytes
}

// Integrate reads the memory charged to node's sandboxes (Charged of
// /warren/<node>) every second for d and integrates it.
func Integrate(node string, d time.Duration) (Memory, error) {
	var m Memory
	start := time.Now()
	last := start
	for time.Since(start) < d {
		time.Sleep(time.Second)
		b, err := Charged(filepath.Join("/warren", node))
		if err != nil {
			return m, err
		}
		now := time.Now()
		m.Integral += float64(b) / 1e9 * now.Sub(last).Seconds()
		m.Peak, m.End, last = max(m.Peak, b), b, now
	}
	return m, nil
}
