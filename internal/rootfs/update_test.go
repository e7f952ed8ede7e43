package rootfs

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/testutil"
)

// TestCopyUpdate protects a snapshot made while its sandbox ran: after
// StartCopy and changes of every kind to the source (data, metadata,
// xattrs, entries added, removed, renamed, replaced by another type, hard
// links made), Update leaves the copy exactly as a fresh CopyTree of the
// source is, and copies only what changed.
func TestCopyUpdate(t *testing.T) {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	mkdir(t, src, 0o755, 0, 0)
	for i := range 50 {
		mkfile(t, filepath.Join(src, fmt.Sprintf("same/f%d", i)), "unchanged", 0o644, 0, 0)
	}
	mkfile(t, filepath.Join(src, "data"), "old", 0o644, 0, 0)
	mkfile(t, filepath.Join(src, "meta"), "m", 0o644, 0, 0)
	mkfile(t, filepath.Join(src, "gone"), "g", 0o644, 0, 0)
	mkfile(t, filepath.Join(src, "moved"), "mv", 0o644, 0, 0)
	mkfile(t, filepath.Join(src, "linked"), "l", 0o644, 0, 0)
	mkfile(t, filepath.Join(src, "swap/inner"), "i", 0o644, 0, 0)
	mkfile(t, filepath.Join(src, "opaq/x"), "x", 0o644, 0, 0)
	mkfile(t, filepath.Join(src, "xattr"), "x", 0o644, 0, 0)
	setXattr(t, filepath.Join(src, "xattr"), "user.a", "1")
	// Older than the racy window: only a real change counts.
	stampCtimeOld(t)

	cp, first, err := StartCopy(src, filepath.Join(dir, "copy"))
	if err != nil {
		t.Fatal(err)
	}
	// Changes of every kind.
	must(t, os.WriteFile(filepath.Join(src, "data"), []byte("new data"), 0o644))
	must(t, os.Chmod(filepath.Join(src, "meta"), 0o600))
	must(t, os.Remove(filepath.Join(src, "gone")))
	must(t, os.Rename(filepath.Join(src, "moved"), filepath.Join(src, "moved-to")))
	must(t, os.Link(filepath.Join(src, "linked"), filepath.Join(src, "same/link")))
	must(t, os.RemoveAll(filepath.Join(src, "swap")))
	mkfile(t, filepath.Join(src, "swap"), "now a file", 0o644, 0, 0)
	setXattr(t, filepath.Join(src, "opaq"), "trusted.overlay.opaque", "y")
	must(t, unix.Lremovexattr(filepath.Join(src, "xattr"), "user.a"))
	mkfile(t, filepath.Join(src, "new/deep/f"), "new", 0o640, 1000, 1000)
	mknod(t, filepath.Join(src, "wh"), unix.S_IFCHR|0o600, 0)

	st, err := cp.Update()
	if err != nil {
		t.Fatal(err)
	}
	fresh := filepath.Join(dir, "fresh")
	if _, err := CopyTree(src, fresh); err != nil {
		t.Fatal(err)
	}
	if got, want := describeTree(t, filepath.Join(dir, "copy")), describeTree(t, fresh); got != want {
		t.Errorf("the updated copy:\n%s\nis not what a fresh copy is:\n%s", got, want)
	}
	// Only the changes: not the 50 unchanged files again.
	if st.Files >= first.Files {
		t.Errorf("Update copied %d entries, the first pass %d: it should copy only what changed", st.Files, first.Files)
	}
}

// stampCtimeOld waits past the racy window, so that the ctimes of what
// was just made are older than a copy started now.
func stampCtimeOld(t *testing.T) {
	t.Helper()
	time.Sleep(racyWindow + 20*time.Millisecond)
}

// describeTree is every entry under dir with its type, mode, owner,
// content or target, xattrs, and which entries are one inode, sorted.
func describeTree(t *testing.T, dir string) string {
	t.Helper()
	var lines []string
	inodes := map[uint64][]string{}
	walk(t, dir, func(p string, st *unix.Stat_t) {
		rel, _ := filepath.Rel(dir, p)
		line := fmt.Sprintf("%s %o %d:%d", rel, st.Mode, st.Uid, st.Gid)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			b, err := os.ReadFile(p)
			must(t, err)
			line += " " + string(b)
			if st.Nlink > 1 {
				inodes[st.Ino] = append(inodes[st.Ino], rel)
			}
		case unix.S_IFLNK:
			target, err := os.Readlink(p)
			must(t, err)
			line += " -> " + target
		case unix.S_IFCHR:
			line += fmt.Sprintf(" dev %d", st.Rdev)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFLNK {
			sz, _ := unix.Llistxattr(p, nil)
			if sz > 0 {
				buf := make([]byte, sz)
				n, _ := unix.Llistxattr(p, buf)
				names := splitNul(buf[:n])
				sort.Strings(names)
				for _, name := range names {
					v, _ := getXattr(p, name)
					line += fmt.Sprintf(" %s=%s", name, v)
				}
			}
		}
		lines = append(lines, line)
	})
	for _, names := range inodes {
		sort.Strings(names)
		lines = append(lines, "linked: "+strings.Join(names, " "))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}
