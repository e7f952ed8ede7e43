package fncall

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"slices"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/guard"
)

// denied are the system calls a judged program has no use for and that
// widen the kernel surface it can reach: mounts and namespaces (user
// namespaces above all, the one namespace an unprivileged process can
// make), kernel modules and kexec, BPF, perf, io_uring, userfaultfd,
// keyrings, handles to other processes' memory and files, clock and host
// settings. The program already runs as an unprivileged uid with no
// capabilities and no_new_privs; this is the second wall, the same kind of
// list Docker's default profile denies.
var denied = []uintptr{
	unix.SYS_MOUNT, unix.SYS_UMOUNT2, unix.SYS_PIVOT_ROOT, unix.SYS_CHROOT,
	unix.SYS_FSOPEN, unix.SYS_FSCONFIG, unix.SYS_FSMOUNT, unix.SYS_FSPICK,
	unix.SYS_MOVE_MOUNT, unix.SYS_OPEN_TREE, unix.SYS_MOUNT_SETATTR,
	unix.SYS_UNSHARE, unix.SYS_SETNS,
	unix.SYS_SWAPON, unix.SYS_SWAPOFF, unix.SYS_REBOOT,
	unix.SYS_SETHOSTNAME, unix.SYS_SETDOMAINNAME,
	unix.SYS_KEXEC_LOAD, unix.SYS_KEXEC_FILE_LOAD,
	unix.SYS_INIT_MODULE, unix.SYS_FINIT_MODULE, unix.SYS_DELETE_MODULE,
	unix.SYS_CREATE_MODULE, unix.SYS_GET_KERNEL_SYMS, unix.SYS_QUERY_MODULE,
	unix.SYS_IOPL, unix.SYS_IOPERM, unix.SYS_MODIFY_LDT,
	unix.SYS_ACCT, unix.SYS_SETTIMEOFDAY, unix.SYS_CLOCK_SETTIME,
	unix.SYS_CLOCK_ADJTIME, unix.SYS_ADJTIMEX,
	unix.SYS_QUOTACTL, unix.SYS_QUOTACTL_FD, unix.SYS_LOOKUP_DCOOKIE,
	unix.SYS_NFSSERVCTL, unix.SYS_SYSLOG, unix.SYS_USELIB, unix.SYS_USTAT,
	unix.SYS_SYSFS, unix.SYS__SYSCTL, unix.SYS_VHANGUP,
	unix.SYS_BPF, unix.SYS_PERF_EVENT_OPEN, unix.SYS_USERFAULTFD,
	unix.SYS_IO_URING_SETUP, unix.SYS_IO_URING_ENTER, unix.SYS_IO_URING_REGISTER,
	unix.SYS_KEYCTL, unix.SYS_ADD_KEY, unix.SYS_REQUEST_KEY,
	unix.SYS_OPEN_BY_HANDLE_AT, unix.SYS_NAME_TO_HANDLE_AT,
	unix.SYS_KCMP, unix.SYS_PROCESS_VM_READV, unix.SYS_PROCESS_VM_WRITEV,
	unix.SYS_PIDFD_GETFD,
	unix.SYS_MBIND, unix.SYS_SET_MEMPOLICY, unix.SYS_MIGRATE_PAGES, unix.SYS_MOVE_PAGES,
	unix.SYS_FANOTIFY_INIT,
}

// nsFlags are clone's namespace flags: a clone that asks for any of them is
// refused like unshare.
const nsFlags = unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC |
	unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET |
	unix.CLONE_NEWCGROUP | unix.CLONE_NEWTIME

// seccomp_data offsets.
const (
	offNr   = 0
	offArch = 4
	offArg0 = 16 // low 32 bits on little-endian
	offArg1 = 24
)

// filter returns the program. Another architecture's system calls (i386
// through int 0x80) kill the process; x32 calls are refused; clone3 answers
// ENOSYS, so libc falls back to clone, whose flags the filter can read.
//
// The denied numbers are searched as a balanced binary tree, not a list: the
// kernel runs the filter once per system call number when it loads it (to
// cache the constant answers), with interrupts off, and a list of ~60 made
// that ~0.08 ms of every container's start.
func filter() ([]bpf.RawInstruction, error) {
	if runtime.GOARCH != "amd64" {
		return nil, fmt.Errorf("fncall seccomp filter: %s is not supported yet (amd64 only)", runtime.GOARCH)
	}
	p := []bpf.Instruction{
		bpf.LoadAbsolute{Off: offArch, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.AUDIT_ARCH_X86_64, SkipTrue: 1},
		bpf.RetConstant{Val: retKill},
		bpf.LoadAbsolute{Off: offNr, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: 0x40000000, SkipFalse: 1}, // x32
		bpf.RetConstant{Val: retEperm},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.SYS_CLONE3, SkipFalse: 1},
		bpf.RetConstant{Val: retEnosys},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.SYS_CLONE, SkipFalse: 4},
		bpf.LoadAbsolute{Off: offArg0, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: nsFlags, SkipFalse: 1},
		bpf.RetConstant{Val: retEperm},
		bpf.RetConstant{Val: retAllow},
	}
	p = append(p, argChecks()...)
	nrs := make([]uint32, len(denied))
	for i, nr := range denied {
		nrs[i] = uint32(nr)
	}
	slices.Sort(nrs)
	nrs = slices.Compact(nrs)
	p = append(p, searchTree(nrs)...)
	return bpf.Assemble(p)
}

// argChecks refuses what package guard refuses in every sandbox by
// argument (guard.DeniedIoctls, guard.SocketFamilies, guard.DeniedArgs), reading each
// argument's low 32 bits as the kernel does. Each block is skipped unless
// the number in A is its system call, and ends in a return.
func argChecks() []bpf.Instruction {
	var ioctl []bpf.Instruction
	for _, d := range guard.DeniedIoctls() {
		ioctl = append(ioctl,
			bpf.LoadAbsolute{Off: offArg1, Size: 4},
			bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: d.Mask},
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: d.Value, SkipFalse: 1},
			bpf.RetConstant{Val: retEperm})
	}
	ioctl = append(ioctl, bpf.RetConstant{Val: retAllow})
	family := func(allowed []uint32) []bpf.Instruction {
		b := []bpf.Instruction{bpf.LoadAbsolute{Off: offArg0, Size: 4}}
		for i, f := range allowed {
			b = append(b, bpf.JumpIf{Cond: bpf.JumpEqual, Val: f, SkipTrue: uint8(len(allowed) - i)})
		}
		return append(b, bpf.RetConstant{Val: retEperm}, bpf.RetConstant{Val: retAllow})
	}
	socket, socketpair := family(guard.SocketFamilies()), family([]uint32{unix.AF_UNIX})
	blocks := []struct {
		nr   uint32
		code []bpf.Instruction
	}{{unix.SYS_IOCTL, ioctl}, {unix.SYS_SOCKET, socket}, {unix.SYS_SOCKETPAIR, socketpair}}
	for _, d := range guard.DeniedArgs() {
		blocks = append(blocks, struct {
			nr   uint32
			code []bpf.Instruction
		}{d.Nr, []bpf.Instruction{
			bpf.LoadAbsolute{Off: offArg0 + 8*uint32(d.Arg), Size: 4},
			bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: d.Denied.Mask},
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: d.Denied.Value, SkipFalse: 1},
			bpf.RetConstant{Val: retEperm},
			bpf.RetConstant{Val: retAllow},
		}})
	}
	var p []bpf.Instruction
	for _, b := range blocks {
		p = append(p, bpf.JumpIf{Cond: bpf.JumpEqual, Val: b.nr, SkipFalse: uint8(len(b.code))})
		p = append(p, b.code...)
	}
	return p
}

const (
	retAllow  = unix.SECCOMP_RET_ALLOW
	retEperm  = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	retEnosys = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
	retKill   = unix.SECCOMP_RET_KILL_PROCESS
)

// searchTree returns code that, with the system call number in A, returns
// EPERM for the numbers in nrs (sorted) and ALLOW for the others.
func searchTree(nrs []uint32) []bpf.Instruction {
	if len(nrs) <= 3 {
		var p []bpf.Instruction
		for _, nr := range nrs {
			p = append(p, bpf.JumpIf{Cond: bpf.JumpEqual, Val: nr, SkipFalse: 1}, bpf.RetConstant{Val: retEperm})
		}
		return append(p, bpf.RetConstant{Val: retAllow})
	}
	mid := len(nrs) / 2
	left, right := searchTree(nrs[:mid]), searchTree(nrs[mid:])
	// Jumps are forward only and at most 255 instructions: the tree of a
	// few hundred numbers stays well inside.
	return append(append([]bpf.Instruction{
		bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: nrs[mid], SkipTrue: uint8(len(left))},
	}, left...), right...)
}

// seccompProgram is the filter as the kernel takes it, struct sock_filter
// after struct sock_filter, for the launcher to load into each container's
// pid 1 (which every run inherits) after no_new_privs.
func seccompProgram() ([]byte, error) {
	raw, err := filter()
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, 8*len(raw))
	for _, ins := range raw {
		out = binary.NativeEndian.AppendUint16(out, ins.Op)
		out = append(out, ins.Jt, ins.Jf)
		out = binary.NativeEndian.AppendUint32(out, ins.K)
	}
	return out, nil
}
