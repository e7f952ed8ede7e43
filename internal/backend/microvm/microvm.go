// Package microvm is the microvm backend: each sandbox is a QEMU machine of
// its own, booted from a small guest kernel and an initramfs whose init is
// warren's guest agent (guest/agent), for tasks that need a stronger wall
// than namespaces and seccomp (a kernel exploit inside stays inside the
// guest kernel).
//
// A sandbox's EROFS layers, the same files containers mount, are attached
// read-only (virtio-blk, or virtio-pmem with DAX where asked: then the
// guests share the host's page cache of each layer); a per-sandbox ext4
// disk image, made by the host at create, is its writable layer, and the
// guest stacks them with overlayfs, as containers are stacked. The disk
// image's size is the sandbox's disk limit (DiskLimiter, "disk-image").
//
// The node reaches the guest agent over one virtio-serial port, a unix
// socket on the host (guest/proto: a handshake on a per-sandbox secret,
// then HTTP/2). Nothing in the guest listens on a network socket. The
// secret reaches the guest through fw_cfg, which the workload cannot
// read (guest/agent masks it).
//
// QEMU runs detached from the agent, in a host cgroup of its own (CPU
// quota, memory limit), so sandboxes outlive an agent restart: Recover
// finds the process again from its pid file (checked against its start
// time and command line) and dials the socket anew.
//
// The accelerator is KVM where /dev/kvm can boot a stock kernel, else TCG
// (qemu.DetectAccel); the machine type follows it: microvm under KVM,
// pc under TCG (where -M microvm hangs calibrating the TSC).
package microvm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/warrenhq/warren/guest/initramfs"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/hostbin"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/qemu"
)

// The guest kernels a host may have, each an unpacked kernel tree
// (boot/vmlinuz-*, lib/modules/*): scripts/build-guest-kernel's, built for
// microVMs with everything they need built in (~13 MiB of each guest's
// memory for its image), and Debian's generic one, which
// scripts/fetch-guest-kernel fetches (~46 MiB, its drivers as modules).
const (
	WarrenKernel = "/var/cache/warren/guest/kernel/warren"
	DebianKernel = "/var/cache/warren/guest/kernel/current"
)

// DefaultKernel is the kernel microVMs boot when Config.Kernel is empty:
// WarrenKernel where it is built, else DebianKernel.
func DefaultKernel() string {
	if _, err := os.Stat(WarrenKernel); err == nil {
		return WarrenKernel
	}
	return DebianKernel
}

// Config configures a MicroVM backend.
type Config struct {
	// Kind is KindMicroVM (default) or KindVM (vm.go): the backend's
	// name, and how its machines boot.
	Kind string
	// StateDir holds one directory per sandbox and the built initramfs.
	StateDir string
	// Kernel is a kernel image (vmlinuz), or a directory with
	// boot/vmlinuz-RELEASE and lib/modules/RELEASE (an unpacked
	// linux-image package). Default DefaultKernel().
	Kernel string
	// Modules is the kernel's module tree; default found from Kernel.
	Modules string
	// GuestAgent is the static warren-guest binary (guest/agent).
	// Default: beside this executable, else from PATH.
	GuestAgent string
	// ShellPath is the static shell ExecRequest.Shell runs in the guest.
	// Default /bin/bash-static, else the static busybox.
	ShellPath string
	// QEMU is the qemu-system-x86_64 binary. Default from PATH.
	QEMU string
	// CgroupParent is the host cgroup path under which each sandbox's
	// QEMU gets <CgroupParent>/<id>. Default "/warren".
	CgroupParent string
	// Accel overrides accelerator detection ("kvm" or "tcg").
	Accel qemu.Accel
	// DAX attaches layers as virtio-pmem mounted with DAX, sharing the
	// host's page cache between guests, where the kernel has the modules.
	DAX bool
	// Mounts mounts layers on the host, which only snapshots that strip
	// paths need (shared with the container backend).
	Mounts *image.Mounts
	// VMAgentWait is how long after its machine starts a vm's guest
	// agent is waited for before exec and files are not_supported in it
	// (its disk image carries none). Default 3 minutes (a boot under TCG
	// takes one or more).
	VMAgentWait time.Duration
}

// MicroVM is the microvm backend.
type MicroVM struct {
	cfg      Config
	kind     string
	dir      string // <StateDir>/sandboxes
	accel    qemu.Accel
	accelWhy string
	kernel   string // vmlinuz
	initrd   string
	dax      bool   // layers on virtio-pmem
	bios     string // qboot where QEMU ships it
	initErr  error  // why the backend cannot run here

	mu        sync.Mutex
	sandboxes map[string]*sandbox
	pmemMu    map[string]*sync.Mutex // per layer digest: building its pmem backing file
}

var (
	_ backend.Backend     = (*MicroVM)(nil)
	_ backend.Execer      = (*MicroVM)(nil)
	_ backend.Files       = (*MicroVM)(nil)
	_ backend.Statser     = (*MicroVM)(nil)
	_ backend.PortDialer  = (*MicroVM)(nil)
	_ backend.DiskLimiter = (*MicroVM)(nil)
	_ backend.Accelerated = (*MicroVM)(nil)
)

// New returns a MicroVM backend. What the host lacks (QEMU, a kernel, the
// guest agent) does not fail New: Available reports it.
func New(cfg Config) (*MicroVM, error) {
	if cfg.StateDir == "" {
		return nil, errdefs.Invalid("microvm: no state directory")
	}
	if cfg.Kernel == "" {
		cfg.Kernel = DefaultKernel()
	}
	if cfg.GuestAgent == "" {
		cfg.GuestAgent = hostbin.Find("warren-guest")
	}
	if cfg.QEMU == "" {
		cfg.QEMU = "qemu-system-x86_64"
	}
	if cfg.VMAgentWait <= 0 {
		cfg.VMAgentWait = defaultVMAgentWait
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = "/warren"
	}
	if cfg.ShellPath == "" {
		cfg.ShellPath = "/bin/bash-static"
		if _, err := os.Stat(cfg.ShellPath); err != nil {
			cfg.ShellPath = "/bin/busybox"
		}
	}
	switch cfg.Kind {
	case "":
		cfg.Kind = KindMicroVM
	case KindMicroVM, KindVM:
	default:
		return nil, errdefs.Invalid("microvm: kind %q (want microvm or vm)", cfg.Kind)
	}
	m := &MicroVM{cfg: cfg, kind: cfg.Kind, dir: filepath.Join(cfg.StateDir, "sandboxes"), sandboxes: map[string]*sandbox{}}
	if err := os.MkdirAll(m.dir, 0o700); err != nil {
		return nil, err
	}
	if cfg.Accel != "" {
		m.accel, m.accelWhy = cfg.Accel, "configured"
	} else {
		m.accel, m.accelWhy = qemu.DetectAccel()
	}
	if _, err := os.Stat("/usr/share/qemu/qboot.rom"); err == nil && m.accel == qemu.TCG {
		m.bios = "/usr/share/qemu/qboot.rom"
	}
	if m.kind == KindVM {
		m.initErr = m.prepareVM()
	} else {
		m.initErr = m.prepare()
	}
	return m, nil
}

// prepare finds the kernel and builds the initramfs.
func (m *MicroVM) prepare() error {
	if _, err := exec.LookPath(m.cfg.QEMU); err != nil {
		return errdefs.Unavailable("microvm: no QEMU (%s): install qemu-system-x86", m.cfg.QEMU)
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		return errdefs.Unavailable("microvm: no mkfs.ext4: install e2fsprogs")
	}
	kernel, modules, err := findKernel(m.cfg.Kernel, m.cfg.Modules)
	if err != nil {
		return errdefs.Unavailable("microvm: guest kernel: %v (scripts/build-guest-kernel builds warren's, scripts/fetch-guest-kernel fetches Debian's)", err)
	}
	m.kernel = kernel
	if _, err := os.Stat(m.cfg.GuestAgent); err != nil {
		return errdefs.Unavailable("microvm: no guest agent %s (scripts/build-helpers builds warren-guest)", m.cfg.GuestAgent)
	}
	load := []string{"crc32c_generic", "virtio_pci", "virtio_blk", "virtio_console", "virtio_rng", "qemu_fw_cfg", "virtio_balloon", "erofs", "overlay", "ext4"}
	if m.cfg.DAX {
		if _, err := initramfs.Resolve(modules, []string{"virtio_pmem", "nd_pmem"}); err == nil {
			load = append(load, "virtio_pmem", "nd_pmem")
			m.dax = true
		}
	}
	m.initrd, err = m.buildInitrd(modules, load)
	return err
}

// findKernel resolves Config.Kernel and Config.Modules.
func findKernel(kernel, modules string) (string, string, error) {
	kernel, err := filepath.EvalSymlinks(kernel)
	if err != nil {
		return "", "", err
	}
	fi, err := os.Stat(kernel)
	if err != nil {
		return "", "", err
	}
	root := ""
	if fi.IsDir() {
		root = kernel
		vms, _ := filepath.Glob(filepath.Join(kernel, "boot", "vmlinuz-*"))
		if len(vms) == 0 {
			return "", "", fmt.Errorf("no boot/vmlinuz-* in %s", kernel)
		}
		sort.Strings(vms)
		kernel = vms[len(vms)-1]
	} else {
		root = filepath.Dir(filepath.Dir(kernel)) // <root>/boot/vmlinuz-R
	}
	if modules == "" {
		release := strings.TrimPrefix(filepath.Base(kernel), "vmlinuz-")
		modules = filepath.Join(root, "lib", "modules", release)
	}
	if _, err := os.Stat(modules); err != nil {
		return "", "", fmt.Errorf("modules: %w", err)
	}
	return kernel, modules, nil
}

// buildInitrd writes the initramfs (guest agent, platform shell,
// modules) once per content, named by its inputs' hash.
func (m *MicroVM) buildInitrd(modules string, load []string) (string, error) {
	h := sha256.New()
	fmt.Fprintln(h, modules, load)
	for _, p := range []string{m.cfg.GuestAgent, m.cfg.ShellPath} {
		f, err := os.Open(p)
		if err != nil {
			return "", errdefs.Unavailable("microvm: %v", err)
		}
		io.Copy(h, f)
		f.Close()
	}
	path := filepath.Join(m.cfg.StateDir, "initrd-"+hex.EncodeToString(h.Sum(nil))[:16])
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	tmp, err := os.CreateTemp(m.cfg.StateDir, ".initrd-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	err = initramfs.Write(tmp, initramfs.Spec{
		Init: m.cfg.GuestAgent, Modules: modules, Load: load,
		Dirs:  []string{"warren"},
		Files: map[string]string{"warren/sh": m.cfg.ShellPath},
	})
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", errdefs.Unavailable("microvm: initramfs: %v", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", err
	}
	// Older builds go.
	old, _ := filepath.Glob(filepath.Join(m.cfg.StateDir, "initrd-*"))
	for _, o := range old {
		if o != path {
			os.Remove(o)
		}
	}
	return path, nil
}

// Name implements backend.Backend.
func (m *MicroVM) Name() string { return m.kind }

var _ backend.MemoryMerger = (*MicroVM)(nil)

// MemoryMerge says whether guests' memory can merge here: QEMU opts a
// machine's RAM into KSM itself (mem-merge, set per sandbox from
// Spec.MemoryMerge), so the host needs KSM only.
func (m *MicroVM) MemoryMerge() error {
	if _, err := os.Stat("/sys/kernel/mm/ksm/run"); err != nil {
		return errors.New("the kernel has no KSM (CONFIG_KSM)")
	}
	return nil
}

// Capabilities implements backend.Backend.
func (m *MicroVM) Capabilities() backend.Capabilities {
	if m.kind == KindVM {
		return vmCapabilities
	}
	return backend.Capabilities{Exec: true, Files: true, Hostname: true, Isolated: true, Limits: true, Recover: true, Pause: true, Snapshot: true, QoS: true}
}

// Available implements backend.Backend.
func (m *MicroVM) Available(ctx context.Context) error { return m.initErr }

// Accel implements backend.Accelerated.
func (m *MicroVM) Accel() (string, string) { return string(m.accel), m.accelWhy }

// DiskQuota implements backend.DiskLimiter: the writable disk is an image
// of the limit's size.
func (m *MicroVM) DiskQuota() backend.DiskQuota {
	return backend.DiskQuota{Mechanism: DiskQuotaImage, Inodes: true}
}

// DiskQuotaImage is DiskQuota's mechanism: a disk image of that size.
const DiskQuotaImage = "disk-image"

// timeouts
const (
	bootTimeout = 3 * time.Minute // TCG on a loaded 2-core machine
	killWait    = 10 * time.Second
)

// Close ends this process's sessions with every guest agent and leaves
// the machines running, as the agent's exit does: a later MicroVM on the
// same state directory re-adopts them (Recover). QEMU serves one session
// per machine at a time, so the old ones must end first.
func (m *MicroVM) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range m.sandboxes {
		if s.guest != nil {
			s.guest.close()
		}
	}
	return nil
}
