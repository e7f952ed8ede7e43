package qemu

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Machine describes one QEMU x86_64 machine, booted either from a kernel
// image (Kernel) or by its firmware from a disk (a Disk with Boot).
// Args turns it into an argv; nothing else about QEMU's option syntax
// leaks out of this package.
type Machine struct {
	Binary    string // default qemu-system-x86_64
	Type      string // "pc" (default), "q35" (full VMs) or "microvm"
	Accel     Accel  // required
	CPUs      int    // default 1
	MemoryMiB int    // default 512

	// Kernel is booted directly (-kernel). Empty means the firmware
	// (SeaBIOS) boots the disk marked Boot; one of the two is required.
	Kernel  string
	Initrd  string   // optional, only with Kernel
	Cmdline []string // kernel command line, one word each; only with Kernel

	Disks  []Disk  // virtio-blk, /dev/vda, /dev/vdb, ... in order
	Shares []Share // virtio-9p
	// PMem are files mapped into the guest as virtio-pmem devices
	// (/dev/pmem0, ... in order), read-only and shared with the host's
	// page cache: mounted with DAX, the guest reads them without a copy.
	PMem []PMem
	// Ports are virtio-serial ports, each a unix socket where QEMU
	// listens for one host client at a time.
	Ports []Port
	// FwCfg are files the guest reads from fw_cfg
	// (/sys/firmware/qemu_fw_cfg/by_name/NAME/raw); names start "opt/".
	FwCfg []FwCfg
	// Balloon adds a virtio-balloon with free page reporting: the guest
	// hands back the pages it frees, and the host's memory use shrinks.
	Balloon bool
	// BIOS is the firmware (e.g. /usr/share/qemu/qboot.rom, which boots
	// a kernel faster than SeaBIOS); default QEMU's.
	BIOS string
	// TCGCacheMiB bounds TCG's translation cache (QEMU's default is
	// 1 GiB per machine); 0 keeps the default. Ignored under KVM.
	TCGCacheMiB int
	// MemoryMerge lets the host's KSM merge the guest's memory with other
	// mergeable memory (QEMU's mem-merge, on by default in QEMU: here off
	// unless asked). Merged pages leak across everything merged with them
	// by write timing: only machines of one tenant may have it.
	MemoryMerge bool
	// Incoming starts the machine stopped, waiting for its state to be
	// loaded over QMP (migrate-incoming), as a restore does.
	Incoming bool

	// Display, if set, gives the machine a screen, a PS/2 keyboard (always
	// there on pc and q35) and optionally a VNC server and an absolute
	// pointer; QMP's Screendump and input calls work on it. Not on microvm.
	Display *Display

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

// Disk is a disk image on virtio-blk.
type Disk struct {
	Path   string
	Format string // "raw" (default) or "qcow2"
	// Boot marks the disk the firmware boots from when Machine.Kernel is
	// empty; at most one disk has it.
	Boot     bool
	ReadOnly bool
	// Snapshot writes go to a temporary file QEMU discards at exit.
	Snapshot bool
	// Serial is the serial number the guest sees (/sys/block/vdX/serial),
	// at most 20 bytes: how it tells disks apart.
	Serial string
	// Discard passes the guest's discards (fstrim) to the file, so its
	// freed blocks become holes again.
	Discard bool
}

// PMem is a file mapped as a virtio-pmem device.
type PMem struct {
	Path string
	Size int64 // bytes, a multiple of 2 MiB covering the file
}

// Port is a virtio-serial port.
type Port struct {
	Name   string // the guest's name for it (/sys/class/virtio-ports/*/name)
	Socket string
}

// FwCfg is one fw_cfg entry.
type FwCfg struct {
	Name string // "opt/..."
	File string
}

// Display is a machine's screen and what points at it. QEMU opens no
// window: the screen is read with QMP (Screendump) or over VNC.
type Display struct {
	// Device is the graphics card: "VGA" (default: the standard VGA with
	// Bochs VBE extensions, text mode included, which firmware and boot
	// loaders can draw on), "bochs-display" (no VGA text mode) or
	// "virtio-vga".
	Device string
	// VNC, if set, is a unix socket path where QEMU serves the screen,
	// keyboard and pointer over VNC, with no password: whoever can open
	// the socket controls the machine, so keep it in a private directory.
	VNC string
	// Pointer is an absolute pointing device, so that QMP's PointerMove
	// and Click (and VNC clients) place the guest's cursor exactly; none
	// by default.
	Pointer Pointer
}

// Pointer is an absolute pointing device.
type Pointer string

const (
	NoPointer    Pointer = ""
	USBTablet    Pointer = "usb-tablet"    // on an XHCI controller; every OS drives it
	VirtioTablet Pointer = "virtio-tablet" // virtio-input; Linux drives it
)

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
// stdio (Start captures it); QEMU opens no window and has no monitor, no
// network and no default devices, and a screen only with m.Display.
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
	boot := -1
	for i, d := range m.Disks {
		if d.Boot {
			if boot >= 0 {
				return nil, invalid("disks %d and %d both marked Boot", boot, i)
			}
			boot = i
		}
	}
	switch {
	case m.Kernel == "" && boot < 0:
		return nil, invalid("no kernel and no boot disk")
	case m.Kernel != "" && boot >= 0:
		return nil, invalid("both a kernel and a boot disk (disk %d)", boot)
	case m.Kernel == "" && (m.Initrd != "" || len(m.Cmdline) > 0):
		return nil, invalid("an initrd or kernel command line but no kernel")
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
	if m.MemoryMerge {
		machine += ",mem-merge=on"
	} else {
		machine += ",mem-merge=off"
	}
	accel := string(m.Accel)
	if m.Accel == TCG && m.TCGCacheMiB > 0 {
		accel += ",tb-size=" + strconv.Itoa(m.TCGCacheMiB)
	}
	memOpt := strconv.Itoa(mem) + "M"
	if len(m.PMem) > 0 {
		var extra int64
		for i, p := range m.PMem {
			if p.Path == "" || p.Size <= 0 || p.Size%(2<<20) != 0 {
				return nil, invalid("pmem %d: path %q, size %d (want a multiple of 2 MiB)", i, p.Path, p.Size)
			}
			extra += p.Size
		}
		memOpt += fmt.Sprintf(",slots=%d,maxmem=%dM", len(m.PMem), int64(mem)+extra>>20)
	}
	a := []string{bin,
		"-machine", machine, "-accel", accel, "-cpu", cpu,
		"-smp", strconv.Itoa(cpus), "-m", memOpt,
		"-nodefaults", "-no-user-config", "-display", "none",
		"-chardev", "stdio,id=console,signal=off", "-serial", "chardev:console",
	}
	if m.BIOS != "" {
		a = append(a, "-bios", m.BIOS)
	}
	if m.Kernel != "" {
		a = append(a, "-kernel", m.Kernel)
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
		format := d.Format
		switch format {
		case "":
			format = "raw"
		case "raw", "qcow2":
		default:
			return nil, invalid("disk %d format %q (want raw or qcow2)", i, format)
		}
		opt := fmt.Sprintf("if=none,id=disk%d,format=%s,file=%s", i, format, escape(d.Path))
		if d.ReadOnly {
			opt += ",readonly=on"
		}
		if d.Snapshot {
			opt += ",snapshot=on"
		}
		if d.Discard {
			opt += ",discard=unmap"
		}
		dev := fmt.Sprintf("virtio-blk-%s,drive=disk%d", bus, i)
		if d.Serial != "" {
			if len(d.Serial) > 20 || !tagRE.MatchString(d.Serial) {
				return nil, invalid("disk %d serial %q (1-20 of A-Z a-z 0-9 _ . -)", i, d.Serial)
			}
			dev += ",serial=" + d.Serial
		}
		if d.Boot {
			dev += ",bootindex=0"
		}
		a = append(a, "-drive", opt, "-device", dev)
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
	for i, p := range m.PMem {
		a = append(a,
			"-object", fmt.Sprintf("memory-backend-file,id=pmem%d,mem-path=%s,size=%d,share=on,readonly=on", i, escape(p.Path), p.Size),
			"-device", fmt.Sprintf("virtio-pmem-%s,memdev=pmem%d,id=pmemdev%d", bus, i, i))
	}
	if len(m.Ports) > 0 {
		a = append(a, "-device", "virtio-serial-"+bus)
	}
	for i, p := range m.Ports {
		if !tagRE.MatchString(p.Name) || p.Socket == "" {
			return nil, invalid("port %d: name %q, socket %q", i, p.Name, p.Socket)
		}
		a = append(a,
			"-chardev", fmt.Sprintf("socket,id=port%d,path=%s,server=on,wait=off", i, escape(p.Socket)),
			"-device", fmt.Sprintf("virtserialport,chardev=port%d,name=%s", i, p.Name))
	}
	for i, f := range m.FwCfg {
		if !strings.HasPrefix(f.Name, "opt/") || strings.ContainsAny(f.Name, ", ") || f.File == "" {
			return nil, invalid("fw_cfg %d: name %q (want opt/..., no commas), file %q", i, f.Name, f.File)
		}
		a = append(a, "-fw_cfg", fmt.Sprintf("name=%s,file=%s", f.Name, escape(f.File)))
	}
	if m.RNG {
		a = append(a, "-object", "rng-random,id=rng0,filename=/dev/urandom", "-device", "virtio-rng-"+bus+",rng=rng0")
	}
	if m.Balloon {
		a = append(a, "-device", "virtio-balloon-"+bus+",free-page-reporting=on")
	}
	if d := m.Display; d != nil {
		if typ == "microvm" {
			return nil, invalid("a display on microvm (want pc or q35)")
		}
		dev := d.Device
		switch dev {
		case "":
			dev = "VGA"
		case "VGA", "bochs-display", "virtio-vga":
		default:
			return nil, invalid("display device %q (want VGA, bochs-display or virtio-vga)", dev)
		}
		a = append(a, "-device", dev)
		if d.VNC != "" {
			a = append(a, "-vnc", "unix:"+escape(d.VNC))
		}
		switch d.Pointer {
		case NoPointer:
		case USBTablet:
			a = append(a, "-device", "qemu-xhci,id=xhci", "-device", "usb-tablet,bus=xhci.0")
		case VirtioTablet:
			a = append(a, "-device", "virtio-tablet-pci")
		default:
			return nil, invalid("pointer %q (want usb-tablet or virtio-tablet)", d.Pointer)
		}
	}
	if m.QMP != "" {
		a = append(a, "-qmp", "unix:"+escape(m.QMP)+",server=on,wait=off")
	}
	if !m.Reboot {
		a = append(a, "-no-reboot")
	}
	if m.Incoming {
		a = append(a, "-S", "-incoming", "defer")
	}
	return append(a, m.Extra...), nil
}

// escape doubles commas, QEMU's escape inside an option value.
func escape(s string) string { return strings.ReplaceAll(s, ",", ",,") }
