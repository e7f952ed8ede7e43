package guard

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
)

// AppArmorProfile is the profile every sandbox process runs under where
// the host runs AppArmor: the container's init (runc applies it from the
// OCI spec) and every process an exec starts (warren-enter asks for it on
// exec). Its rules are Docker's docker-default, which Docker's users have
// run for a decade, less what warren does not need: files and sockets
// stay open (the other walls decide them), and on top of them it denies
// mounts, writes into /proc outside a process's own entries and
// /proc/sys/kernel/shm*, writes into /sys outside the cgroup tree, any
// access to kcore, sysrq-trigger, firmware, powercap and securityfs, and
// changing profile: no rule allows change_profile, so a process cannot
// leave it. Signals and ptrace reach only processes under the same
// profile; unconfined ones (the platform: runc, the agent) may signal in.
const AppArmorProfile = "warren-default"

// appArmorPolicy is the profile's source, for apparmor_parser. It needs
// no include from the host's /etc/apparmor.d.
const appArmorPolicy = `# warren's sandbox profile (internal/guard/apparmor.go); loaded by the node agent.
@{PROC}=/proc/

profile warren-default flags=(attach_disconnected,mediate_deleted) {
  network,
  capability,
  file,
  umount,

  signal (receive) peer=unconfined,
  signal (send,receive) peer=warren-default,

  deny @{PROC}/* w,
  deny @{PROC}/{[^1-9],[^1-9][^0-9],[^1-9s][^0-9y][^0-9s],[^1-9][^0-9][^0-9][^0-9/]*}/** w,
  deny @{PROC}/sys/[^k]** w,
  deny @{PROC}/sys/kernel/{?,??,[^s][^h][^m]**} w,
  deny @{PROC}/sysrq-trigger rwklx,
  deny @{PROC}/kcore rwklx,

  deny mount,

  deny /sys/[^f]*/** wklx,
  deny /sys/f[^s]*/** wklx,
  deny /sys/fs/[^c]*/** wklx,
  deny /sys/fs/c[^g]*/** wklx,
  deny /sys/fs/cg[^r]*/** wklx,
  deny /sys/firmware/** rwklx,
  deny /sys/devices/virtual/powercap/** rwklx,
  deny /sys/kernel/security/** rwklx,

  ptrace (trace,read,tracedby,readby) peer=warren-default,
}
`

// AppArmorEnabled says whether this kernel runs AppArmor: built in,
// enabled, and among the active LSMs where the kernel lists them.
func AppArmorEnabled() bool {
	b, err := os.ReadFile("/sys/module/apparmor/parameters/enabled")
	if err != nil || strings.TrimSpace(string(b)) != "Y" {
		return false
	}
	lsms, err := os.ReadFile("/sys/kernel/security/lsm")
	if err != nil {
		return true // no securityfs to ask; the module says it is on
	}
	for _, n := range strings.Split(strings.TrimSpace(string(lsms)), ",") {
		if n == "apparmor" {
			return true
		}
	}
	return false
}

// errNoAppArmor is LoadAppArmor's answer on hosts without AppArmor.
var errNoAppArmor = errors.New("not running on this host")

// LoadAppArmor loads (or replaces) warren's profile into the kernel with
// apparmor_parser, once per process, and returns its name for the OCI
// spec and warren-enter. It fails on hosts without AppArmor, and where
// AppArmor runs but the profile cannot be loaded (no apparmor_parser, no
// securityfs); callers then run sandboxes without it and say so
// (LSMs).
func LoadAppArmor() (string, error) { return loadAppArmor() }

var loadAppArmor = sync.OnceValues(func() (string, error) {
	if !AppArmorEnabled() {
		return "", errNoAppArmor
	}
	if _, err := os.Stat("/sys/kernel/security/apparmor"); err != nil {
		return "", errors.New("securityfs is not mounted at /sys/kernel/security")
	}
	parser, err := exec.LookPath("apparmor_parser")
	if err != nil {
		return "", errors.New("apparmor_parser not found (Debian: the apparmor package)")
	}
	// -r replaces a profile of the same name (an older agent's); -K
	// keeps the compiled policy out of the host's cache.
	var out bytes.Buffer
	cmd := exec.Command(parser, "-r", "-K")
	cmd.Stdin = strings.NewReader(appArmorPolicy)
	cmd.Stderr, cmd.Stdout = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("apparmor_parser: %v: %s", err, strings.TrimSpace(out.String()))
	}
	if !appArmorLoaded(AppArmorProfile) {
		return "", fmt.Errorf("apparmor_parser loaded nothing: %s is not among the kernel's profiles", AppArmorProfile)
	}
	return AppArmorProfile, nil
})

// appArmorLoaded says whether the kernel lists profile in enforce mode.
func appArmorLoaded(profile string) bool {
	b, err := os.ReadFile("/sys/kernel/security/apparmor/profiles")
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if l == profile+" (enforce)" {
			return true
		}
	}
	return false
}
