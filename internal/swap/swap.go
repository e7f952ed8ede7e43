// Package swap reads what swap a node has and sets up a zram swap device
// for it. Paused sandboxes (backend.Pauser) push their memory out: file
// pages go back to their files anyway, but anonymous memory goes only
// where the node swaps, and zram (compressed RAM) is the cheap place:
// idle sandboxes' memory compresses well and comes back in microseconds.
// A node gets one only when its operator asks (`warren agent --swap
// zram:SIZE`): swap is the host's, not warren's, to configure.
package swap

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/api"
)

// Device is one active swap area (/proc/swaps).
type Device struct {
	Name       string
	Size, Used int64 // bytes
}

// Devices lists the active swap areas.
func Devices() ([]Device, error) {
	f, err := os.Open("/proc/swaps")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Device
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 4 {
			continue
		}
		size, _ := strconv.ParseInt(fs[2], 10, 64)
		used, _ := strconv.ParseInt(fs[3], 10, 64)
		out = append(out, Device{Name: fs[0], Size: size << 10, Used: used << 10})
	}
	return out, sc.Err()
}

// Describe says in a line what pausing reclaims on this host: anonymous
// memory to swap (which, how much), or file pages only.
func Describe() string {
	devs, err := Devices()
	if err != nil {
		return "file pages only: " + err.Error()
	}
	if len(devs) == 0 {
		return "file pages only: no swap (warren agent --swap zram:SIZE adds one)"
	}
	var total int64
	names := make([]string, 0, len(devs))
	for _, d := range devs {
		total += d.Size
		names = append(names, filepath.Base(d.Name))
	}
	return fmt.Sprintf("anonymous memory to swap: %.1f GiB (%s)", float64(total)/(1<<30), strings.Join(names, ","))
}

// ParseSpec parses a --swap value: "zram:SIZE", SIZE as api.ParseQuantity
// reads it (4Gi, 512Mi, 4G).
func ParseSpec(s string) (int64, error) {
	v, ok := strings.CutPrefix(s, "zram:")
	q, err := api.ParseQuantity(v)
	if !ok || err != nil || q <= 0 {
		return 0, fmt.Errorf("swap %q: want zram:SIZE (e.g. zram:4Gi)", s)
	}
	return int64(q), nil
}

// Zram makes a free zram device a swap area of size bytes (lz4 where the
// kernel has it), at a high priority, and returns its path. It takes the
// first zram device with no disk size; ErrNoDevice when there is none (the
// zram module is not loaded, or every device is in use).
func Zram(size int64) (string, error) {
	devs, _ := filepath.Glob("/sys/block/zram*")
	for _, d := range devs {
		b, err := os.ReadFile(filepath.Join(d, "disksize"))
		if err != nil || strings.TrimSpace(string(b)) != "0" {
			continue
		}
		if haveCrypto("lz4") {
			os.WriteFile(filepath.Join(d, "comp_algorithm"), []byte("lz4"), 0) // best effort: the default works too
		}
		if err := os.WriteFile(filepath.Join(d, "disksize"), []byte(strconv.FormatInt(size, 10)), 0); err != nil {
			continue // taken meanwhile
		}
		dev := "/dev/" + filepath.Base(d)
		if out, err := exec.Command("mkswap", dev).CombinedOutput(); err != nil {
			resetZram(dev)
			return "", fmt.Errorf("mkswap %s: %v: %s", dev, err, strings.TrimSpace(string(out)))
		}
		if err := swapon(dev, 100); err != nil {
			resetZram(dev)
			return "", fmt.Errorf("swapon %s: %w", dev, err)
		}
		return dev, nil
	}
	return "", ErrNoDevice
}

// haveCrypto says whether the kernel's crypto API has algorithm name now
// (zram lists algorithms it knows, loaded or not; one in a module nobody
// loaded fails when the device is sized).
func haveCrypto(name string) bool {
	b, err := os.ReadFile("/proc/crypto")
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "name" && strings.TrimSpace(v) == name {
			return true
		}
	}
	return false
}

// ErrNoDevice: no free zram device.
var ErrNoDevice = errors.New("no free zram device (modprobe zram, or every one is in use)")

// Off turns off the swap area dev and, for a zram device, frees it.
func Off(dev string) error {
	p, err := unix.BytePtrFromString(dev)
	if err != nil {
		return err
	}
	if _, _, e := unix.Syscall(unix.SYS_SWAPOFF, uintptr(unsafe.Pointer(p)), 0, 0); e != 0 && e != unix.EINVAL {
		return fmt.Errorf("swapoff %s: %w", dev, e)
	}
	if strings.HasPrefix(filepath.Base(dev), "zram") {
		return resetZram(dev)
	}
	return nil
}

func resetZram(dev string) error {
	return os.WriteFile(filepath.Join("/sys/block", filepath.Base(dev), "reset"), []byte("1"), 0)
}

// swapon is swapon(2) with a priority (SWAP_FLAG_PREFER).
func swapon(dev string, prio int) error {
	const swapFlagPrefer, swapFlagPrioMask = 0x8000, 0x7fff
	p, err := unix.BytePtrFromString(dev)
	if err != nil {
		return err
	}
	flags := swapFlagPrefer | (prio & swapFlagPrioMask)
	if _, _, e := unix.Syscall(unix.SYS_SWAPON, uintptr(unsafe.Pointer(p)), uintptr(flags), 0); e != 0 {
		return e
	}
	return nil
}
