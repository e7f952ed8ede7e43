package guard

import (
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Every request number is either covered by ioctlCover or denied, never
// both, whatever its size, direction and upper bits.
func TestIoctlCover(t *testing.T) {
	cover := ioctlCover()
	t.Logf("%d prefixes cover the allowed requests", len(cover))
	if len(cover) > 16*len(deniedIoctls) {
		t.Errorf("%d prefixes for %d denied families: the cover is not minimal", len(cover), len(deniedIoctls))
	}
	for v := uint32(0); v < 1<<16; v++ {
		for _, hi := range []uint32{0, 0x40040000, 0xc0c00000} { // direction and size bits
			req := v | hi
			allowed := 0
			for _, c := range cover {
				if req&c.Mask == c.Value {
					allowed++
				}
			}
			denied := false
			for _, d := range deniedIoctls {
				denied = denied || req&d.Mask == d.Value
			}
			if denied && allowed > 0 || !denied && allowed != 1 {
				t.Fatalf("request %#x: denied %v, matched by %d prefixes", req, denied, allowed)
			}
		}
	}
}

// The profile handed to runc has no unconditional rule for the system
// calls whose arguments it checks (libseccomp would drop the checks).
func TestSeccompArgRules(t *testing.T) {
	p, err := Seccomp()
	if err != nil {
		t.Fatal(err)
	}
	conds := map[string]int{}
	for _, r := range p.Syscalls {
		for _, n := range r.Names {
			switch n {
			case "ioctl", "socket", "socketpair", "madvise", "prctl":
				if len(r.Args) != 1 || r.Action != specs.ActAllow {
					t.Errorf("%s: rule %+v, want an allow with one condition", n, r)
				}
				conds[n]++
			}
		}
	}
	if conds["ioctl"] != len(ioctlCover()) || conds["socket"] != len(socketFamilies) || conds["socketpair"] != 1 ||
		conds["madvise"] != 32 || conds["prctl"] != 32 {
		t.Errorf("conditional rules: %v", conds)
	}
}

// Every pid but 1 is covered by the 32-bit cover of {1}, once.
func TestPidCover(t *testing.T) {
	c := cover(32, []ArgMatch{{Mask: 0xffffffff, Value: 1}})
	if len(c) != 32 {
		t.Errorf("%d prefixes, want 32", len(c))
	}
	for _, pid := range []uint32{0, 1, 2, 3, 100, 1 << 20, 0x80000001, 0xffffffff} {
		n := 0
		for _, m := range c {
			if pid&m.Mask == m.Value {
				n++
			}
		}
		if want := map[bool]int{true: 0, false: 1}[pid == 1]; n != want {
			t.Errorf("pid %#x matched by %d prefixes, want %d", pid, n, want)
		}
	}
}
