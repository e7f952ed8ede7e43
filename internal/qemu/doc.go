// Package qemu runs QEMU machines for warren: it builds a machine's argv
// from a small description (Machine), picks the accelerator the host can
// really use (DetectAccel: KVM where /dev/kvm boots a stock kernel, TCG
// otherwise, with the reason), starts the machine with its serial console
// captured (Start, Console), and talks QMP to a running one (DialQMP).
//
// A machine boots a kernel directly (microVMs) or, as a full VM, boots
// its firmware from a raw or qcow2 disk; it may have a display (a VGA
// device, a VNC server on a unix socket, an absolute pointer), which QMP
// reads (Screendump) and drives (SendKeys, TypeText, PointerMove, Click)
// as an agent on a GUI task would.
//
// It is shared by scripts/test-cgroup-v2, which boots a Debian kernel with
// cgroup v1 disabled to test the container backend and FnCall on a
// v2-only host, and by the microVM and vm backends. The guest side (its
// init and initramfs) lives in guest/; scripts/build-vm-disk builds the
// Debian disk image the display test boots.
//
// Host facts it is built for: QEMU 7.2 (Debian 12); on the development and
// CI machines /dev/kvm serves only PVM guests (kvm_pvm), so KVM cannot boot
// a stock kernel and TCG is used; `-M pc` boots a Debian kernel to
// userspace in about 10 s under TCG, while `-M microvm` hangs at TSC
// calibration under TCG.
package qemu
