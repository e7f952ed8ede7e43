package qemu

import (
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// Accel is a QEMU accelerator.
type Accel string

const (
	KVM Accel = "kvm"
	TCG Accel = "tcg" // QEMU's own emulator: slow, works everywhere
)

// AccelEnv, when set to kvm or tcg, overrides DetectAccel.
const AccelEnv = "WARREN_QEMU_ACCEL"

// host is what DetectAccel looks at, replaceable in tests.
type host struct {
	getenv    func(string) string
	kvmAPI    func() (int, error) // KVM_GET_API_VERSION on /dev/kvm
	hasModule func(string) bool   // /sys/module/NAME exists
	cpuFlags  func() (string, error)
}

var realHost = host{
	getenv: os.Getenv,
	kvmAPI: func() (int, error) {
		f, err := os.OpenFile("/dev/kvm", os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return 0, err
		}
		defer f.Close()
		return unix.IoctlRetInt(int(f.Fd()), 0xAE00) // KVM_GET_API_VERSION
	},
	hasModule: func(name string) bool {
		_, err := os.Stat("/sys/module/" + name)
		return err == nil
	},
	cpuFlags: func() (string, error) {
		b, err := os.ReadFile("/proc/cpuinfo")
		if err != nil {
			return "", err
		}
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "flags" {
				return v, nil
			}
		}
		return "", nil
	},
}

// DetectAccel says which accelerator boots a stock kernel here and why:
// KVM needs /dev/kvm to answer API version 12 with a hardware backend
// (kvm_intel or kvm_amd, and vmx or svm in the CPU flags). A /dev/kvm
// served by kvm_pvm runs only PVM-enabled guests, so it means TCG. The
// environment variable WARREN_QEMU_ACCEL=kvm|tcg overrides the choice.
func DetectAccel() (Accel, string) { return realHost.detect() }

func (h host) detect() (Accel, string) {
	switch v := h.getenv(AccelEnv); v {
	case "kvm", "tcg":
		return Accel(v), fmt.Sprintf("%s=%s", AccelEnv, v)
	case "":
	default:
		return TCG, fmt.Sprintf("%s=%q is neither kvm nor tcg; using tcg", AccelEnv, v)
	}
	v, err := h.kvmAPI()
	if err != nil {
		return TCG, fmt.Sprintf("no usable /dev/kvm (%v)", err)
	}
	if v != 12 {
		return TCG, fmt.Sprintf("/dev/kvm answers API version %d, not 12", v)
	}
	vendor := h.hasModule("kvm_intel") || h.hasModule("kvm_amd")
	if h.hasModule("kvm_pvm") && !vendor {
		return TCG, "/dev/kvm is served by kvm_pvm, which runs only PVM guests, not a stock kernel"
	}
	flags, _ := h.cpuFlags()
	f := " " + flags + " "
	hw := strings.Contains(f, " vmx ") || strings.Contains(f, " svm ")
	if !vendor && !hw {
		return TCG, "/dev/kvm has no hardware backend (no kvm_intel or kvm_amd, no vmx or svm CPU flag)"
	}
	return KVM, "/dev/kvm with hardware virtualization"
}
