package daemon

import (
	"log/slog"
	"path/filepath"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/backend/microvm"
	"github.com/warrenhq/warren/internal/image"
)

// MachineConfig configures the node's QEMU backends (microvm).
type MachineConfig struct {
	// Kernel is the guest kernel: a vmlinuz or an unpacked
	// linux-image package (default microvm.DefaultKernel, where
	// scripts/fetch-guest-kernel puts Debian's).
	Kernel string
	// DAX attaches layers on virtio-pmem with DAX: guests share the
	// host's page cache of each layer.
	DAX bool
	// Off runs no microVMs on this node.
	Off bool
}

// machineBackends are the node's QEMU backends. One the host cannot run
// (no QEMU, no guest kernel) is still returned: the node reports why.
func machineBackends(nodeDir, nodeID string, cfg MachineConfig, mounts *image.Mounts, log *slog.Logger) []backend.Backend {
	if cfg.Off {
		return nil
	}
	m, err := microvm.New(microvm.Config{
		StateDir:     filepath.Join(nodeDir, "microvm"),
		Kernel:       cfg.Kernel,
		CgroupParent: "/warren/" + nodeID + "/vm",
		DAX:          cfg.DAX,
		Mounts:       mounts,
	})
	if err != nil {
		log.Warn("microvm backend", "err", err)
		return nil
	}
	return []backend.Backend{m}
}
