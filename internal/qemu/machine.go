package qemu

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Machine describes one QEMU x86_64 machine booted from a kernel image.
// Args turns it into an argv; nothing else about QEMU's option syntax
// leaks out of this package.
type Machine struct {
	Binary    string // default qemu-system-x86_64
	Type      string // "pc" (default), "q35" or "microvm"
	Accel     Accel  // required
	CPUs      int    // default 1
	MemoryMiB int    // default 512

	Kernel  string   // required
	Initrd  string   // optional
	Cmdline []string // kernel command line, one word each

	Disks  []Disk  // virtio-blk, /dev/vda, /dev/vdb, ... in order
	Shares []Share // virtio-9p

	// RNG adds a virtio-rng device fed by the host's /dev/urandom, so
	// the guest's entropy pool is ready at once.
	RNG bool
	// QMP is a unix socket path where QEMU listens for one QMP client.
	QMP string
	// Reboot lets a guest reboot; by default a reboot ends QEMU, like a
	// power-off, so a guest that panics (with panic=-1) ends the run.
	Reboot bool
	// Extra is appended verbatim.
	Extra []string
}

// Disk is a raw disk image.
type Disk struct {
	Path     string
	ReadOnly bool
	// Snapshot writes go to a temporary file QEMU discards at exit.
	Snapshot bool
}

// Share is a host directory exported over virtio-9p; the guest mounts it
// with `mount -t 9p -o trans=virtio,version=9p2000.L TAG DIR`.
type Share struct {
	Tag      string // at most 31 bytes: letters, digits, '_', '-', '.'
	Path     string
	ReadOnly bool
}

var tagRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,31}$`)

// ErrInvalid is wrapped by every error Args returns.
var ErrInvalid = errors.New("invalid machine")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// Args returns the argv (Binary first) that starts m, or an error
// wrapping ErrInvalid. The console is the first serial port on QEMU's
// stdio (Start captures it); QEMU has no display, no monitor, no network
// and no default devices.
func (m Machine) Args() ([]string, error) {
	bin := m.Binary
	if bin == "" {
		bin = "qemu-system-x86_64"
	}
	typ := m.Type
	if typ == "" {
		typ = "pc"
	}
	// Devices on PCI for pc and q35, on virtio-mmio for microvm.
	bus := "pci"
	switch typ {
	case "pc", "q35":
	case "microvm":
		bus = "device"
	default:
		return nil, invalid("machine type %q (want pc, q35 or microvm)", typ)
	}
	var cpu string
	switch m.Accel {
	case KVM:
		cpu = "host"
	case TCG:
		cpu = "max"
	default:
		return nil, invalid("accelerator %q (want kvm or tcg)", m.Accel)
	}
	if m.Kernel == "" {
		return nil, invalid("no kernel")
	}
	cpus, mem := m.CPUs, m.MemoryMiB
	if cpus == 0 {
		cpus = 1
	}
	if mem == 0 {
		mem = 512
	}
	if cpus < 0 || mem < 0 {
		return nil, invalid("%d CPUs, %d MiB", cpus, mem)
	}
	for _, w := range m.Cmdline {
		if w == "" || strings.ContainsAny(w, " \t\n\"") {
			return nil, invalid("kernel command line word %q (no spaces or quotes)", w)
		}
	}
	machine := typ
	if typ == "microvm" {
		machine += ",isa-serial=on,rtc=on"
	}
	a := []string{bin,
		"-machine", machine, "-accel", string(m.Accel), "-cpu", cpu,
		"-smp", strconv.Itoa(cpus), "-m", strconv.Itoa(mem) + "M",
		"-nodefaults", "-no-user-config", "-display", "none",
		"-chardev", "stdio,id=console,signal=off", "-serial", "chardev:console",
		"-kernel", m.Kernel,
	}
	if m.Initrd != "" {
		a = append(a, "-initrd", m.Initrd)
	}
	if len(m.Cmdline) > 0 {
		a = append(a, "-append", strings.Join(m.Cmdline, " "))
	}
	for i, d := range m.Disks {
		if d.Path == "" {
			return nil, invalid("disk %d has no path", i)
		}
		opt := fmt.Sprintf("if=none,id=disk%d,format=raw,file=%s", i, escape(d.Path))
		if d.ReadOnly {
			opt += ",readonly=on"
		}
		if d.Snapshot {
			opt += ",snapshot=on"
		}
		a = append(a, "-drive", opt, "-device", fmt.Sprintf("virtio-blk-%s,drive=disk%d", bus, i))
	}
	tags := map[string]bool{}
	for i, s := range m.Shares {
		if !tagRE.MatchString(s.Tag) {
			return nil, invalid("share tag %q (1-31 of A-Z a-z 0-9 _ . -)", s.Tag)
		}
		if tags[s.Tag] {
			return nil, invalid("share tag %q used twice", s.Tag)
		}
		tags[s.Tag] = true
		if s.Path == "" {
			return nil, invalid("share %q has no path", s.Tag)
		}
		opt := fmt.Sprintf("local,id=fs%d,path=%s,security_model=none", i, escape(s.Path))
		if s.ReadOnly {
			opt += ",readonly=on"
		}
		a = append(a, "-fsdev", opt, "-device", fmt.Sprintf("virtio-9p-%s,fsdev=fs%d,mount_tag=%s", bus, i, s.Tag))
	}
	if m.RNG {
		a = append(a, "-object", "rng-random,id=rng0,filename=/dev/urandom", "-device", "virtio-rng-"+bus+",rng=rng0")
	}
	if m.QMP != "" {
		a = append(a, "-qmp", "unix:"+escape(m.QMP)+",server=on,wait=off")
	}
	if !m.Reboot {
		a = append(a, "-no-reboot")
	}
	return append(a, m.Extra...), nil
}

// escape doubles commas, QEMU's escape inside an option value.
func escape(s string) string { return strings.ReplaceAll(s, ",", ",,") }
