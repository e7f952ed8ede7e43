package initramfs

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// writeModule writes a minimal ELF64 object with a .modinfo section.
func writeModule(t *testing.T, path, modinfo string) {
	t.Helper()
	info := []byte(modinfo)
	shstr := []byte("\x00.modinfo\x00.shstrtab\x00")
	infoOff := uint64(64)
	strOff := infoOff + uint64(len(info))
	shOff := (strOff + uint64(len(shstr)) + 7) &^ 7
	var b bytes.Buffer
	h := elf.Header64{Type: uint16(elf.ET_REL), Machine: uint16(elf.EM_X86_64), Version: 1,
		Shoff: shOff, Ehsize: 64, Shentsize: 64, Shnum: 3, Shstrndx: 2}
	copy(h.Ident[:], []byte{0x7f, 'E', 'L', 'F', byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), 1})
	binary.Write(&b, binary.LittleEndian, h)
	b.Write(info)
	b.Write(shstr)
	b.Write(make([]byte, shOff-uint64(b.Len())))
	for _, s := range []elf.Section64{
		{},
		{Name: 1, Type: uint32(elf.SHT_PROGBITS), Off: infoOff, Size: uint64(len(info)), Addralign: 1},
		{Name: 10, Type: uint32(elf.SHT_STRTAB), Off: strOff, Size: uint64(len(shstr)), Addralign: 1},
	} {
		binary.Write(&b, binary.LittleEndian, s)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func moduleTree(t *testing.T) string {
	dir := t.TempDir()
	for path, info := range map[string]string{
		"kernel/fs/a.ko":        "license=GPL\x00depends=b,c\x00name=a\x00",
		"kernel/fs/b.ko":        "depends=c\x00name=b\x00",
		"kernel/lib/c.ko":       "depends=\x00name=c\x00",
		"kernel/drivers/d-x.ko": "depends=c\x00",
		"kernel/drivers/e.ko":   "depends=missing\x00",
	} {
		writeModule(t, filepath.Join(dir, path), info)
	}
	return dir
}

func TestResolve(t *testing.T) {
	dir := moduleTree(t)
	for _, tc := range []struct {
		load []string
		want string // names in load order
		err  string
	}{
		{load: []string{"a"}, want: "c b a"},
		{load: []string{"b", "a", "c"}, want: "c b a"},
		{load: []string{"d_x", "a"}, want: "c d_x b a"},
		{load: []string{"d-x"}, want: "c d_x"},
		{load: []string{"e"}, err: "module missing (needed by e) not found"},
		{load: []string{"nope"}, err: "module nope not found"},
	} {
		t.Run(strings.Join(tc.load, ","), func(t *testing.T) {
			mods, err := Resolve(dir, tc.load)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, want an error saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, m := range mods {
				names = append(names, m.Name)
			}
			if got := strings.Join(names, " "); got != tc.want {
				t.Fatalf("load order %q, want %q", got, tc.want)
			}
		})
	}
	if _, err := Resolve(t.TempDir(), []string{"a"}); err == nil || !strings.Contains(err.Error(), "no uncompressed .ko") {
		t.Errorf("empty tree: got %v", err)
	}

	// Built in: b (so a needs only c loaded); a kernel with everything
	// built in has a tree with its modules.builtin.modinfo alone.
	builtin := "b.file=fs/b\x00b.license=GPL\x00d_x.file=drivers/d-x\x00"
	if err := os.WriteFile(filepath.Join(dir, BuiltinInfo), []byte(builtin), 0o644); err != nil {
		t.Fatal(err)
	}
	if mods, err := Resolve(dir, []string{"a", "d-x"}); err != nil || len(mods) != 2 || mods[0].Name != "c" || mods[1].Name != "a" {
		t.Errorf("with b and d_x built in: %+v, %v; want c, a", mods, err)
	}
	bare := t.TempDir()
	if err := os.WriteFile(filepath.Join(bare, BuiltinInfo), []byte(builtin), 0o644); err != nil {
		t.Fatal(err)
	}
	if mods, err := Resolve(bare, []string{"b", "d_x"}); err != nil || len(mods) != 0 {
		t.Errorf("all built in: %+v, %v; want nothing to load", mods, err)
	}
	if _, err := Resolve(bare, []string{"b", "a"}); err == nil || !strings.Contains(err.Error(), "module a not found") {
		t.Errorf("a neither built in nor in the tree: got %v", err)
	}
}

// entry is one record of a newc archive.
type entry struct {
	name       string
	mode       uint32
	rmaj, rmin uint32
	data       []byte
	ino, nlink uint32
}

// readNewc parses a newc archive strictly: magic, hex fields, 4-byte
// alignment of names and data, a trailer last.
func readNewc(t *testing.T, b []byte) []entry {
	t.Helper()
	var out []entry
	off := 0
	for {
		if len(b)-off < 110 || string(b[off:off+6]) != "070701" {
			t.Fatalf("bad header at %d", off)
		}
		f := func(i int) uint32 {
			v, err := strconv.ParseUint(string(b[off+6+8*i:off+14+8*i]), 16, 32)
			if err != nil {
				t.Fatalf("field %d at %d: %v", i, off, err)
			}
			return uint32(v)
		}
		e := entry{ino: f(0), mode: f(1), nlink: f(4), rmaj: f(9), rmin: f(10)}
		size, namesize := int(f(6)), int(f(11))
		name := b[off+110 : off+110+namesize]
		if name[namesize-1] != 0 {
			t.Fatalf("name at %d not NUL-terminated", off)
		}
		e.name = string(name[:namesize-1])
		off += 110 + namesize
		off = (off + 3) &^ 3
		e.data = b[off : off+size]
		off += size
		if off%4 != 0 {
			if !bytes.Equal(b[off:(off+3)&^3], make([]byte, ((off+3)&^3)-off)) {
				t.Fatalf("padding at %d not zero", off)
			}
			off = (off + 3) &^ 3
		}
		if e.name == "TRAILER!!!" {
			if off != len(b) {
				t.Fatalf("%d bytes after the trailer", len(b)-off)
			}
			return out
		}
		out = append(out, e)
	}
}

func TestWrite(t *testing.T) {
	dir := moduleTree(t)
	init := filepath.Join(t.TempDir(), "init")
	if err := os.WriteFile(init, []byte("#!static init, 17 b"), 0o755); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := Write(&b, Spec{Init: init, Modules: dir, Load: []string{"a"}, Dirs: []string{"etc"}}); err != nil {
		t.Fatal(err)
	}
	entries := readNewc(t, b.Bytes())
	byName := map[string]entry{}
	inos := map[uint32]bool{}
	for _, e := range entries {
		byName[e.name] = e
		if inos[e.ino] {
			t.Errorf("inode %d used twice", e.ino)
		}
		inos[e.ino] = true
	}
	for _, d := range []string{"dev", "proc", "sys", "newroot", "etc", ModuleDir} {
		if e, ok := byName[d]; !ok || e.mode&syscall.S_IFMT != syscall.S_IFDIR || e.nlink != 2 {
			t.Errorf("directory %s: %+v", d, e)
		}
	}
	if e := byName["dev/console"]; e.mode != syscall.S_IFCHR|0o600 || e.rmaj != 5 || e.rmin != 1 {
		t.Errorf("dev/console: mode %o rdev %d:%d, want char 5:1", e.mode, e.rmaj, e.rmin)
	}
	if e := byName["init"]; e.mode != syscall.S_IFREG|0o755 || string(e.data) != "#!static init, 17 b" {
		t.Errorf("init: mode %o data %q", e.mode, e.data)
	}
	var mods []string
	for _, e := range entries {
		if strings.HasPrefix(e.name, ModuleDir+"/") {
			mods = append(mods, strings.TrimPrefix(e.name, ModuleDir+"/"))
			if _, err := elf.NewFile(bytes.NewReader(e.data)); err != nil {
				t.Errorf("%s is not the module's ELF: %v", e.name, err)
			}
		}
	}
	if got := strings.Join(mods, " "); got != "000-c.ko 001-b.ko 002-a.ko" {
		t.Errorf("modules %q, want c, b, a in load order", got)
	}
	if err := Write(&bytes.Buffer{}, Spec{Init: init, Modules: dir, Load: []string{"e"}}); err == nil {
		t.Error("a module with a missing dependency was written")
	}
}
