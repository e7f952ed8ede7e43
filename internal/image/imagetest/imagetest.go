// Package imagetest builds small EROFS layers for tests: a busybox root
// filesystem good enough to run shell commands in a sandbox, or a layer
// from any directory. Tests that use it need mkfs.erofs (and busybox for
// BusyboxLayer); the helpers skip or fail through testutil when missing.
package imagetest

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/testutil"
)

// BusyboxPath is where Debian's busybox-static installs its binary.
const BusyboxPath = "/bin/busybox"

// BusyboxLayer builds a base layer holding a static busybox with a symlink
// per applet in /bin (sh, echo, cat, sleep, ls, id, hostname, ...), an
// /etc/passwd with root and nobody, /etc/group, and the usual empty
// directories (/tmp, /root, /proc, /dev, /sys, ...). The image lives in
// t.TempDir().
func BusyboxLayer(t testing.TB) backend.Layer {
	t.Helper()
	if _, err := os.Stat(BusyboxPath); err != nil {
		testutil.Unavailable(t, "needs a static busybox at %s (apt-get install busybox-static)", BusyboxPath)
	}
	src := filepath.Join(t.TempDir(), "busybox-root")
	for _, d := range []string{"bin", "etc", "root", "proc", "dev", "sys", "run", "var/tmp", "home", "usr/bin", "box"} {
		must(t, os.MkdirAll(filepath.Join(src, d), 0o755))
	}
	must(t, os.Mkdir(filepath.Join(src, "tmp"), 0o755))
	must(t, os.Chmod(filepath.Join(src, "tmp"), 0o1777)) // Mkdir applies the umask
	must(t, copyFile(BusyboxPath, filepath.Join(src, "bin", "busybox"), 0o755))
	out, err := exec.Command(BusyboxPath, "--list").Output()
	if err != nil {
		t.Fatalf("busybox --list: %v", err)
	}
	for _, applet := range strings.Fields(string(out)) {
		if applet == "busybox" || strings.Contains(applet, "/") {
			continue
		}
		must(t, os.Symlink("busybox", filepath.Join(src, "bin", applet)))
	}
	must(t, os.Symlink("/bin/env", filepath.Join(src, "usr", "bin", "env")))
	files := map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
		"etc/group":  "root:x:0:\nnogroup:x:65534:\n",
		"etc/hosts":  "127.0.0.1\tlocalhost\n::1\tlocalhost\n",
	}
	for name, body := range files {
		must(t, os.WriteFile(filepath.Join(src, name), []byte(body), 0o644))
	}
	return FromDir(t, src)
}

// FromDir builds an EROFS layer from the directory tree src. The image lives
// in t.TempDir() and its digest is the sha256 of the image file.
func FromDir(t testing.TB, src string) backend.Layer {
	t.Helper()
	testutil.RequireBinary(t, "mkfs.erofs")
	img := filepath.Join(t.TempDir(), "layer.erofs")
	// erofs-utils 1.5 knows --quiet but not -q.
	if out, err := exec.Command("mkfs.erofs", "--quiet", img, src).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.erofs: %v: %s", err, out)
	}
	f, err := os.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return backend.Layer{Digest: "sha256:" + hex.EncodeToString(h.Sum(nil)), Path: img}
}

func copyFile(from, to string, mode os.FileMode) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
