package guard

import (
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

func TestHarden(t *testing.T) {
	spec := &specs.Spec{
		Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{Bounding: []string{"CAP_SYS_ADMIN"}}},
		Linux:   &specs.Linux{MaskedPaths: []string{"/proc/kcore", "/proc/extra"}},
	}
	if err := Harden(spec); err != nil {
		t.Fatal(err)
	}
	if !spec.Process.NoNewPrivileges {
		t.Error("no_new_privs not set")
	}
	caps := spec.Process.Capabilities
	for _, c := range []string{"CAP_SYS_ADMIN", "CAP_NET_RAW", "CAP_MKNOD", "CAP_SYS_PTRACE"} {
		if slices.Contains(caps.Bounding, c) || slices.Contains(caps.Effective, c) {
			t.Errorf("%s granted", c)
		}
	}
	if !slices.Contains(caps.Effective, "CAP_CHOWN") || len(caps.Inheritable) != 0 || len(caps.Ambient) != 0 {
		t.Errorf("caps = %+v, want CHOWN effective, no inheritable or ambient", caps)
	}
	for _, p := range []string{"/proc/kcore", "/proc/extra", "/sys/firmware", "/proc/keys"} {
		if !slices.Contains(spec.Linux.MaskedPaths, p) {
			t.Errorf("%s not masked", p)
		}
	}
	if n := len(spec.Linux.MaskedPaths); n != len(maskedPaths)+1 {
		t.Errorf("got %d masked paths, want %d (no duplicates)", n, len(maskedPaths)+1)
	}
	if !slices.Contains(spec.Linux.ReadonlyPaths, "/proc/sys") {
		t.Error("/proc/sys not read-only")
	}
	sc := spec.Linux.Seccomp
	if sc == nil || sc.DefaultAction != specs.ActErrno || len(sc.Syscalls) < 10 {
		t.Fatalf("seccomp = %+v, want the default profile", sc)
	}
	if len(sc.Architectures) != 1 {
		t.Errorf("architectures = %v, want the native one only", sc.Architectures)
	}
	// mount is allowed only with CAP_SYS_ADMIN, which we do not grant.
	for _, s := range sc.Syscalls {
		if s.Action == specs.ActAllow && slices.Contains(s.Names, "mount") {
			t.Errorf("mount allowed: %+v", s)
		}
	}
}

func TestHardenNonRoot(t *testing.T) {
	spec := &specs.Spec{Process: &specs.Process{User: specs.User{UID: 65534}}}
	if err := Harden(spec); err != nil {
		t.Fatal(err)
	}
	caps := spec.Process.Capabilities
	if len(caps.Bounding) == 0 || len(caps.Effective) != 0 || len(caps.Permitted) != 0 {
		t.Errorf("caps for uid 65534 = %+v, want bounding only", caps)
	}
}

func TestSeccompCopies(t *testing.T) {
	a, err := Seccomp()
	if err != nil {
		t.Fatal(err)
	}
	a.Syscalls[0].Names[0] = "changed"
	a.Syscalls = a.Syscalls[:1]
	b, err := Seccomp()
	if err != nil {
		t.Fatal(err)
	}
	if b.Syscalls[0].Names[0] == "changed" || len(b.Syscalls) == 1 {
		t.Error("Seccomp returned shared state")
	}
}

// LSMs reports Landlock and AppArmor as the kernel answers for them.
func TestLSMs(t *testing.T) {
	got := map[string]LSM{}
	for _, l := range LSMs() {
		got[l.Name] = l
	}
	abi, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if ll, ok := got["landlock"]; !ok || ll.Active != (errno == 0) || ll.Applied != (errno == 0 && abi >= 2) {
		t.Errorf("landlock: %+v, kernel says ABI %d, %v", ll, abi, errno)
	}
	if aa, ok := got["apparmor"]; !ok || aa.Active != AppArmorEnabled() || aa.Applied && !aa.Active {
		t.Errorf("apparmor: %+v, enabled %v", aa, AppArmorEnabled())
	}
}
