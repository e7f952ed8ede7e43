package guard

import "golang.org/x/sys/unix"

// Landlock filesystem rights (<linux/landlock.h>), as far as ABI 5.
const (
	llMakeChar  = 1 << 6
	llMakeBlock = 1 << 11
	llAllFS     = 1<<16 - 1 // EXECUTE .. IOCTL_DEV
)

// LandlockABI returns this kernel's Landlock ABI version, 0 without
// Landlock (not built in, or not among the active LSMs).
func LandlockABI() int {
	v, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if errno != 0 {
		return 0
	}
	return int(v)
}

// LandlockRules returns the Landlock filesystem rights a sandbox process
// is confined by (handled) and those it keeps beneath the sandbox's root
// (allowed): everything there but making device nodes, nothing anywhere
// else. ok is false where the kernel cannot apply them: Landlock missing,
// or ABI 1, which denies every rename and link across directories.
// warren-enter applies them to every process an exec starts.
func LandlockRules() (handled, allowed uint64, ok bool) {
	if LandlockABI() < 2 {
		return 0, 0, false
	}
	return llAllFS, llAllFS &^ (llMakeChar | llMakeBlock), true
}
