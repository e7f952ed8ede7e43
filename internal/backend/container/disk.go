package container

import (
	"path/filepath"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/diskquota"
)

var _ backend.DiskLimiter = (*Container)(nil)

// DiskQuota says how sandboxes' writable layers are limited here: by what
// the filesystem of <StateDir>/sandboxes offers (package diskquota). Each
// sandbox directory, which holds the overlay's upper and work dirs, is
// one limited tree: a btrfs subvolume with a qgroup, or a directory with
// its own xfs or ext4 project quota.
//
// The limited tree is <sandbox dir>/rw, which holds the overlay's upper
// and work dirs (they must share it: overlayfs renames from one to the
// other). The platform's own files (the bundle, exec specs) stay outside
// it, so that a sandbox that filled its disk can still be exec'd into.
func (c *Container) DiskQuota() backend.DiskQuota {
	return backend.DiskQuota{
		Mechanism: string(c.quota.Mechanism()),
		Inodes:    c.quota.Inodes(),
		Reason:    c.quota.Reason(),
	}
}

// prepareWritable makes the sandbox's writable-layer directory, limited
// to r.Disk and r.DiskInodes, and returns it. ErrUnavailable (code
// disk_quota_unsupported) for a limit this host cannot enforce.
func (c *Container) prepareWritable(id string, r backend.Resources) (string, error) {
	rw := c.writableDir(id)
	if err := c.quota.Create(rw, diskLimit(r)); err != nil {
		return "", err
	}
	return rw, nil
}

// releaseWritable removes the writable-layer directory with its limit
// (subvolume and qgroup, or project quota). A sandbox without one (made
// before it existed, or never created) is fine.
func (c *Container) releaseWritable(id string) error {
	return c.quota.Remove(c.writableDir(id))
}

func diskLimit(r backend.Resources) diskquota.Limit {
	return diskquota.Limit{Bytes: r.Disk, Inodes: r.DiskInodes}
}

func (c *Container) writableDir(id string) string { return filepath.Join(c.dir(id), "rw") }
