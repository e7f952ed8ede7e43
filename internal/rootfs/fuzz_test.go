package rootfs

import (
	"archive/tar"
	"bytes"
	"io"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzWriteTar runs a small script of tar entries and file writes against a
// fresh root and asserts nothing outside the root ever changes and no
// temporary file is left behind. One command per line:
//
//	t DIR          extract under DIR (default "/")
//	d NAME         directory entry
//	f NAME         regular file entry
//	l NAME TARGET  symlink entry
//	h NAME TARGET  hard link entry
//	w PATH         WriteFile after extracting
//
// "$OUT" in names, targets and paths is the absolute host path of a
// directory beside the root that holds canaries, so mutations keep aiming
// at it. Seeds live in testdata/fuzz/FuzzWriteTar.
//
// Running it as root risks the host if there is a bug; run it as nobody:
//
//	go test -c -o /tmp/rootfs.test ./internal/rootfs
//	cd internal/rootfs && setpriv --reuid=65534 --regid=65534 --clear-groups \
//	    env HOME=/tmp /tmp/rootfs.test -test.fuzz=FuzzWriteTar -test.fuzztime=30s \
//	    -test.fuzzcachedir=/tmp/fuzzcache
func FuzzWriteTar(f *testing.F) {
	f.Fuzz(func(t *testing.T, script string) {
		s := newSandbox(t)
		dir := "/"
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		var writes []string
		for _, line := range strings.Split(strings.ReplaceAll(script, "$OUT", s.outside), "\n") {
			cmd, rest, _ := strings.Cut(line, " ")
			name, target, _ := strings.Cut(rest, " ")
			h := &tar.Header{Name: name, Linkname: target, Mode: 0o755, Format: tar.FormatPAX}
			switch cmd {
			case "t":
				dir = rest
				continue
			case "w":
				writes = append(writes, rest)
				continue
			case "d":
				h.Typeflag = tar.TypeDir
			case "f":
				h.Typeflag, h.Size = tar.TypeReg, 1
			case "l":
				h.Typeflag = tar.TypeSymlink
			case "h":
				h.Typeflag = tar.TypeLink
			default:
				continue
			}
			if tw.WriteHeader(h) != nil {
				return // not encodable: nothing to test
			}
			if h.Size > 0 {
				tw.Write([]byte("x"))
			}
		}
		tw.Close()

		// Errors are fine; escaping is not.
		WriteTar(s.root, dir, &buf)
		for _, p := range writes {
			WriteFile(s.root, p, 0o644, strings.NewReader("w"))
			ReadFile(s.root, p, io.Discard)
			Stat(s.root, p)
		}
		ReadTar(s.root, "/", io.Discard)

		s.checkOutside(t)
		filepath.WalkDir(s.root, func(p string, d fs.DirEntry, err error) error {
			if err == nil && strings.HasPrefix(d.Name(), ".warren-tmp-") {
				t.Errorf("temporary file left behind: %s", p)
			}
			return nil
		})
	})
}
