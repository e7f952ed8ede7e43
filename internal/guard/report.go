package guard

import "fmt"

// Enforced names what every container and FnCall sandbox gets from this
// package on any host (see Harden and DeniedIoctls), for `warren node ls`.
func Enforced() []string {
	return []string{"seccomp", "no-new-privs", "capabilities", "masked-paths", "ioctl-filter", "socket-filter", "ksm-filter"}
}

// LSM is a Linux security module as a node reports it: whether the host
// runs it and whether warren applies it to sandboxes.
type LSM struct {
	Name    string
	Active  bool
	Applied bool
	Note    string
}

// LSMs reports Landlock and AppArmor on this host. Landlock is applied
// where the kernel has ABI 2 or later (LandlockRules): warren-enter
// confines every process an exec starts to the sandbox's root. Where
// AppArmor runs, its profile (AppArmorProfile) is loaded and applied.
func LSMs() []LSM {
	var out []LSM
	ll := LSM{Name: "landlock"}
	switch abi := LandlockABI(); {
	case abi == 0:
		ll.Note = "not in this kernel, or disabled"
	case abi == 1:
		ll.Active = true
		ll.Note = "not applied: ABI 1 denies renames across directories"
	default:
		ll.Active, ll.Applied = true, true
		ll.Note = fmt.Sprintf("ABI %d: exec'd processes reach nothing outside the sandbox's root, make no device nodes", abi)
	}
	out = append(out, ll)
	aa := LSM{Name: "apparmor", Note: "not running on this host"}
	if AppArmorEnabled() {
		aa.Active = true
		if p, err := LoadAppArmor(); err != nil {
			aa.Note = "not applied: " + err.Error()
		} else {
			aa.Applied = true
			aa.Note = "profile " + p + " on every sandbox process"
		}
	}
	out = append(out, aa)
	return out
}
