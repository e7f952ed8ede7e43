// Package initramfs builds the initial RAM filesystem a warren guest boots
// from: a newc cpio archive holding a static /init (guest/init), the kernel
// modules the guest needs before its root is mounted, in load order, and
// /dev/console. It needs no root and no host tool: device nodes are
// records in the archive, and module dependencies are read from each
// module's .modinfo section, so a kernel package merely unpacked (no
// depmod, no modules.dep) is enough.
//
// Distribution kernels build virtio, 9p, EROFS and overlayfs as modules;
// a guest init loads the listed files of ModuleDir in lexical order. A
// kernel that builds them in needs none of them loaded (Resolve).
package initramfs

import (
	"debug/elf"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// ModuleDir is where modules sit in the archive; their names start with
// a three-digit load order (000-virtio.ko, 001-virtio_ring.ko, ...).
const ModuleDir = "lib/modules/warren"

// Spec says what goes into an initramfs.
type Spec struct {
	// Init is the host path of a static binary, installed as /init.
	Init string
	// Modules is a kernel's module tree (<root>/lib/modules/<release>).
	Modules string
	// Load names the modules to load ("virtio_blk", "9pnet_virtio", ...);
	// their dependencies are added before them.
	Load []string
	// Dirs are extra empty directories to create.
	Dirs []string
	// Files are extra files: archive path -> host path (mode 0755), their
	// parents among Dirs.
	Files map[string]string
}

// Write writes the archive to w. It fails with a clear error when a named
// module or one of its dependencies is missing from Spec.Modules.
func Write(w io.Writer, s Spec) error {
	mods, err := Resolve(s.Modules, s.Load)
	if err != nil {
		return err
	}
	init, err := os.ReadFile(s.Init)
	if err != nil {
		return fmt.Errorf("initramfs: init: %w", err)
	}
	c := NewWriter(w)
	dirs := append([]string{"dev", "proc", "sys", "newroot", "lib", "lib/modules", ModuleDir}, s.Dirs...)
	for _, d := range dirs {
		if err := c.Dir(d, 0o755); err != nil {
			return err
		}
	}
	if err := c.CharDev("dev/console", 0o600, 5, 1); err != nil {
		return err
	}
	if err := c.File("init", 0o755, init); err != nil {
		return err
	}
	extra := make([]string, 0, len(s.Files))
	for name := range s.Files {
		extra = append(extra, name)
	}
	sort.Strings(extra)
	for _, name := range extra {
		b, err := os.ReadFile(s.Files[name])
		if err != nil {
			return fmt.Errorf("initramfs: %w", err)
		}
		if err := c.File(name, 0o755, b); err != nil {
			return err
		}
	}
	for i, m := range mods {
		b, err := os.ReadFile(m.Path)
		if err != nil {
			return fmt.Errorf("initramfs: %w", err)
		}
		if err := c.File(fmt.Sprintf("%s/%03d-%s.ko", ModuleDir, i, m.Name), 0o644, b); err != nil {
			return err
		}
	}
	return c.Close()
}

// Module is one kernel module file and the modules it depends on.
type Module struct {
	Name    string // as the kernel names it: '-' read as '_'
	Path    string
	Depends []string
}

// Resolve returns the modules named in load, each after its dependencies,
// found under dir (a lib/modules/<release> tree). A module the kernel has
// built in (its modules.builtin.modinfo, which kernel builds and Debian's
// packages carry) needs no loading and is left out; any other name
// missing from the tree is an error. A kernel with everything built in
// (scripts/build-guest-kernel's) needs a tree with that file alone.
func Resolve(dir string, load []string) ([]Module, error) {
	index, err := scan(dir)
	if err != nil {
		return nil, err
	}
	builtin, err := builtins(dir)
	if err != nil {
		return nil, err
	}
	if len(index) == 0 && len(builtin) == 0 {
		return nil, fmt.Errorf("initramfs: no uncompressed .ko modules and no modules.builtin.modinfo under %s", dir)
	}
	var out []Module
	seen := map[string]bool{}
	var visit func(name, from string) error
	visit = func(name, from string) error {
		name = canon(name)
		if seen[name] || builtin[name] {
			return nil
		}
		path, ok := index[name]
		if !ok {
			if from != "" {
				return fmt.Errorf("initramfs: module %s (needed by %s) not found in %s", name, from, dir)
			}
			return fmt.Errorf("initramfs: module %s not found in %s", name, dir)
		}
		seen[name] = true
		deps, err := depends(path)
		if err != nil {
			return err
		}
		for _, d := range deps {
			if err := visit(d, name); err != nil {
				return err
			}
		}
		out = append(out, Module{Name: name, Path: path, Depends: deps})
		return nil
	}
	for _, n := range load {
		if err := visit(n, ""); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func canon(name string) string { return strings.ReplaceAll(name, "-", "_") }

// scan maps module names to files under dir.
func scan(dir string) (map[string]string, error) {
	index := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".ko") {
			index[canon(strings.TrimSuffix(d.Name(), ".ko"))] = p
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("initramfs: modules: %w", err)
	}
	return index, nil
}

// BuiltinInfo is the file of a module tree that lists what the kernel
// has built in: NUL-separated "module.key=value" records.
const BuiltinInfo = "modules.builtin.modinfo"

// builtins returns the names of the modules built into the kernel of
// module tree dir (none where it has no BuiltinInfo).
func builtins(dir string) (map[string]bool, error) {
	b, err := os.ReadFile(filepath.Join(dir, BuiltinInfo))
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("initramfs: %w", err)
	}
	names := map[string]bool{}
	for _, rec := range strings.Split(string(b), "\x00") {
		if name, _, ok := strings.Cut(rec, "."); ok && name != "" {
			names[canon(name)] = true
		}
	}
	return names, nil
}

// depends reads the depends= field of a module's .modinfo section.
func depends(path string) ([]string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("initramfs: %s: %w", path, err)
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, fmt.Errorf("initramfs: %s has no .modinfo section", path)
	}
	b, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf("initramfs: %s: %w", path, err)
	}
	var deps []string
	for _, kv := range strings.Split(string(b), "\x00") {
		if v, ok := strings.CutPrefix(kv, "depends="); ok && v != "" {
			deps = append(deps, strings.Split(v, ",")...)
		}
	}
	sort.Strings(deps)
	return deps, nil
}
