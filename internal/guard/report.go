package guard

import (
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// Enforced names what every container and FnCall sandbox gets from this
// package on any host (see Harden and DeniedIoctls), for `warren node ls`.
func Enforced() []string {
	return []string{"seccomp", "no-new-privs", "capabilities", "masked-paths", "ioctl-filter", "socket-filter"}
}

// LSM is a Linux security module as a node reports it: whether the host
// runs it and whether warren applies it to sandboxes.
type LSM struct {
	Name    string
	Active  bool
	Applied bool
	Note    string
}

// LSMs reports Landlock and AppArmor on this host. Neither is applied
// yet: runc 1.1 has no Landlock support, and warren's own exec launcher
// (which will apply it to every sandbox process) is not built yet; no
// AppArmor profile is loaded where AppArmor runs. Detection does not
// need securityfs: Landlock answers its ABI version, AppArmor says
// whether it is enabled in its module parameters.
func LSMs() []LSM {
	active := map[string]bool{}
	if b, err := os.ReadFile("/sys/kernel/security/lsm"); err == nil {
		for _, n := range strings.Split(strings.TrimSpace(string(b)), ",") {
			active[n] = true
		}
	}
	var out []LSM
	ll := LSM{Name: "landlock", Note: "not applied: needs warren's own exec launcher (runc 1.1 has no Landlock)"}
	if v, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION); errno == 0 && int(v) > 0 {
		ll.Active = true
	} else {
		ll.Note = "not in this kernel, or disabled"
	}
	out = append(out, ll)
	aa := LSM{Name: "apparmor", Note: "not running on this host"}
	if b, err := os.ReadFile("/sys/module/apparmor/parameters/enabled"); err == nil && strings.TrimSpace(string(b)) == "Y" &&
		(active["apparmor"] || len(active) == 0) {
		aa.Active = true
		aa.Note = "not applied: no warren profile yet"
	}
	out = append(out, aa)
	return out
}
