package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/bench/internal/benchup"
	"github.com/warrenhq/warren/internal/daemon"
)

// runCreate times sequential creates through `warren up` (in this
// process, with a network of its own) for each policy, interleaved by
// round, and deletes untimed.
func runCreate(rounds int) error {
	const n = 30
	dir, err := benchup.TempDir("bench-network-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := upWarren(ctx, dir, &daemon.NetworkConfig{Name: "bench", Pool: "10.213.250.0/24", DNSUpstream: "127.0.0.1:1"})
	if err != nil {
		return err
	}
	nodes, err := c.ListNodes(ctx)
	if err != nil {
		return err
	}
	if len(nodes) != 1 || !nodes[0].Network {
		return fmt.Errorf("the node has no sandbox network: %v", nodes)
	}
	peers := []struct {
		name string
		net  *api.NetworkPolicy
	}{
		{"no network", nil},
		{"none", &api.NetworkPolicy{Mode: api.NetworkNone}},
		{"allowlist", &api.NetworkPolicy{Allow: []string{"pypi.org", "*.pythonhosted.org", "github.com", "198.51.100.0/24:443"}}},
		{"open", &api.NetworkPolicy{Mode: api.NetworkOpen}},
	}
	p50 := make([][]float64, len(peers))
	mean := make([][]float64, len(peers))
	// One warm-up create per peer.
	for _, p := range peers {
		sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "busybox", Network: p.net})
		if err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
		c.DeleteSandbox(ctx, sb.ID)
	}
	for r := 0; r < rounds; r++ {
		for i, p := range peers {
			var ds []float64
			var ids []string
			for range n {
				t0 := time.Now()
				sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "busybox", Network: p.net,
					Resources: api.Resources{CPU: 0.1, Memory: 64 << 20}})
				if err != nil {
					return fmt.Errorf("%s: %w", p.name, err)
				}
				ds = append(ds, float64(time.Since(t0).Microseconds())/1000)
				ids = append(ids, sb.ID)
			}
			for _, id := range ids {
				c.DeleteSandbox(ctx, id)
			}
			p50[i] = append(p50[i], median(ds))
			var sum float64
			for _, d := range ds {
				sum += d
			}
			mean[i] = append(mean[i], sum/float64(len(ds)))
		}
	}
	fmt.Printf("   %d sequential creates per peer and round, %d rounds: median (min-max) over rounds\n", n, rounds)
	fmt.Printf("   %-12s %22s %22s %14s\n", "peer", "p50", "mean", "mean / none")
	base := median(mean[1])
	for i, p := range peers {
		fmt.Printf("   %-12s %22s %22s %13.2fx\n", p.name, medianSpread(p50[i], "%.1fms"), medianSpread(mean[i], "%.1fms"), median(mean[i])/base)
	}
	return nil
}
