package qemu

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
)

// qcow2Magic starts every qcow2 file.
var qcow2Magic = []byte("QFI\xfb")

// CheckDiskImage checks that path is a qcow2 disk image that stands
// alone: no backing file and no external data file, either of which
// would make QEMU open a file the image names (any file of the host).
// An error wrapping ErrBadDisk otherwise.
func CheckDiskImage(ctx context.Context, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	magic := make([]byte, 4)
	_, err = f.ReadAt(magic, 0)
	f.Close()
	if err != nil || !bytes.Equal(magic, qcow2Magic) {
		return invalidDisk("not a qcow2 disk image")
	}
	out, err := exec.CommandContext(ctx, "qemu-img", "info", "--output=json", "-f", "qcow2", path).Output()
	if err != nil {
		return invalidDisk("qemu-img info: %v", err)
	}
	var info struct {
		Format          string `json:"format"`
		VirtualSize     int64  `json:"virtual-size"`
		BackingFilename string `json:"backing-filename"`
		FormatSpecific  struct {
			Data struct {
				DataFile string `json:"data-file"`
			} `json:"data"`
		} `json:"format-specific"`
	}
	if err := json.Unmarshal(out, &info); err != nil {
		return invalidDisk("qemu-img info: %v", err)
	}
	switch {
	case info.Format != "qcow2":
		return invalidDisk("disk image format %q, want qcow2", info.Format)
	case info.BackingFilename != "":
		return invalidDisk("disk image has a backing file (%s): import a standalone image (qemu-img convert -O qcow2)", info.BackingFilename)
	case info.FormatSpecific.Data.DataFile != "":
		return invalidDisk("disk image has an external data file (%s)", info.FormatSpecific.Data.DataFile)
	case info.VirtualSize <= 0:
		return invalidDisk("disk image of virtual size %d", info.VirtualSize)
	}
	return nil
}

// ErrBadDisk is wrapped by every CheckDiskImage refusal.
var ErrBadDisk = errors.New("bad disk image")

func invalidDisk(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadDisk, fmt.Sprintf(format, args...))
}

// IsDiskImage says whether the file at path starts as a qcow2 image.
func IsDiskImage(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	b := make([]byte, len(qcow2Magic))
	_, err = f.ReadAt(b, 0)
	return err == nil && bytes.Equal(b, qcow2Magic)
}
