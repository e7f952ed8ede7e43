package container

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/cgroup"
	"github.com/warrenhq/warren/internal/guard"
	"github.com/warrenhq/warren/internal/qos"
)

const (
	// initPath is where catatonit appears inside every sandbox. runc
	// creates the bind mount's target file in the /dev tmpfs it has just
	// mounted, so the sandbox's overlay upper dir stays untouched.
	initPath = "/dev/init"

	defaultPath = backend.DefaultPath

	cfsPeriod = 100_000 // µs, the kernel's default CFS period

	// maxHostname is HOST_NAME_MAX: sethostname rejects longer names.
	maxHostname = 64
)

// wantNofile is the open files limit of the init and every exec: what
// build tools and test runners expect; the usual default of 1024 is not.
const wantNofile = 65536

// sandboxRlimits returns the rlimits for sandboxes: wantNofile open files,
// or the agent's own hard limit if it is lower and the agent cannot raise
// it (no CAP_SYS_RESOURCE, as in some containers and VMs): runc would fail
// every create otherwise.
func sandboxRlimits() []specs.POSIXRlimit {
	n := uint64(wantNofile)
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) == nil && rl.Max < n && !hasCap(unix.CAP_SYS_RESOURCE) {
		n = rl.Max
	}
	return []specs.POSIXRlimit{
		{Type: "RLIMIT_NOFILE", Hard: n, Soft: n},
		// No process may raise its priority: a best-effort sandbox's
		// stay under SCHED_IDLE (internal/qos).
		{Type: "RLIMIT_NICE", Hard: qos.RLIMITNice, Soft: qos.RLIMITNice},
	}
}

// hasCap reports whether the calling process has capability c in its
// effective set.
func hasCap(c int) bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[c/32].Effective&(1<<(uint(c)%32)) != 0
}

// ociSpec is the runtime configuration of a sandbox whose merged root is
// mounted at rootfs (in the namespace the runtime runs in; the agent
// reaches it at held), for runtime r.
func (c *Container) ociSpec(r *ociRuntime, spec backend.Spec, rootfs, held string, ids *idRange) (*specs.Spec, error) {
	res := &specs.LinuxResources{
		// Deny every device; runc adds back the standard ones it creates
		// in /dev (null, zero, full, random, urandom, tty, ptmx).
		Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
	}
	if m := spec.Resources.Memory; m > 0 {
		res.Memory = &specs.LinuxMemory{Limit: &m}
		if !c.noSwapCtl {
			swap := m // memory+swap == memory: no swap at all
			res.Memory.Swap = &swap
		}
	}
	if cpu := spec.Resources.CPU; cpu > 0 {
		quota, period := int64(cpu*cfsPeriod), uint64(cfsPeriod)
		res.CPU = &specs.LinuxCPU{Quota: &quota, Period: &period}
	}
	if p := spec.Resources.PIDs; p > 0 {
		res.Pids = &specs.LinuxPids{Limit: &p}
	}

	hostname := spec.ID
	if len(hostname) > maxHostname {
		hostname = hostname[:maxHostname]
	}
	// /dev/shm is a tmpfs charged to the sandbox's memory; allow half of
	// it (shared-memory data loaders want more than Docker's 64 MiB).
	shm := int64(64 << 20)
	if spec.Resources.Memory/2 > shm {
		shm = spec.Resources.Memory / 2
	}

	oom := qos.OOMScoreAdj(spec.BestEffort) // sandboxes before the agent in a host-wide OOM
	s := &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			Args:        []string{initPath, "-P"},
			Env:         []string{defaultPath},
			Cwd:         "/",
			Rlimits:     c.rlimits,
			OOMScoreAdj: &oom,
		},
		Root:     &specs.Root{Path: rootfs},
		Hostname: hostname,
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			c.devMount(rootfs),
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", fmt.Sprintf("size=%d", shm)}},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: initPath, Type: "bind", Source: filepath.Join(rootfs, platformSub, "init"), Options: []string{"bind", "ro", "nosuid", "nodev"}},
		},
		Linux: &specs.Linux{
			CgroupsPath: c.cgroupRel(spec.ID, spec.BestEffort),
			Resources:   res,
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				{Type: specs.NetworkNamespace}, // runc brings up lo
				{Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace},
				{Type: specs.MountNamespace},
				{Type: specs.CgroupNamespace},
			},
		},
	}
	if len(spec.DNS) > 0 {
		// Read-only: what the sandbox would write there would land
		// outside its disk limit, and no other resolver answers it anyway.
		s.Mounts = append(s.Mounts, specs.Mount{Destination: "/etc/resolv.conf", Type: "bind",
			Source: filepath.Join(rootfs, platformSub, resolvConf), Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"}})
	}
	// Binds above come from the platform's files in the sandbox's own
	// root (platformDir); once made, an empty read-only directory hides
	// them.
	s.Mounts = append(s.Mounts, emptyBind(rootfs, "/"+platformSub))
	if ids != nil {
		m := []specs.LinuxIDMapping{{ContainerID: 0, HostID: ids.base, Size: idSize}}
		s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.UserNamespace})
		s.Linux.UIDMappings, s.Linux.GIDMappings = m, m
	}
	if err := guard.Harden(s); err != nil {
		return nil, err
	}
	if !r.gvisor() {
		maskSysByBind(s, rootfs)
		// giveIdentity binds the platform's empty directory over them.
		s.Linux.MaskedPaths = slices.DeleteFunc(s.Linux.MaskedPaths, func(p string) bool { return slices.Contains(procDirMasks(), p) })
	}
	// init reaps and waits: it needs no capability, and without
	// CAP_DAC_OVERRIDE it cannot read its execute-only binary, which makes
	// it non-dumpable (installInit).
	s.Process.Capabilities = &specs.LinuxCapabilities{}
	s.Process.ApparmorProfile = c.apparmor
	if l, err := cgroup.Host(); err == nil && l.Mode == cgroup.Unified {
		// The sandbox's own cgroup, read-only (a cgroup namespace of its
		// own roots it there): what tools read their limits from. Not on
		// cgroup v1 hosts: each of v1's hierarchies is a mount of its own
		// per sandbox, and mounting one walks every cgroup of it
		// (cgroup1_get_tree waits out offline ones) and every superblock
		// of the type: ten such mounts made each create cost O(sandboxes)
		// (bench/density, issue 18).
		s.Mounts = slices.Insert(s.Mounts, slices.IndexFunc(s.Mounts, func(m specs.Mount) bool { return m.Destination == "/sys" })+1,
			specs.Mount{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}})
	}
	if r.gvisor() {
		c.gvisorSpec(s, spec, rootfs, held)
	}
	return s, nil
}

// resolvConf is the sandbox's own platform file (platformDir) bound on its
// /etc/resolv.conf.
const resolvConf = "resolv.conf"

func resolvConfFor(servers []string) []byte {
	var b strings.Builder
	b.WriteString("# written by warren: the node's DNS proxy answers what the sandbox's network policy allows\n")
	for _, s := range servers {
		b.WriteString("nameserver " + s + "\n")
	}
	b.WriteString("options ndots:0 timeout:2 attempts:2\n")
	return []byte(b.String())
}

// execEnv merges the sandbox's default environment with the request's (the
// request wins) and fills in PATH and HOME when neither sets them, as a
// login would.
func execEnv(base, extra []string, uid uint32) []string { return backend.ExecEnv(base, extra, uid) }

// emptyBind hides target under the platform's empty directory, read-only
// (emptyDir).
func emptyBind(rootfs, target string) specs.Mount {
	return specs.Mount{Destination: target, Type: "bind", Source: filepath.Join(rootfs, platformSub, emptyDir),
		Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"}}
}

// maskSysByBind masks the directories of /sys among the spec's masked
// paths with emptyBind, before the platform's files are covered, instead
// of the read-only tmpfs runc mounts on a masked directory. Every
// filesystem a sandbox mounts costs the kernel a shrinker, and each
// memory cgroup keeps 16 bytes for every shrinker the node has had (a
// 520-byte unit per 64 of them, in 1 KiB slabs; never given back before
// a reboot): with 10,000 sandboxes, each filesystem less per sandbox is
// ~1.5 GiB of kernel memory less (bench/density, issue 18). A masked path the host lacks stays with
// runc, which skips it. (runc binds nothing into /proc: its masked
// directories are procDirMasks'.)
func maskSysByBind(s *specs.Spec, rootfs string) {
	cover := slices.IndexFunc(s.Mounts, func(m specs.Mount) bool { return m.Destination == "/"+platformSub })
	var binds []specs.Mount
	s.Linux.MaskedPaths = slices.DeleteFunc(s.Linux.MaskedPaths, func(p string) bool {
		if !strings.HasPrefix(p, "/sys/") {
			return false
		}
		if fi, err := os.Lstat(p); err != nil || !fi.IsDir() {
			return false
		}
		binds = append(binds, emptyBind(rootfs, p))
		return true
	})
	s.Mounts = slices.Insert(s.Mounts, cover, binds...)
}

// procDirMasks are the directories of /proc among the masked paths
// (guard.MaskedPaths) that this host has: instead of the read-only tmpfs
// runc would mount on each (a filesystem, so a shrinker, per sandbox, as
// for maskSysByBind), giveIdentity binds the platform's empty directory
// over them once runc has made the sandbox's namespace (runc binds
// nothing into /proc). Not for gVisor, whose /proc has none of them.
var procDirMasks = sync.OnceValue(func() []string {
	var dirs []string
	for _, p := range guard.MaskedPaths() {
		if fi, err := os.Lstat(p); err == nil && fi.IsDir() && strings.HasPrefix(p, "/proc/") {
			dirs = append(dirs, p)
		}
	}
	return dirs
})

// devMount is the sandbox's /dev: the node's read-only template (dev.go)
// where there is one, else a tmpfs runc fills.
func (c *Container) devMount(rootfs string) specs.Mount {
	if c.devTemplate {
		return specs.Mount{Destination: "/dev", Type: "bind", Source: filepath.Join(rootfs, platformSub, "dev"),
			Options: []string{"bind", "ro", "nosuid", "noexec"}}
	}
	return devTmpfs
}

// devTmpfs is a /dev the runtime fills: runc with the standard devices,
// gVisor with its own.
var devTmpfs = specs.Mount{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}}
