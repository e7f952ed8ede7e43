package node

import (
	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/diskquota"
	"github.com/warrenhq/warren/internal/errdefs"
)

// diskQuotaOf returns how backend b limits a sandbox's disk; a backend
// that is no backend.DiskLimiter limits none.
func diskQuotaOf(b backend.Backend) backend.DiskQuota {
	if dl, ok := b.(backend.DiskLimiter); ok {
		dq := dl.DiskQuota()
		if dq.Mechanism == "" {
			dq.Mechanism = api.DiskQuotaNone
		}
		return dq
	}
	return backend.DiskQuota{Mechanism: api.DiskQuotaNone, Reason: "backend " + b.Name() + " has no disk limits"}
}

// nodeDiskQuota is the node's disk_quota: that of its container backend,
// the one whose sandboxes write to the host's disk, else of the first
// backend that limits disk, else none. why says what is missing when a
// backend that limits disk cannot on this host ("" otherwise).
func nodeDiskQuota(bs map[string]backend.Backend) (dq backend.DiskQuota, why string) {
	dq = backend.DiskQuota{Mechanism: api.DiskQuotaNone}
	pick := func(b backend.Backend) bool {
		if _, ok := b.(backend.DiskLimiter); !ok {
			return false
		}
		dq = diskQuotaOf(b)
		if dq.Mechanism == api.DiskQuotaNone {
			why = b.Name() + ": no disk limits: " + dq.Reason
		}
		return true
	}
	if b, ok := bs[api.BackendContainer]; ok && pick(b) {
		return dq, why
	}
	for _, name := range []string{api.BackendMicroVM, api.BackendVM, api.BackendFnCall} {
		if b, ok := bs[name]; ok && pick(b) {
			return dq, why
		}
	}
	return dq, why
}

// diskLimits checks a create's disk resources for backend b and fills in
// the node's default disk and the default inode limit. ErrInvalid for bad
// values; ErrUnavailable with api.CodeDiskQuotaUnsupported for a limit b
// cannot enforce on this node (never silently dropped).
func (a *Agent) diskLimits(b backend.Backend, r *api.Resources) error {
	dq := diskQuotaOf(b)
	switch {
	case r.Disk < 0 || r.DiskInodes < 0:
		return errdefs.Invalid("resources.disk %d, disk_inodes %d: must not be negative", r.Disk, r.DiskInodes)
	case r.Disk == 0 && a.cfg.Defaults.Disk > 0 && api.EnforcesDisk(dq.Mechanism, r.DiskInodes > 0):
		r.Disk = api.Quantity(a.cfg.Defaults.Disk)
	case r.Disk > 0 && r.Disk < 1<<20:
		return errdefs.Invalid("resources.disk %v: at least 1Mi", r.Disk)
	}
	switch {
	case r.Disk == 0 && r.DiskInodes > 0:
		return errdefs.Invalid("resources.disk_inodes %d: needs a resources.disk limit", r.DiskInodes)
	case r.Disk == 0:
		return nil
	case !api.EnforcesDisk(dq.Mechanism, r.DiskInodes > 0):
		what, why := "disk", dq.Reason
		if r.DiskInodes > 0 && dq.Mechanism != api.DiskQuotaNone {
			what, why = "inodes", dq.Mechanism+" has no inode limit (each inode's metadata counts against resources.disk): leave disk_inodes out"
		}
		return errdefs.New(errdefs.ErrUnavailable, api.CodeDiskQuotaUnsupported,
			"node %s cannot limit a sandbox's %s on backend %s: %s", a.cfg.ID, what, b.Name(), why)
	case r.DiskInodes == 0 && dq.Inodes:
		r.DiskInodes = diskquota.DefaultInodes(int64(r.Disk))
	}
	return nil
}
