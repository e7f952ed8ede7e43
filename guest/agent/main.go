// Command agent is warren-guest, pid 1 of a microVM sandbox and the only
// platform code inside it. It boots the guest (modules, the sandbox's
// disks), then serves the node's microvm backend over one virtio-serial
// port (guest/proto): starting the sandbox, exec, files, stats, ports,
// freezing the writable disk for snapshots, and power-off.
//
// The workload never sees the agent. The sandbox's processes live in
// namespaces of their own (pid, mount, uts, ipc) whose root is the
// overlay of the sandbox's layers; the agent, its binary, the initramfs,
// the port and the disks' devices stay outside, in the guest's initial
// namespaces. Inside, pid 1 is a small reaper (this binary again, as
// "warren-sandbox-init", which ignores every signal); /sys/firmware (where
// fw_cfg, and with it the sandbox's secret, shows) is masked; the
// sandbox's processes run without CAP_SYS_ADMIN, CAP_SYS_PTRACE,
// CAP_SYS_MODULE, CAP_SYS_RAWIO, CAP_SYS_BOOT or CAP_MKNOD, with
// no_new_privs, in a cgroup of their own whose memory limit leaves the
// agent room. What stays visible: the guest kernel (its version, its
// /proc/cmdline, which holds nothing secret), and /proc/1/exe of the
// reaper, a copy of this binary.
//
// The same binary has three roles, by argv[0]: pid 1 of the guest
// ("/init"), the reaper, and the exec launcher ("warren-exec", which joins
// the sandbox's mount namespace, drops privileges and execs the command).
//
// "warren-guest vm" is a fourth: a service of a whole machine (the vm
// backend's, from a disk image that carries it; vm.go), serving exec,
// files and ports in that machine over the same port and protocol.
package main

import (
	"os"
	"path/filepath"
)

// Role names (argv[0]).
const (
	roleReaper   = "warren-sandbox-init"
	roleLauncher = "warren-exec"
)

func main() {
	switch filepath.Base(os.Args[0]) {
	case roleReaper:
		reaper()
	case roleLauncher:
		launcher()
	default:
		if len(os.Args) == 2 && os.Args[1] == "vm" {
			vmMain()
		}
		if len(os.Args) == 2 && os.Args[1] == "vm-unit" {
			os.Stdout.WriteString(VMUnit) // for scripts/vm-disk-add-agent
			return
		}
		agentMain()
	}
}
