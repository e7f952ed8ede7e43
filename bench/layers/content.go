package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// part is a host directory copied into a layer, for realistic file sizes,
// types and compressibility: a C toolchain in the base, a large source
// checkout and Python packages in the workspace, tools in the toolkit.
type part struct{ src, dst string }

var (
	baseParts = []part{
		{"/usr/lib/gcc", "usr/lib/gcc"},
	}
	workspaceParts = []part{
		{"/usr/local/go/src", "workspace/repo"},
		{"/usr/lib/python3/dist-packages", "workspace/.venv/lib/python3.11/site-packages"},
	}
	toolkitParts = []part{
		{"/usr/lib/git-core", "opt/harness/git-core"},
		{"/usr/lib/node_modules", "opt/harness/node_modules"},
		{"/usr/lib/cni", "opt/harness/bin"},
	}
)

// source is the tree one layer is built from.
type source struct {
	kind, name, version string
	dir                 string
	notes               []string // what went in
	files               int      // entries of every type
	bytes               int64    // regular files' apparent size
}

func (s *source) ref() string { return s.name + "@" + s.version }

// content is the image under test: four layer trees (harness@8 is the
// upgrade) and a tar.gz of base+workspace+harness@7.
type content struct {
	base, workspace, harness7, harness8 *source
	osInfo                              string
	tarball                             string
	tarSize                             int64
	tarTime                             time.Duration
}

func (c *content) stack() []*source { return []*source{c.base, c.workspace, c.harness7} }

func (c *content) bytes() (n int64) {
	for _, s := range c.stack() {
		n += s.bytes
	}
	return n
}

func (c *content) files() (n int) {
	for _, s := range c.stack() {
		n += s.files
	}
	return n
}

func prepareContent(ctx context.Context, cfg config, dir string) (*content, error) {
	t := time.Now()
	rootfs := cfg.rootfs
	if rootfs == "" {
		rootfs = filepath.Join(dir, "debian-python")
		fmt.Printf("building the debian-python rootfs with %s ...\n", cfg.script)
		cmd := exec.CommandContext(ctx, cfg.script, rootfs)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("%s: %w (or pass -rootfs)", cfg.script, err)
		}
	}
	stamp, err := os.ReadFile(filepath.Join(rootfs, "etc/warren-image"))
	if err != nil {
		return nil, fmt.Errorf("-rootfs %s is not a debian-python image (no etc/warren-image): %w", rootfs, err)
	}
	c := &content{osInfo: stampInfo(string(stamp))}
	src := filepath.Join(dir, "src")
	mk := func(kind, name, version string) *source {
		return &source{kind: kind, name: name, version: version, dir: filepath.Join(src, name+"-"+version)}
	}
	c.base = mk("base", "debian-python", "12")
	c.workspace = mk("workspace", "swe-task", "1")
	c.harness7 = mk("toolkit", "harness", "7")
	c.harness8 = mk("toolkit", "harness", "8")

	if err := os.MkdirAll(src, 0o755); err != nil {
		return nil, err
	}
	if err := copyTree(ctx, rootfs, c.base.dir); err != nil {
		return nil, err
	}
	c.base.notes = append(c.base.notes, "debian-python rootfs ("+c.osInfo+")")
	for _, l := range []struct {
		s     *source
		parts []part
	}{{c.base, baseParts}, {c.workspace, workspaceParts}, {c.harness7, toolkitParts}} {
		if err := os.MkdirAll(l.s.dir, 0o755); err != nil {
			return nil, err
		}
		for _, p := range l.parts {
			if _, err := os.Stat(p.src); err != nil {
				l.s.notes = append(l.s.notes, "(host lacks "+p.src+")")
				continue
			}
			dst := filepath.Join(l.s.dir, p.dst)
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return nil, err
			}
			if err := copyTree(ctx, p.src, dst); err != nil {
				return nil, err
			}
			l.s.notes = append(l.s.notes, p.src+" -> /"+p.dst)
		}
	}
	// The harness's own program and version: the part an upgrade changes.
	if err := writeRandom(filepath.Join(c.harness7.dir, "opt/harness/bin/harness"), 4<<20, 7); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(c.harness7.dir, "opt/harness/VERSION"), []byte("7\n"), 0o644); err != nil {
		return nil, err
	}
	c.harness7.notes = append(c.harness7.notes, "4 MiB random /opt/harness/bin/harness, /opt/harness/VERSION")

	for _, s := range c.stack() {
		if s.files, s.bytes, err = treeSize(s.dir); err != nil {
			return nil, err
		}
	}
	if short := cfg.sizeMB*1e6 - c.bytes(); short > 0 {
		n, err := synthesize(filepath.Join(c.workspace.dir, "workspace/data"), short)
		if err != nil {
			return nil, err
		}
		c.workspace.notes = append(c.workspace.notes, fmt.Sprintf("%s of synthetic text files (seeded random words, 4 KiB-1 MiB) -> /workspace/data", mb(n)))
		if c.workspace.files, c.workspace.bytes, err = treeSize(c.workspace.dir); err != nil {
			return nil, err
		}
	}

	if err := copyTree(ctx, c.harness7.dir, c.harness8.dir); err != nil {
		return nil, err
	}
	if err := writeRandom(filepath.Join(c.harness8.dir, "opt/harness/bin/harness"), 4<<20, 8); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(c.harness8.dir, "opt/harness/VERSION"), []byte("8\n"), 0o644); err != nil {
		return nil, err
	}
	c.harness8.notes = []string{"harness@7 with a new 4 MiB /opt/harness/bin/harness and VERSION"}
	if c.harness8.files, c.harness8.bytes, err = treeSize(c.harness8.dir); err != nil {
		return nil, err
	}

	// The peer's image: the same three trees as one tar.gz, the way an
	// OCI image's layers are gzip'd tars (gzip's default level, 6).
	merged := filepath.Join(dir, "merged")
	if err := mountStack(merged, []string{c.base.dir, c.workspace.dir, c.harness7.dir}); err != nil {
		return nil, err
	}
	c.tarball = filepath.Join(dir, "image.tar.gz")
	tt := time.Now()
	out, err := exec.CommandContext(ctx, "tar", "--numeric-owner", "-C", merged, "-czf", c.tarball, ".").CombinedOutput()
	c.tarTime = time.Since(tt)
	unix.Unmount(merged, unix.MNT_DETACH)
	if err != nil {
		return nil, fmt.Errorf("tar -czf: %v: %s", err, out)
	}
	fi, err := os.Stat(c.tarball)
	if err != nil {
		return nil, err
	}
	c.tarSize = fi.Size()
	fmt.Printf("image content ready in %s\n", time.Since(t).Round(time.Second))
	return c, nil
}

// stampInfo summarises the rootfs's /etc/warren-image.
func stampInfo(stamp string) string {
	kv := map[string]string{}
	for _, l := range strings.Split(stamp, "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			kv[k] = v
		}
	}
	return fmt.Sprintf("Debian %s %s, python %s, from %s", kv["version"], kv["suite"], kv["python"], kv["mirror"])
}

// mountStack mounts a read-only overlay of dirs (bottom first) on target.
func mountStack(target string, dirs []string) error {
	if err := os.MkdirAll(target, 0o755); err != nil {
		return err
	}
	lower := make([]string, len(dirs))
	for i, d := range dirs {
		lower[len(dirs)-1-i] = d
	}
	if err := unix.Mount("overlay", target, "overlay", unix.MS_RDONLY, "lowerdir="+strings.Join(lower, ":")); err != nil {
		return fmt.Errorf("mount overlay of %d dirs on %s: %w", len(dirs), target, err)
	}
	return nil
}

// copyTree copies src to dst (which must not exist, or for a directory
// src, may exist and is merged into) keeping owners, modes, links and
// xattrs.
func copyTree(ctx context.Context, src, dst string) error {
	args := []string{"-a", src, dst}
	if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
		args = []string{"-a", "-T", src, dst}
	}
	if out, err := exec.CommandContext(ctx, "cp", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("cp %s %s: %v: %s", src, dst, err, out)
	}
	return nil
}

// treeSize counts the entries under dir and the apparent size of its
// regular files, each inode once.
func treeSize(dir string) (files int, bytes int64, err error) {
	seen := map[uint64]bool{}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == dir {
			return nil
		}
		files++
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			ino := fi.Sys().(*syscall.Stat_t).Ino
			if !seen[ino] {
				seen[ino] = true
				bytes += fi.Size()
			}
		}
		return nil
	})
	return files, bytes, err
}

// synthesize writes at least want bytes of text files under dir: words
// drawn from a fixed, seeded vocabulary (so gzip shrinks them about as
// much as source code), sizes spread from 4 KiB to 1 MiB.
func synthesize(dir string, want int64) (int64, error) {
	r := rand.New(rand.NewPCG(1, 2))
	const letters = "abcdefghijklmnopqrstuvwxyz_"
	words := make([]string, 4096)
	for i := range words {
		b := make([]byte, 2+r.IntN(9))
		for j := range b {
			b[j] = letters[r.IntN(len(letters))]
		}
		words[i] = string(b)
	}
	var total int64
	for i := 0; total < want; i++ {
		p := filepath.Join(dir, fmt.Sprintf("%03d", i/200), fmt.Sprintf("f%05d.txt", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return total, err
		}
		f, err := os.Create(p)
		if err != nil {
			return total, err
		}
		w := bufio.NewWriter(f)
		size := int64(4<<10) << r.IntN(9)
		size += r.Int64N(size)
		var n int64
		for n < size {
			k, _ := w.WriteString(words[r.IntN(len(words))])
			sep := " "
			if r.IntN(12) == 0 {
				sep = "\n"
			}
			w.WriteString(sep)
			n += int64(k + 1)
		}
		if err := errors.Join(w.Flush(), f.Close()); err != nil {
			return total, err
		}
		total += n
	}
	return total, nil
}

// writeRandom writes n incompressible bytes, like a binary, seeded.
func writeRandom(path string, n int, seed uint64) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	var key [32]byte
	key[0] = byte(seed)
	b := make([]byte, n)
	rand.NewChaCha8(key).Read(b)
	return os.WriteFile(path, b, 0o755)
}
