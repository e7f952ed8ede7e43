package diskquota

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/osthread"
)

// Bind runs f, which mounts something that writes into a directory
// limited to l (the sandbox's overlayfs), so that those writes are held to
// the limit. With fsid >= 0, f also runs with filesystem uid and gid fsid
// (and every capability it had), which the overlay records as its
// mounter's: what a sandbox in a user namespace writes through idmapped
// layers must come from an id the mapping knows.
//
// Why: ext4 (any VFS quota) lets a writer with CAP_SYS_RESOURCE pass hard
// limits, and overlayfs writes to its upper dir with its mounter's
// credentials, which for the agent are root's. So on ext4, f runs on an OS
// thread whose effective capabilities lack CAP_SYS_RESOURCE, and the
// overlay records those. btrfs qgroups and xfs project quotas bind root
// too: there, and for a zero l, f keeps its capabilities. Either way f
// runs on an OS thread of its own that ends with it, which it may change
// for good (join a mount namespace: mountns.NS.Enter).
func (q *Quota) Bind(l Limit, fsid int, f func() error) error {
	return OnThread(fsid, !l.IsZero() && q.mech == Ext4, f)
}

// OnThread runs f on a fresh OS thread with filesystem uid and gid fsid
// (unless negative) and its effective capabilities raised to its
// permitted ones (setfsuid away from 0 drops the filesystem ones), minus
// CAP_SYS_RESOURCE if dropResource. The thread ends with f (osthread.Run).
func OnThread(fsid int, dropResource bool, f func() error) error {
	return osthread.Run(func() error {
		if fsid >= 0 {
			unix.Setfsuid(fsid)
			unix.Setfsgid(fsid)
		}
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			return fmt.Errorf("capget: %w", err)
		}
		data[0].Effective, data[1].Effective = data[0].Permitted, data[1].Permitted
		if dropResource {
			data[unix.CAP_SYS_RESOURCE/32].Effective &^= 1 << (unix.CAP_SYS_RESOURCE % 32)
		}
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			return fmt.Errorf("capset: %w", err)
		}
		return f()
	})
}
