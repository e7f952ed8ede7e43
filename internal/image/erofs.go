package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/warrenhq/warren/internal/errdefs"
)

// BuildOption adjusts BuildEROFS.
type BuildOption func(*buildConfig)

type buildConfig struct {
	timestamp *time.Time
	allRoot   bool
	sparse    bool
	plain     bool
}

// WithTimestamp gives every file in the image the modification time t,
// which makes the image byte-for-byte reproducible from the same tree. It
// discards the tree's own mtimes, so it is for trees whose mtimes mean
// nothing, such as the generated busybox base; mkfs.erofs 1.5 cannot fix
// the image's build time and keep per-file mtimes at once.
func WithTimestamp(t time.Time) BuildOption {
	return func(c *buildConfig) { c.timestamp = &t }
}

// WithAllRoot makes every file in the image owned by root (0:0), for trees
// an unprivileged user assembled.
func WithAllRoot() BuildOption {
	return func(c *buildConfig) { c.allRoot = true }
}

// WithSparse keeps holes in files as holes: file data is laid out in
// 4 KiB chunks, and a chunk that is all hole takes no space in the image
// (a chunk index entry). Without it a sparse file is stored at its full
// size. For trees a sandbox wrote: `truncate -s 1T` costs nothing there,
// and must not cost a terabyte here.
func WithSparse() BuildOption {
	return func(c *buildConfig) { c.sparse = true }
}

// WithPlainData lays every file's data out in whole blocks, its tail
// included (mkfs.erofs -E noinline_data: FLAT_PLAIN inodes). By default a
// file's tail shares a block with its inode (FLAT_INLINE), which is
// smaller; but a kernel mounting the image with dax maps only FLAT_PLAIN
// files in place, and reads every other through its own page cache. For
// images guests mount from virtio-pmem.
func WithPlainData() BuildOption {
	return func(c *buildConfig) { c.plain = true }
}

// BuildEROFS builds an uncompressed EROFS image of srcDir at outFile with
// mkfs.erofs. Uncompressed, because sandboxes read a small part of each
// layer and lazy loading fetches byte ranges.
//
// By default owners, modes, xattrs and per-file mtimes are kept as they
// are in srcDir: real images need them (make, pip and git look at mtimes),
// and the price is that two builds of one tree differ in the superblock's
// build time. The filesystem UUID is derived from the tree's metadata, not
// random, so that WithTimestamp builds are fully reproducible while
// distinct layers stacked in one overlay still get distinct UUIDs.
//
// The image is written to a temporary file next to outFile and renamed, so
// outFile is never half-written. Errors: ErrUnavailable if mkfs.erofs is
// missing, ErrNotFound if srcDir does not exist, ErrInvalid if it is not a
// directory.
func BuildEROFS(ctx context.Context, srcDir, outFile string, opts ...BuildOption) error {
	var cfg buildConfig
	for _, o := range opts {
		o(&cfg)
	}
	mkfs, err := exec.LookPath("mkfs.erofs")
	if err != nil {
		return errdefs.New(errdefs.ErrUnavailable, "mkfs_erofs_missing",
			"mkfs.erofs not found on PATH: run scripts/setup (installs erofs-utils)")
	}
	fi, err := os.Stat(srcDir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return errdefs.New(errdefs.ErrNotFound, "build_source_not_found", "build EROFS: source %s does not exist", srcDir)
	case err != nil:
		return fmt.Errorf("build EROFS: %w", err)
	case !fi.IsDir():
		return errdefs.Invalid("build EROFS: source %s is not a directory", srcDir)
	}
	uuid, err := treeUUID(ctx, srcDir, cfg)
	if err != nil {
		return fmt.Errorf("build EROFS from %s: %w", srcDir, err)
	}

	// erofs-utils 1.5 knows --quiet but not -q.
	args := []string{"--quiet", "-U" + uuid}
	if cfg.timestamp != nil {
		args = append(args, "-T"+strconv.FormatInt(cfg.timestamp.Unix(), 10))
	} else {
		args = append(args, "--preserve-mtime")
	}
	if cfg.allRoot {
		args = append(args, "--all-root")
	}
	if cfg.sparse {
		args = append(args, "--chunksize=4096")
	}
	if cfg.plain {
		args = append(args, "-Enoinline_data")
	}

	// With chunks (WithSparse), erofs-utils 1.5 gathers file data in a
	// tmpfile(3) in /tmp and copies it into the image with
	// copy_file_range, which fails (EIO) from one filesystem to another:
	// the image is then made on /tmp's and moved.
	tmpDir := filepath.Dir(outFile)
	if cfg.sparse && !sameFS(tmpDir, "/tmp") {
		tmpDir = "/tmp"
	}
	tmp, err := os.CreateTemp(tmpDir, "."+filepath.Base(outFile)+".tmp-*")
	if err != nil {
		return fmt.Errorf("build EROFS: %w", err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name()) // a no-op after the rename
	cmd := exec.CommandContext(ctx, mkfs, append(args, tmp.Name(), srcDir)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("build EROFS from %s: %w", srcDir, ctx.Err())
		}
		return fmt.Errorf("build EROFS from %s: %w: %s", srcDir, err, strings.TrimSpace(out.String()))
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("build EROFS: %w", err)
	}
	if err := moveFile(tmp.Name(), outFile); err != nil {
		return fmt.Errorf("build EROFS: %w", err)
	}
	return nil
}

// sameFS says whether a and b are on one filesystem.
func sameFS(a, b string) bool {
	var sa, sb syscall.Stat_t
	return syscall.Stat(a, &sa) == nil && syscall.Stat(b, &sb) == nil && sa.Dev == sb.Dev
}

// moveFile renames src to dst, or copies it there (synced) and removes it
// when they are on different filesystems; dst is never half-written.
func moveFile(src, dst string) error {
	err := os.Rename(src, dst)
	if !errors.Is(err, syscall.EXDEV) {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(out.Name()) // a no-op after the rename
	_, err = io.Copy(out, in)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(out.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(out.Name(), dst)
	}
	if err != nil {
		return err
	}
	return os.Remove(src)
}

// treeUUID hashes the metadata of every entry under root as the image will
// record it (path, type, mode, owner, size, mtime, link target) into a
// version 4 style UUID. A stat walk costs little next to mkfs, which reads
// every file anyway.
func treeUUID(ctx context.Context, root string, cfg buildConfig) (string, error) {
	h := sha256.New()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		var uid, gid uint32
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && !cfg.allRoot {
			uid, gid = st.Uid, st.Gid
		}
		mtime := fi.ModTime().UnixNano()
		if cfg.timestamp != nil {
			mtime = cfg.timestamp.Unix()
		}
		var target string
		if fi.Mode()&fs.ModeSymlink != 0 {
			target, _ = os.Readlink(p)
		}
		fmt.Fprintf(h, "%q %o %d:%d %d %d %q\n", rel, fi.Mode(), uid, gid, fi.Size(), mtime, target)
		return nil
	})
	if err != nil {
		return "", err
	}
	u := h.Sum(nil)[:16]
	u[6] = u[6]&0x0f | 0x40 // version 4: "random" as far as anyone can tell
	u[8] = u[8]&0x3f | 0x80 // RFC 4122 variant
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16]), nil
}
