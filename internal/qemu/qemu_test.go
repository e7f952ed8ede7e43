package qemu

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestArgs(t *testing.T) {
	base := Machine{Accel: TCG, Kernel: "/k/vmlinuz"}
	for _, tc := range []struct {
		name string
		m    func(Machine) Machine
		want []string // these runs of argv, in this order, each contiguous
		not  []string // no argv element equal to these
		err  string
	}{
		{name: "defaults", m: func(m Machine) Machine { return m },
			want: []string{"qemu-system-x86_64|-machine|pc,mem-merge=off|-accel|tcg|-cpu|max|-smp|1|-m|512M",
				"-nodefaults", "-chardev|stdio,id=console,signal=off|-serial|chardev:console", "-kernel|/k/vmlinuz", "-no-reboot"},
			not: []string{"-initrd", "-append", "-qmp", "-drive", "-vnc", "VGA"}},
		{name: "kvm uses the host cpu", m: func(m Machine) Machine { m.Accel = KVM; return m },
			want: []string{"-accel|kvm|-cpu|host"}},
		{name: "everything", m: func(m Machine) Machine {
			m.Binary, m.CPUs, m.MemoryMiB = "/opt/qemu", 2, 3072
			m.Initrd, m.Cmdline = "/k/initrd", []string{"console=ttyS0", "cgroup_no_v1=all"}
			m.Disks = []Disk{{Path: "/img/root,1.erofs", ReadOnly: true}, {Path: "/img/scratch", Snapshot: true}}
			m.Shares = []Share{{Tag: "src", Path: "/repo", ReadOnly: true}, {Tag: "work", Path: "/tmp/w"}}
			m.RNG, m.QMP, m.Reboot, m.Extra = true, "/run/q.sock", true, []string{"-S"}
			return m
		}, want: []string{"/opt/qemu", "-smp|2|-m|3072M", "-initrd|/k/initrd", "-append|console=ttyS0 cgroup_no_v1=all",
			"-drive|if=none,id=disk0,format=raw,file=/img/root,,1.erofs,readonly=on|-device|virtio-blk-pci,drive=disk0",
			"-drive|if=none,id=disk1,format=raw,file=/img/scratch,snapshot=on|-device|virtio-blk-pci,drive=disk1",
			"-fsdev|local,id=fs0,path=/repo,security_model=none,readonly=on|-device|virtio-9p-pci,fsdev=fs0,mount_tag=src",
			"-fsdev|local,id=fs1,path=/tmp/w,security_model=none|-device|virtio-9p-pci,fsdev=fs1,mount_tag=work",
			"-device|virtio-rng-pci,rng=rng0", "-qmp|unix:/run/q.sock,server=on,wait=off", "-S"},
			not: []string{"-no-reboot"}},
		{name: "microvm uses virtio-mmio", m: func(m Machine) Machine {
			m.Type = "microvm"
			m.Disks = []Disk{{Path: "/d"}}
			return m
		}, want: []string{"-machine|microvm,isa-serial=on,rtc=on,mem-merge=off", "-device|virtio-blk-device,drive=disk0"}},
		{name: "memory merging only when asked", m: func(m Machine) Machine { m.MemoryMerge = true; return m },
			want: []string{"-machine|pc,mem-merge=on"}},
		{name: "full vm boots its disk with a display", m: func(m Machine) Machine {
			m.Type, m.Kernel = "q35", ""
			m.Disks = []Disk{{Path: "/img/debian.qcow2", Format: "qcow2", Boot: true, Snapshot: true}, {Path: "/img/data"}}
			m.Display = &Display{VNC: "/run/v,1.sock", Pointer: USBTablet}
			m.QMP = "/run/q.sock"
			return m
		}, want: []string{"-machine|q35,mem-merge=off",
			"-drive|if=none,id=disk0,format=qcow2,file=/img/debian.qcow2,snapshot=on|-device|virtio-blk-pci,drive=disk0,bootindex=0",
			"-drive|if=none,id=disk1,format=raw,file=/img/data|-device|virtio-blk-pci,drive=disk1",
			"-device|VGA|-vnc|unix:/run/v,,1.sock|-device|qemu-xhci,id=xhci|-device|usb-tablet,bus=xhci.0",
			"-qmp|unix:/run/q.sock,server=on,wait=off"},
			not: []string{"-kernel", "-append", "-initrd", "virtio-tablet-pci"}},
		{name: "display without vnc, virtio tablet", m: func(m Machine) Machine {
			m.Display = &Display{Device: "virtio-vga", Pointer: VirtioTablet}
			return m
		}, want: []string{"-display|none", "-kernel|/k/vmlinuz", "-device|virtio-vga|-device|virtio-tablet-pci"},
			not: []string{"-vnc", "usb-tablet,bus=xhci.0", "VGA"}},
		{name: "no kernel", m: func(m Machine) Machine { m.Kernel = ""; return m }, err: "no kernel"},
		{name: "kernel and boot disk", m: func(m Machine) Machine { m.Disks = []Disk{{Path: "/d", Boot: true}}; return m },
			err: "both a kernel and a boot disk"},
		{name: "two boot disks", m: func(m Machine) Machine {
			m.Kernel, m.Disks = "", []Disk{{Path: "/a", Boot: true}, {Path: "/b", Boot: true}}
			return m
		}, err: "both marked Boot"},
		{name: "initrd without kernel", m: func(m Machine) Machine {
			m.Kernel, m.Initrd, m.Disks = "", "/k/initrd", []Disk{{Path: "/a", Boot: true}}
			return m
		}, err: "but no kernel"},
		{name: "cmdline without kernel", m: func(m Machine) Machine {
			m.Kernel, m.Cmdline, m.Disks = "", []string{"quiet"}, []Disk{{Path: "/a", Boot: true}}
			return m
		}, err: "but no kernel"},
		{name: "bad disk format", m: func(m Machine) Machine { m.Disks = []Disk{{Path: "/d", Format: "vmdk"}}; return m }, err: "format"},
		{name: "bad display device", m: func(m Machine) Machine { m.Display = &Display{Device: "cirrus-vga"}; return m }, err: "display device"},
		{name: "bad pointer", m: func(m Machine) Machine { m.Display = &Display{Pointer: "ps2-mouse"}; return m }, err: "pointer"},
		{name: "display on microvm", m: func(m Machine) Machine { m.Type, m.Display = "microvm", &Display{}; return m }, err: "microvm"},
		{name: "no accel", m: func(m Machine) Machine { m.Accel = ""; return m }, err: "accelerator"},
		{name: "bad type", m: func(m Machine) Machine { m.Type = "isapc"; return m }, err: "machine type"},
		{name: "spaced word", m: func(m Machine) Machine { m.Cmdline = []string{"a b"}; return m }, err: "command line"},
		{name: "long tag", m: func(m Machine) Machine {
			m.Shares = []Share{{Tag: strings.Repeat("t", 32), Path: "/x"}}
			return m
		}, err: "share tag"},
		{name: "tag with comma", m: func(m Machine) Machine { m.Shares = []Share{{Tag: "a,b", Path: "/x"}}; return m }, err: "share tag"},
		{name: "tag twice", m: func(m Machine) Machine {
			m.Shares = []Share{{Tag: "a", Path: "/x"}, {Tag: "a", Path: "/y"}}
			return m
		}, err: "used twice"},
		{name: "diskless path", m: func(m Machine) Machine { m.Disks = []Disk{{}}; return m }, err: "no path"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			argv, err := tc.m(base).Args()
			if tc.err != "" {
				if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, want an ErrInvalid saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			joined := "|" + strings.Join(argv, "|") + "|"
			at := 0
			for _, w := range tc.want {
				i := strings.Index(joined[at:], "|"+w+"|")
				if i < 0 {
					t.Fatalf("argv lacks %q (in order) in %q", w, argv)
				}
				at += i + len(w) + 1
			}
			for _, n := range tc.not {
				if slices.Contains(argv, n) {
					t.Errorf("argv has %q: %q", n, argv)
				}
			}
		})
	}
}

func TestDetectAccel(t *testing.T) {
	type hostCase struct {
		env     string
		api     int
		apiErr  error
		modules []string
		flags   string
	}
	for _, tc := range []struct {
		name string
		h    hostCase
		want Accel
		why  string
	}{
		{"intel", hostCase{api: 12, modules: []string{"kvm", "kvm_intel"}, flags: "fpu vmx sse"}, KVM, "hardware"},
		{"amd", hostCase{api: 12, modules: []string{"kvm", "kvm_amd"}, flags: "fpu svm"}, KVM, "hardware"},
		{"pvm only (this machine)", hostCase{api: 12, modules: []string{"kvm", "kvm_pvm"}, flags: "fpu sse"}, TCG, "kvm_pvm"},
		{"pvm beside intel", hostCase{api: 12, modules: []string{"kvm", "kvm_pvm", "kvm_intel"}, flags: "vmx"}, KVM, "hardware"},
		{"no /dev/kvm", hostCase{apiErr: errors.New("open /dev/kvm: no such file or directory")}, TCG, "no usable /dev/kvm"},
		{"old api", hostCase{api: 11, modules: []string{"kvm_intel"}}, TCG, "API version 11"},
		{"no backend", hostCase{api: 12, modules: []string{"kvm"}, flags: "fpu"}, TCG, "no hardware backend"},
		{"forced tcg", hostCase{env: "tcg", api: 12, modules: []string{"kvm_intel"}, flags: "vmx"}, TCG, "WARREN_QEMU_ACCEL=tcg"},
		{"forced kvm", hostCase{env: "kvm", apiErr: errors.New("nope")}, KVM, "WARREN_QEMU_ACCEL=kvm"},
		{"bad override", hostCase{env: "hvf", api: 12, modules: []string{"kvm_intel"}}, TCG, "neither kvm nor tcg"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := host{
				getenv: func(k string) string {
					if k == AccelEnv {
						return tc.h.env
					}
					return ""
				},
				kvmAPI:    func() (int, error) { return tc.h.api, tc.h.apiErr },
				hasModule: func(n string) bool { return slices.Contains(tc.h.modules, n) },
				cpuFlags:  func() (string, error) { return tc.h.flags, nil },
			}
			got, why := h.detect()
			if got != tc.want || !strings.Contains(why, tc.why) {
				t.Fatalf("got %s (%s), want %s (%s)", got, why, tc.want, tc.why)
			}
		})
	}
}

func TestConsoleExitStatus(t *testing.T) {
	for _, tc := range []struct {
		name   string
		chunks []string
		status int
		found  bool
	}{
		{"plain", []string{"booting\n", ExitMarker + "0\n"}, 0, true},
		{"split across writes", []string{"x\nwarren-gu", "est: exit status 1", "7\r\n[ 3.1] reboot: Power down\n"}, 17, true},
		{"last wins", []string{ExitMarker + "3\n", ExitMarker + "4\n"}, 4, true},
		{"unterminated line does not count", []string{ExitMarker + "5"}, 0, false},
		{"a program printing garbage after the marker", []string{ExitMarker + "x\n"}, 0, false},
		{"none", []string{"kernel panic\n"}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var sink strings.Builder
			c := NewConsole(&sink)
			for _, ch := range tc.chunks {
				if n, err := c.Write([]byte(ch)); err != nil || n != len(ch) {
					t.Fatalf("write: %d, %v", n, err)
				}
			}
			if st, ok := c.ExitStatus(); st != tc.status || ok != tc.found {
				t.Fatalf("got %d, %v; want %d, %v", st, ok, tc.status, tc.found)
			}
			if got := sink.String(); got != strings.Join(tc.chunks, "") {
				t.Errorf("sink got %q", got)
			}
		})
	}
}

func ExampleMachine_Args() {
	argv, _ := Machine{Accel: TCG, Kernel: "vmlinuz", Cmdline: []string{"console=ttyS0"}}.Args()
	fmt.Println(strings.Join(argv[:9], " "))
	// Output: qemu-system-x86_64 -machine pc,mem-merge=off -accel tcg -cpu max -smp 1
}
