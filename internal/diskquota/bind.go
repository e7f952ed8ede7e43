package diskquota

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// Bind runs f, which mounts something that writes into a directory
// limited to l (the sandbox's overlayfs), so that those writes are held to
// the limit.
//
// Why: ext4 (any VFS quota) lets a writer with CAP_SYS_RESOURCE pass hard
// limits, and overlayfs writes to its upper dir with its mounter's
// credentials, which for the agent are root's. So on ext4, f runs on an OS
// thread whose effective capabilities lack CAP_SYS_RESOURCE, and the
// overlay records those. btrfs qgroups and xfs project quotas bind root
// too: there, and for a zero l, f just runs.
func (q *Quota) Bind(l Limit, f func() error) error {
	if l.IsZero() || q.mech != Ext4 {
		return f()
	}
	return withoutResourceCap(f)
}

// withoutResourceCap runs f on a fresh OS thread with CAP_SYS_RESOURCE
// dropped from its effective set. The thread is never handed back to the
// Go scheduler: it exits with the goroutine.
func withoutResourceCap(f func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // no Unlock: the thread dies with us
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			done <- fmt.Errorf("capget: %w", err)
			return
		}
		data[unix.CAP_SYS_RESOURCE/32].Effective &^= 1 << (unix.CAP_SYS_RESOURCE % 32)
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			done <- fmt.Errorf("capset without CAP_SYS_RESOURCE: %w", err)
			return
		}
		done <- f()
	}()
	return <-done
}
