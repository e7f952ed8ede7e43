package guard

import (
	"fmt"
	"slices"
	"sync"

	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// defaultCaps is Docker's default capability set minus CAP_NET_RAW (raw
// sockets: packet spoofing, ICMP floods) and CAP_MKNOD (device nodes are
// pointless behind the device cgroup and only widen the attack surface).
var defaultCaps = []string{
	"CAP_AUDIT_WRITE",
	"CAP_CHOWN",
	"CAP_DAC_OVERRIDE",
	"CAP_FOWNER",
	"CAP_FSETID",
	"CAP_KILL",
	"CAP_NET_BIND_SERVICE",
	"CAP_SETFCAP",
	"CAP_SETGID",
	"CAP_SETPCAP",
	"CAP_SETUID",
	"CAP_SYS_CHROOT",
}

// maskedPaths hide kernel interfaces that leak host information or allow
// side channels (kcore, timer_list, keys) or poke hardware (powercap, the
// RAPL energy counters behind CVE-2020-8694).
var maskedPaths = []string{
	"/proc/acpi",
	"/proc/asound",
	"/proc/interrupts",
	"/proc/kcore",
	"/proc/keys",
	"/proc/latency_stats",
	"/proc/sched_debug",
	"/proc/scsi",
	"/proc/timer_list",
	"/proc/timer_stats",
	"/sys/devices/virtual/powercap",
	"/sys/firmware",
}

// readonlyPaths stay readable (tools read them) but not writable, since a
// write would change the host kernel's state, not the sandbox's.
var readonlyPaths = []string{
	"/proc/bus",
	"/proc/fs",
	"/proc/irq",
	"/proc/sys",
	"/proc/sysrq-trigger",
}

// Capabilities returns the default capability set for a process running as
// uid. Inheritable and ambient sets stay empty so that exec'ing a file with
// file capabilities cannot widen them (CVE-2022-24769). A non-root process
// gets the set as its bounding set only, as it would on a normal host: its
// effective and permitted sets are empty.
func Capabilities(uid uint32) *specs.LinuxCapabilities {
	c := &specs.LinuxCapabilities{Bounding: slices.Clone(defaultCaps)}
	if uid == 0 {
		c.Effective = slices.Clone(defaultCaps)
		c.Permitted = slices.Clone(defaultCaps)
	}
	return c
}

// MaskedPaths returns the paths Harden masks.
func MaskedPaths() []string { return slices.Clone(maskedPaths) }

// ReadonlyPaths returns the paths Harden makes read-only.
func ReadonlyPaths() []string { return slices.Clone(readonlyPaths) }

// seccompProfile is computed once: converting moby's profile filters ~400
// syscall rules against the capability set and the kernel version.
var seccompProfile = sync.OnceValues(func() (*specs.LinuxSeccomp, error) {
	ref := &specs.Spec{Process: &specs.Process{Capabilities: Capabilities(0)}}
	p, err := seccomp.GetDefaultProfile(ref)
	if err != nil {
		return nil, err
	}
	// moby lists the native architecture first, then its compat ones
	// (x86 and x32 on amd64). Keep the native one only: compat syscalls
	// are a classic source of kernel bugs that sandboxed code has no need
	// for, and with them runc 1.1 spends ~110 ms of CPU compiling the
	// filter of every container (~5 ms without), which would dominate the
	// cost of a create.
	if len(p.Architectures) > 1 {
		p.Architectures = p.Architectures[:1]
	}
	ociArgRules(p)
	return p, nil
})

// Seccomp returns Docker's default seccomp profile (from moby/profiles)
// resolved for the default capability set and this host's kernel, with
// ioctl and socket narrowed (DeniedIoctls, SocketFamilies), for the
// native architecture only: a 32-bit (compat) syscall kills the process
// that makes it, so 32-bit binaries do not run. Each call returns a fresh
// copy the caller may modify.
func Seccomp() (*specs.LinuxSeccomp, error) {
	p, err := seccompProfile()
	if err != nil {
		return nil, fmt.Errorf("default seccomp profile: %w", err)
	}
	c := *p
	c.Architectures = slices.Clone(p.Architectures)
	c.Flags = slices.Clone(p.Flags)
	c.Syscalls = make([]specs.LinuxSyscall, len(p.Syscalls))
	for i, s := range p.Syscalls {
		s.Names = slices.Clone(s.Names)
		s.Args = slices.Clone(s.Args)
		c.Syscalls[i] = s
	}
	return &c, nil
}

// Harden applies warren's default containment to an OCI spec: the reduced
// capability set (for spec.Process.User.UID), no_new_privs, masked and
// read-only /proc and /sys paths, and the default seccomp profile. It
// replaces whatever capabilities and seccomp profile the spec had and adds
// to its masked and read-only paths. Every backend built on an OCI runtime
// (container, fncall) calls it last, after filling in the rest of the spec.
func Harden(spec *specs.Spec) error {
	if spec.Process == nil {
		spec.Process = &specs.Process{}
	}
	if spec.Linux == nil {
		spec.Linux = &specs.Linux{}
	}
	spec.Process.Capabilities = Capabilities(spec.Process.User.UID)
	spec.Process.NoNewPrivileges = true
	spec.Linux.MaskedPaths = union(spec.Linux.MaskedPaths, maskedPaths)
	spec.Linux.ReadonlyPaths = union(spec.Linux.ReadonlyPaths, readonlyPaths)
	sc, err := Seccomp()
	if err != nil {
		return err
	}
	spec.Linux.Seccomp = sc
	return nil
}

// union appends to a the elements of b it lacks.
func union(a, b []string) []string {
	for _, s := range b {
		if !slices.Contains(a, s) {
			a = append(a, s)
		}
	}
	return a
}
