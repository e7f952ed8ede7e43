package image

import (
	"bufio"
	"compress/flate"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/rootfs"
)

// extractTarball unpacks a tar stream, gzip-compressed or not (told by
// its first bytes), into the existing directory dir with rootfs.WriteTar.
// A corrupt, truncated or empty archive is ErrInvalid.
func extractTarball(r io.Reader, dir string) error {
	br := bufio.NewReaderSize(r, 64<<10)
	magic, err := br.Peek(2)
	if len(magic) == 0 {
		if err == nil || errors.Is(err, io.EOF) {
			return errdefs.Invalid("empty archive: want a tar or tar.gz of the layer's files")
		}
		return fmt.Errorf("read archive: %w", err)
	}
	var src io.Reader = br
	if len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return corrupt(err)
		}
		defer gz.Close()
		src = gz
	}
	if err := rootfs.WriteTar(dir, "/", src); err != nil {
		return corrupt(err)
	}
	// Read to the end: tar stops at its end marker, and gzip checks its
	// checksum only at the end of the stream.
	if _, err := io.Copy(io.Discard, src); err != nil {
		return corrupt(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	if len(entries) == 0 {
		return errdefs.Invalid("the archive holds no files")
	}
	return nil
}

// corrupt classifies decompression and archive format errors as
// ErrInvalid; others (a full disk, say) stay what they are.
func corrupt(err error) error {
	var ce flate.CorruptInputError
	switch {
	case errors.Is(err, errdefs.ErrInvalid):
		return err
	case errors.Is(err, gzip.ErrHeader), errors.Is(err, gzip.ErrChecksum), errors.As(err, &ce),
		errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("corrupt archive: %w: %w", errdefs.ErrInvalid, err)
	}
	return err
}
