package guard

import (
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// ArgMatch matches a system call argument whose low 32 bits, masked with
// Mask, equal Value. For the denied ioctls, masks cover the low 16 bits
// only (the request's type and number): a request with the same type and
// number but another size or direction is refused too, and whatever a
// caller puts in the register's upper half (the kernel reads a 32-bit
// int) changes nothing.
type ArgMatch struct {
	Name        string
	Mask, Value uint32
}

// deniedIoctls let a workload move blocks between files behind the
// filesystem's back (DSec saw XFS_IOC_SWAPEXT used to reach protected
// files, and it corrupted XFS), share blocks across files, or create
// btrfs subvolumes (each with a qgroup outside the sandbox's disk limit).
// Each denied family costs runc's libseccomp about 16 rules to compile
// into every create and exec (see ociArgRules), so whole types are
// denied where nothing a sandbox runs needs them (XFS's own tools), and
// requests that already need a capability sandboxes lack are left to the
// kernel (EXT4_IOC_SWAP_BOOT: CAP_SYS_ADMIN). TIOCSTI is not here: a
// sandbox shares no terminal with anything but itself.
var deniedIoctls = []ArgMatch{
	// Type 0x94: btrfs's ioctls and the generic FICLONE, FICLONERANGE
	// and FIDEDUPERANGE that grew out of them.
	{"FICLONE, FICLONERANGE, FIDEDUPERANGE and every btrfs ioctl (type 0x94)", 0xff00, 0x9400},
	// Type 'X': XFS's, XFS_IOC_SWAPEXT and XFS_IOC_EXCHANGE_RANGE among them.
	{"every XFS ioctl (type 'X'), XFS_IOC_SWAPEXT among them", 0xff00, 0x5800},
	{"EXT4_IOC_MOVE_EXT", 0xffff, 0x660f},
}

// DeniedIoctls returns the ioctl requests every sandbox's filter refuses.
func DeniedIoctls() []ArgMatch { return slices.Clone(deniedIoctls) }

// socketFamilies are the only address families a sandbox may open
// sockets in: local, IPv4, IPv6 and netlink (which `ip` and glibc's
// resolver use). The others are rarely used kernel code (RDS, TIPC, CAN,
// XDP, ...) behind many past local privilege escalations, or reach past
// the sandbox's network namespace (AF_VSOCK to the hypervisor, AF_PACKET
// under the firewall).
var socketFamilies = []uint32{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6, unix.AF_NETLINK}

// SocketFamilies returns the address families socket(2) may ask for.
// socketpair(2) may ask for AF_UNIX only.
func SocketFamilies() []uint32 { return slices.Clone(socketFamilies) }

// deniedArgs are values of one argument of a system call a sandbox may
// not pass: each system call is allowed for every other value of it (a
// cover, as for ioctl), compared on the low 32 bits, which are all the
// kernel reads of an int argument.
//
// KSM (kernel same-page merging) merges equal pages of every process
// that opted in, across tenants, and a write to a merged page takes
// measurably longer: a sandbox that could opt itself in could learn
// whether any other sandbox on the node holds a page of given content
// (a key, a test's expected output). So no sandbox opts itself in:
// sandboxes of a project with memory merging are opted in by the
// platform, and only with sandboxes of the same project (backend
// Spec.MemoryMerge).
var deniedArgs = []DeniedArg{
	{"madvise", unix.SYS_MADVISE, 2, ArgMatch{"MADV_MERGEABLE", 0xffffffff, unix.MADV_MERGEABLE}},
	{"prctl", unix.SYS_PRCTL, 0, ArgMatch{"PR_SET_MEMORY_MERGE", 0xffffffff, prSetMemoryMerge}},
}

// DeniedArg is one value of one argument of a system call that no
// sandbox may pass (deniedArgs).
type DeniedArg struct {
	Syscall string
	Nr      uint32 // its number on amd64
	Arg     uint   // which argument, from 0
	Denied  ArgMatch
}

// DeniedArgs returns the system call arguments every sandbox's filter
// refuses, besides ioctls (FnCall's own filter refuses them too).
func DeniedArgs() []DeniedArg { return slices.Clone(deniedArgs) }

// prSetMemoryMerge is prctl's PR_SET_MEMORY_MERGE (Linux 6.4).
const prSetMemoryMerge = 67

// ociArgRules rewrites profile's rules for ioctl, socket and socketpair
// into allowlists that refuse DeniedIoctls and every family but
// SocketFamilies, and those of deniedArgs into allowlists of every
// other value. libseccomp drops a system call's conditional rules
// when it also has an unconditional one (whatever their actions), so a
// deny rule next to moby's plain "ioctl: allow" would be silently
// ignored: ioctl is allowed instead by a set of masked prefixes that
// covers every request number outside the denied ones. runc turns two
// conditions on one argument into two rules (an OR), so each rule here
// has a single condition.
func ociArgRules(p *specs.LinuxSeccomp) {
	replaced := []string{"ioctl", "socket", "socketpair"}
	allowed := map[string]bool{} // of deniedArgs' system calls, those the profile allows
	for _, d := range deniedArgs {
		replaced = append(replaced, d.Syscall)
	}
	var rules []specs.LinuxSyscall
	for _, r := range p.Syscalls {
		r.Names = slices.DeleteFunc(r.Names, func(n string) bool {
			if !slices.Contains(replaced, n) {
				return false
			}
			allowed[n] = allowed[n] || r.Action == specs.ActAllow && len(r.Args) == 0
			return true
		})
		if len(r.Names) > 0 {
			rules = append(rules, r)
		}
	}
	allow := func(name string, arg uint, op specs.LinuxSeccompOperator, v, v2 uint64) {
		rules = append(rules, specs.LinuxSyscall{Names: []string{name}, Action: specs.ActAllow,
			Args: []specs.LinuxSeccompArg{{Index: arg, Value: v, ValueTwo: v2, Op: op}}})
	}
	for _, c := range ioctlCover() {
		allow("ioctl", 1, specs.OpMaskedEqual, uint64(c.Mask), uint64(c.Value))
	}
	// A full 64-bit comparison: junk in the upper half fails it, so it
	// cannot smuggle a denied family past an allowlist.
	for _, f := range socketFamilies {
		allow("socket", 0, specs.OpEqualTo, uint64(f), 0)
	}
	allow("socketpair", 0, specs.OpEqualTo, unix.AF_UNIX, 0)
	for _, d := range deniedArgs {
		if !allowed[d.Syscall] {
			continue
		}
		for _, c := range cover(32, []ArgMatch{d.Denied}) {
			allow(d.Syscall, d.Arg, specs.OpMaskedEqual, uint64(c.Mask), uint64(c.Value))
		}
	}
	p.Syscalls = rules
}

// ioctlCover returns masked prefixes of the 16-bit (type, number) space
// that together match every request but the denied ones.
func ioctlCover() []ArgMatch { return cover(16, deniedIoctls) }

// cover returns masked prefixes of the low width bits that together match
// every value but the denied ones, as a routing table's CIDR blocks cover
// an address range with holes: a binary trie, one prefix for each largest
// subtree holding no denied value (about width prefixes per denied value).
// Bits above width are outside every mask: they match anything.
func cover(width int, deniedSet []ArgMatch) []ArgMatch {
	all := uint32(1<<width - 1)
	if width == 32 {
		all = 0xffffffff
	}
	denied := func(v, mask uint32) bool { // does the block v/mask hold a denied value?
		for _, d := range deniedSet {
			m := mask & d.Mask
			if v&m == d.Value&m {
				return true
			}
		}
		return false
	}
	full := func(v, mask uint32) bool { // is the whole block v/mask denied?
		for _, d := range deniedSet {
			if d.Mask&^mask == 0 && v&d.Mask == d.Value {
				return true
			}
		}
		return false
	}
	var out []ArgMatch
	var walk func(v uint32, bits int)
	walk = func(v uint32, bits int) {
		mask := all &^ (uint32(1)<<(width-bits) - 1)
		if bits == 0 {
			mask = 0
		}
		switch {
		case full(v, mask):
		case !denied(v, mask):
			out = append(out, ArgMatch{Mask: mask, Value: v})
		default:
			bit := uint32(1) << (width - 1 - bits)
			walk(v, bits+1)
			walk(v|bit, bits+1)
		}
	}
	walk(0, 0)
	return out
}
