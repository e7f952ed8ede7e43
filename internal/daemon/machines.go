package daemon

import (
	"log/slog"
	"path/filepath"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/backend/microvm"
	"github.com/warrenhq/warren/internal/image"
)

// MachineConfig configures the node's QEMU backends (microvm, vm).
type MachineConfig struct {
	// Kernel is the guest kernel: a vmlinuz or an unpacked
	// linux-image package (default microvm.DefaultKernel(): warren's
	// own where scripts/build-guest-kernel built it, else Debian's).
	Kernel string
	// DAX attaches layers on virtio-pmem with DAX: guests share the
	// host's page cache of each layer.
	DAX bool
	// Off runs no microVMs or VMs on this node.
	Off bool
}

// machineBackends are the node's QEMU backends. One the host cannot run
// (no QEMU, no guest kernel) is still returned: the node reports why.
func machineBackends(nodeDir, nodeID string, cfg MachineConfig, mounts *image.Mounts, log *slog.Logger) []backend.Backend {
	if cfg.Off {
		return nil
	}
	var bs []backend.Backend
	for _, kind := range []string{microvm.KindMicroVM, microvm.KindVM} {
		m, err := microvm.New(microvm.Config{
			Kind:         kind,
			StateDir:     filepath.Join(nodeDir, kind),
			Kernel:       cfg.Kernel,
			CgroupParent: "/warren/" + nodeID + "/" + kind,
			DAX:          cfg.DAX,
			Mounts:       mounts,
		})
		if err != nil {
			log.Warn("machine backend", "backend", kind, "err", err)
			continue
		}
		bs = append(bs, m)
	}
	return bs
}
