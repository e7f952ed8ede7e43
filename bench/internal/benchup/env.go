package benchup

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/client"
)

// DebianPython is where scripts/build-runtime-images leaves the
// debian-python@12 root filesystem.
const DebianPython = "/var/cache/warren/images/debian-python-12"

// Env makes the environment a benchmark measures and returns its ref:
// "busybox" for "" or "busybox" (always there), else a one-layer
// environment built from the root filesystem in rootfs (through the API,
// as `warren layer build` does), named after the directory as
// scripts/build-runtime-images names them: .../debian-python-12 is
// debian-python@12.
func Env(ctx context.Context, c *client.Client, rootfs string) (string, error) {
	if rootfs == "" || rootfs == "busybox" {
		return "busybox", nil
	}
	if _, err := os.Stat(rootfs); err != nil {
		return "", err
	}
	name, version := filepath.Base(rootfs), "1"
	if i := strings.LastIndexByte(name, '-'); i > 0 && i < len(name)-1 {
		name, version = name[:i], name[i+1:]
	}
	if _, err := c.BuildLayerFromPath(ctx, client.LayerSpec{Name: name, Version: version, Kind: api.LayerBase}, rootfs); err != nil {
		return "", fmt.Errorf("layer from %s: %w", rootfs, err)
	}
	if _, err := c.CreateEnvironment(ctx, api.CreateEnvironmentRequest{Name: name, Version: version, Base: name + "@" + version}); err != nil {
		return "", err
	}
	return name + "@" + version, nil
}

// Accel is what the node behind c says its microVMs run on: the
// accelerator ("kvm", "tcg") and why; an error if it runs none (then why
// not, from its problems).
func Accel(ctx context.Context, c *client.Client, backend string) (string, string, error) {
	nodes, err := c.ListNodes(ctx)
	if err != nil {
		return "", "", err
	}
	for _, n := range nodes {
		for _, m := range n.Machines {
			if m.Backend == backend {
				return m.Accel, m.Reason, nil
			}
		}
		return "", "", fmt.Errorf("node %s runs no %s sandboxes: %v", n.ID, backend, n.Problems)
	}
	return "", "", fmt.Errorf("no node")
}
