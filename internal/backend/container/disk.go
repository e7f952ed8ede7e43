package container

import (
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/diskquota"
)

var _ backend.DiskLimiter = (*Container)(nil)

// DiskQuota says how sandboxes' writable layers are limited here: by what
// the filesystem of <StateDir>/sandboxes offers (package diskquota). Each
// sandbox directory, which holds the overlay's upper and work dirs, is
// one limited tree: a btrfs subvolume with a qgroup, or a directory with
// its own xfs or ext4 project quota.
func (c *Container) DiskQuota() backend.DiskQuota {
	return backend.DiskQuota{
		Mechanism: string(c.quota.Mechanism()),
		Inodes:    c.quota.Inodes(),
		Reason:    c.quota.Reason(),
	}
}

func diskLimit(r backend.Resources) diskquota.Limit {
	return diskquota.Limit{Bytes: r.Disk, Inodes: r.DiskInodes}
}
