// Package loopdev mounts a filesystem image file through a loop device:
// EROFS layers on kernels without file-backed EROFS (package image), and
// the copy of a microVM's writable disk a snapshot reads (package
// microvm).
package loopdev

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/errdefs"
)

// Mount attaches file to a free loop device, auto-clearing (the device
// detaches itself when unmounted), and mounts it on target as fstype
// with flags and data; MS_RDONLY in flags makes the device read-only too.
func Mount(file, target, fstype string, flags uintptr, data string) error {
	ro := flags&unix.MS_RDONLY != 0
	mode := os.O_RDWR
	if ro {
		mode = os.O_RDONLY
	}
	f, err := os.OpenFile(file, mode|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return errdefs.Unavailable("no loop devices: %v", err)
	}
	defer ctl.Close()
	for attempt := 0; attempt < 10; attempt++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return fmt.Errorf("loop-control: %w", err)
		}
		dev := fmt.Sprintf("/dev/loop%d", n)
		loop, err := os.OpenFile(dev, mode|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		cfg := unix.LoopConfig{Fd: uint32(f.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		if ro {
			cfg.Info.Flags |= unix.LO_FLAGS_READ_ONLY
		}
		err = unix.IoctlLoopConfigure(int(loop.Fd()), &cfg)
		if errors.Is(err, unix.EBUSY) {
			loop.Close() // taken by someone else between GET_FREE and here
			continue
		}
		if err != nil {
			loop.Close()
			return fmt.Errorf("configure %s: %w", dev, err)
		}
		err = unix.Mount(dev, target, fstype, flags, data)
		// With AUTOCLEAR the device detaches on the last close if the
		// mount failed, or on unmount if it succeeded.
		loop.Close()
		return err
	}
	return errors.New("no free loop device")
}
