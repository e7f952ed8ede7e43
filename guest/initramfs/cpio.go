package initramfs

import (
	"fmt"
	"io"
	"strings"
	"syscall"
)

// Writer writes a cpio archive in the "newc" format the kernel unpacks
// (Documentation/driver-api/early-userspace/buffer-format.rst): every
// entry owned by root, with a fixed mtime so the same inputs make the same
// bytes.
type Writer struct {
	w   io.Writer
	ino uint32
	err error
}

// NewWriter returns a Writer on w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w, ino: 1} }

// Dir adds a directory.
func (c *Writer) Dir(name string, perm uint32) error {
	return c.entry(name, syscall.S_IFDIR|perm, 0, 0, nil)
}

// File adds a regular file.
func (c *Writer) File(name string, perm uint32, data []byte) error {
	return c.entry(name, syscall.S_IFREG|perm, 0, 0, data)
}

// CharDev adds a character device node.
func (c *Writer) CharDev(name string, perm, major, minor uint32) error {
	return c.entry(name, syscall.S_IFCHR|perm, major, minor, nil)
}

// Symlink adds a symbolic link to target.
func (c *Writer) Symlink(name, target string) error {
	return c.entry(name, syscall.S_IFLNK|0o777, 0, 0, []byte(target))
}

// Close writes the trailer. It does not close the underlying writer.
func (c *Writer) Close() error {
	c.ino = 0
	return c.entry("TRAILER!!!", 0, 0, 0, nil)
}

func (c *Writer) entry(name string, mode, rmajor, rminor uint32, data []byte) error {
	if c.err != nil {
		return c.err
	}
	name = strings.TrimPrefix(name, "/")
	if name == "" || strings.Contains(name, "\x00") {
		return fmt.Errorf("initramfs: bad entry name %q", name)
	}
	nlink := uint32(1)
	if mode&syscall.S_IFMT == syscall.S_IFDIR {
		nlink = 2
	}
	ino := c.ino
	if ino != 0 {
		c.ino++
	}
	hdr := fmt.Sprintf("070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rmajor, rminor, len(name)+1, 0)
	c.write([]byte(hdr))
	c.write([]byte(name + "\x00"))
	c.pad(len(hdr) + len(name) + 1)
	c.write(data)
	c.pad(len(data))
	return c.err
}

func (c *Writer) write(b []byte) {
	if c.err == nil {
		_, c.err = c.w.Write(b)
	}
}

// pad aligns to 4 bytes after n bytes.
func (c *Writer) pad(n int) {
	if r := n % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}
