package fncall

import (
	"encoding/binary"
	"slices"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/guard"
)

// TestSeccompFilter runs the filter in a BPF VM for every system call
// number and a few clone flags, against what it is meant to decide.
func TestSeccompFilter(t *testing.T) {
	raw, err := filter()
	if err != nil {
		t.Skip(err)
	}
	ins := make([]bpf.Instruction, len(raw))
	for i, r := range raw {
		ins[i] = r.Disassemble()
	}
	vm, err := bpf.NewVM(ins)
	if err != nil {
		t.Fatal(err)
	}
	run := func(arch, nr uint32, arg0 uint64, arg1 ...uint64) uint32 {
		// struct seccomp_data is host-endian; the VM loads big-endian
		// words, so the test lays the fields out that way.
		d := make([]byte, 64)
		binary.BigEndian.PutUint32(d[offNr:], nr)
		binary.BigEndian.PutUint32(d[offArch:], arch)
		binary.BigEndian.PutUint32(d[offArg0:], uint32(arg0))
		if len(arg1) > 0 {
			binary.BigEndian.PutUint32(d[offArg1:], uint32(arg1[0]))
		}
		v, err := vm.Run(d)
		if err != nil {
			t.Fatal(err)
		}
		return uint32(v)
	}
	want := func(nr uint32, arg0 uint64) uint32 {
		switch {
		case nr >= 0x40000000:
			return retEperm
		case nr == unix.SYS_CLONE3:
			return retEnosys
		case nr == unix.SYS_CLONE && arg0&nsFlags != 0:
			return retEperm
		case slices.Contains(denied, uintptr(nr)):
			return retEperm
		case nr == unix.SYS_SOCKET && !slices.Contains(guard.SocketFamilies(), uint32(arg0)):
			return retEperm
		case nr == unix.SYS_SOCKETPAIR && arg0 != unix.AF_UNIX:
			return retEperm
		}
		return retAllow
	}
	for nr := uint32(0); nr < 600; nr++ {
		for _, arg0 := range []uint64{0, uint64(unix.SIGCHLD), unix.CLONE_NEWUSER | uint64(unix.SIGCHLD), unix.CLONE_NEWNS, unix.CLONE_VM | unix.CLONE_VFORK} {
			if got, w := run(unix.AUDIT_ARCH_X86_64, nr, arg0), want(nr, arg0); got != w {
				t.Errorf("syscall %d arg0 %#x: filter says %#x, want %#x", nr, arg0, got, w)
			}
		}
	}
	for _, c := range []struct {
		req  uint64
		want uint32
	}{
		{0x40049409, retEperm},         // FICLONE
		{0xdead000040049409, retEperm}, // FICLONE, junk above
		{0xc0c0586d, retEperm},         // XFS_IOC_SWAPEXT
		{0xc028660f, retEperm},         // EXT4_IOC_MOVE_EXT
		{unix.TCGETS, retAllow},
		{0x541b, retAllow},     // FIONREAD
		{0x80086601, retAllow}, // FS_IOC_GETFLAGS
	} {
		if got := run(unix.AUDIT_ARCH_X86_64, unix.SYS_IOCTL, 3, c.req); got != c.want {
			t.Errorf("ioctl %#x: filter says %#x, want %#x", c.req, got, c.want)
		}
	}
	for fam := uint64(0); fam < 64; fam++ {
		if got, w := run(unix.AUDIT_ARCH_X86_64, unix.SYS_SOCKET, fam|0xdead<<32), want(unix.SYS_SOCKET, fam); got != w {
			t.Errorf("socket family %d: filter says %#x, want %#x", fam, got, w)
		}
	}
	// KSM opt-ins (guard.DeniedArgs): by argument, low 32 bits.
	argAt := func(nr uint32, i int, v uint64) uint32 {
		d := make([]byte, 64)
		binary.BigEndian.PutUint32(d[offNr:], nr)
		binary.BigEndian.PutUint32(d[offArch:], unix.AUDIT_ARCH_X86_64)
		binary.BigEndian.PutUint32(d[offArg0+8*i:], uint32(v))
		r, err := vm.Run(d)
		if err != nil {
			t.Fatal(err)
		}
		return uint32(r)
	}
	for _, c := range []struct {
		nr   uint32
		arg  int
		v    uint64
		want uint32
	}{
		{unix.SYS_MADVISE, 2, unix.MADV_MERGEABLE, retEperm},
		{unix.SYS_MADVISE, 2, 0xdead<<32 | unix.MADV_MERGEABLE, retEperm},
		{unix.SYS_MADVISE, 2, unix.MADV_DONTNEED, retAllow},
		{unix.SYS_MADVISE, 2, unix.MADV_UNMERGEABLE, retAllow},
		{unix.SYS_PRCTL, 0, 67, retEperm}, // PR_SET_MEMORY_MERGE
		{unix.SYS_PRCTL, 0, unix.PR_SET_NAME, retAllow},
	} {
		if got := argAt(c.nr, c.arg, c.v); got != c.want {
			t.Errorf("syscall %d arg%d %#x: filter says %#x, want %#x", c.nr, c.arg, c.v, got, c.want)
		}
	}
	if got := run(unix.AUDIT_ARCH_X86_64, 0x40000000+1, 0); got != retEperm {
		t.Errorf("x32: %#x", got)
	}
	if got := run(unix.AUDIT_ARCH_I386, 1, 0); got != retKill {
		t.Errorf("i386: %#x", got)
	}
}
