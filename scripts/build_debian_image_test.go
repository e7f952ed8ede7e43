// Package scripts holds tests of the host scripts beside it.
package scripts

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/image/imagetest"
	"github.com/warrenhq/warren/internal/testutil"
)

// fakeEtc writes files (path -> content) into a new directory standing in
// for /etc, and returns the environment that points the scripts at it.
func fakeEtc(t *testing.T, files map[string]string) []string {
	t.Helper()
	etc := t.TempDir()
	for name, content := range files {
		p := filepath.Join(etc, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return append(os.Environ(),
		"WARREN_APT_ETC="+filepath.Join(etc, "apt"),
		"WARREN_OS_RELEASE="+filepath.Join(etc, "os-release"))
}

// printConfig runs build-debian-python --print-config against a fake /etc.
func printConfig(t *testing.T, files map[string]string, args ...string) (map[string]string, error) {
	t.Helper()
	return printConfigOf(t, "build-debian-python", files, args...)
}

func printConfigOf(t *testing.T, script string, files map[string]string, args ...string) (map[string]string, error) {
	t.Helper()
	cmd := exec.Command("bash", append([]string{script, "--print-config"}, args...)...)
	cmd.Env = fakeEtc(t, files)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, &exec.ExitError{Stderr: out}
	}
	return parseKV(string(out)), nil
}

func parseKV(s string) map[string]string {
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		k, v, _ := strings.Cut(line, "=")
		got[k] = v
	}
	return got
}

const osRelease = `PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"
VERSION_ID="12"
VERSION_CODENAME=bookworm
ID=debian
`

// TestDebianPythonMirror: the mirror comes from apt's own sources, deb822
// or one-line, whichever names this machine's suite.
func TestDebianPythonMirror(t *testing.T) {
	tests := []struct {
		name        string
		files       map[string]string
		args        []string
		mirror, key string
		suite       string
	}{
		{
			name: "deb822, security first, disabled and deb-src skipped",
			files: map[string]string{"apt/sources.list.d/debian.sources": `# a comment
Types: deb
URIs: http://security.example/debian-security
Suites: bookworm-security
Components: main

Types: deb
URIs: http://disabled.example/debian
Suites: bookworm
Enabled: no

Types: deb-src
URIs: http://src.example/debian
Suites: bookworm

Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian http://second.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/example.gpg
`},
			mirror: "http://mirror.example/debian", key: "/usr/share/keyrings/example.gpg", suite: "bookworm",
		},
		{
			name: "deb822 with an inline key",
			files: map[string]string{"apt/sources.list.d/x.sources": `Types: deb
URIs: https://inline.example/debian
Suites: bookworm
Signed-By:
 -----BEGIN PGP PUBLIC KEY BLOCK-----
 .
 -----END PGP PUBLIC KEY BLOCK-----
`},
			mirror: "https://inline.example/debian", key: "/usr/share/keyrings/debian-archive-keyring.gpg", suite: "bookworm",
		},
		{
			name: "one-line sources.list with options",
			files: map[string]string{"apt/sources.list": `# deb http://commented.example/debian bookworm main
deb http://security.example/debian-security bookworm-security main
deb [arch=amd64 signed-by=/etc/apt/keyrings/k.gpg] http://line.example/debian bookworm main contrib
`},
			mirror: "http://line.example/debian", key: "/etc/apt/keyrings/k.gpg", suite: "bookworm",
		},
		{
			name:   "suite given",
			files:  map[string]string{"apt/sources.list": "deb http://line.example/debian trixie main\n"},
			args:   []string{"--suite", "trixie"},
			mirror: "http://line.example/debian", key: "/usr/share/keyrings/debian-archive-keyring.gpg", suite: "trixie",
		},
		{
			name:   "mirror given",
			args:   []string{"--mirror", "http://given.example/debian"},
			mirror: "http://given.example/debian", key: "/usr/share/keyrings/debian-archive-keyring.gpg", suite: "bookworm",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			files := map[string]string{"os-release": osRelease}
			for k, v := range tt.files {
				files[k] = v
			}
			got, err := printConfig(t, files, tt.args...)
			if err != nil {
				t.Fatalf("--print-config: %s", err.(*exec.ExitError).Stderr)
			}
			if got["mirror"] != tt.mirror || got["keyring"] != tt.key || got["suite"] != tt.suite || got["version"] != "12" {
				t.Fatalf("got %v, want mirror=%s keyring=%s suite=%s version=12", got, tt.mirror, tt.key, tt.suite)
			}
		})
	}

	t.Run("no source for the suite", func(t *testing.T) {
		_, err := printConfig(t, map[string]string{
			"os-release":       osRelease,
			"apt/sources.list": "deb http://line.example/debian trixie main\n",
		})
		if err == nil || !strings.Contains(string(err.(*exec.ExitError).Stderr), "no deb source for suite bookworm") {
			t.Fatalf("got %v, want a clear error", err)
		}
	})
}

// TestDebianImageVariants: build-debian-python is the python variant of
// build-debian-image; gcc is the other.
func TestDebianImageVariants(t *testing.T) {
	files := map[string]string{"os-release": osRelease, "apt/sources.list": "deb http://line.example/debian bookworm main\n"}
	for _, tt := range []struct {
		script         string
		args           []string
		name, packages string
	}{
		{"build-debian-python", nil, "debian-python", "python3,ca-certificates"},
		{"build-debian-image", nil, "debian-python", "python3,ca-certificates"},
		{"build-debian-image", []string{"--variant", "python"}, "debian-python", "python3,ca-certificates"},
		{"build-debian-image", []string{"--variant", "gcc"}, "debian-gcc", "gcc,g++,libc6-dev"},
	} {
		got, err := printConfigOf(t, tt.script, files, tt.args...)
		if err != nil {
			t.Fatalf("%s %v: %s", tt.script, tt.args, err.(*exec.ExitError).Stderr)
		}
		if got["name"] != tt.name || got["packages"] != tt.packages || got["version"] != "12" {
			t.Errorf("%s %v: got %v, want name=%s packages=%s version=12", tt.script, tt.args, got, tt.name, tt.packages)
		}
	}
	if _, err := printConfigOf(t, "build-debian-image", files, "--variant", "rust"); err == nil ||
		!strings.Contains(string(err.(*exec.ExitError).Stderr), "unknown --variant rust") {
		t.Errorf("--variant rust: got %v, want a clear error", err)
	}
}

// TestRuntimeImageDirs: build-runtime-images and imagetest.DebianRootfs
// agree on where the cache keeps each image.
func TestRuntimeImageDirs(t *testing.T) {
	cache := t.TempDir()
	env := append(fakeEtc(t, map[string]string{"os-release": osRelease, "apt/sources.list": "deb http://line.example/debian bookworm main\n"}),
		"WARREN_IMAGE_CACHE="+cache)
	cmd := exec.Command("bash", "build-runtime-images", "--print-dirs")
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("build-runtime-images --print-dirs: %v: %s", err, out)
	}
	for _, kv := range env { // what the script saw, for DebianRootfsDir
		if k, v, _ := strings.Cut(kv, "="); k == "WARREN_OS_RELEASE" || k == "WARREN_IMAGE_CACHE" {
			t.Setenv(k, v)
		}
	}
	var want []string
	for _, v := range []string{"python", "gcc"} {
		dir, err := imagetest.DebianRootfsDir(v)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, v+" "+dir)
	}
	if got := strings.TrimSpace(string(out)); got != strings.Join(want, "\n") {
		t.Errorf("build-runtime-images --print-dirs:\n%s\nwant\n%s", got, strings.Join(want, "\n"))
	}
	if !strings.HasSuffix(want[1], filepath.Join(cache, "debian-gcc-12")) {
		t.Errorf("gcc image dir %s, want %s/debian-gcc-12", want[1], cache)
	}
}

// TestDebianImageRegister: --register publishes a built image as a base
// layer and an environment of the same ref, and keeps either when it is
// registered already. A fake CLI records the calls; no root needed.
func TestDebianImageRegister(t *testing.T) {
	state := t.TempDir()
	warren := filepath.Join(state, "warren")
	if err := os.WriteFile(warren, []byte(`#!/bin/sh
echo "$*" >> "$(dirname "$0")/calls"
case "$1 $2" in
"layer get") test -e "$(dirname "$0")/layer" ;;
"layer build") touch "$(dirname "$0")/layer" ;;
"env get") test -e "$(dirname "$0")/env" ;;
"env create") touch "$(dirname "$0")/env" ;;
esac
`), 0o755); err != nil {
		t.Fatal(err)
	}
	// A finished image, as far as the stamp goes; from another recipe, so
	// it is kept with a warning rather than rebuilt.
	out := filepath.Join(t.TempDir(), "rootfs")
	if err := os.MkdirAll(filepath.Join(out, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "etc/warren-image"), []byte("name=debian-gcc\nversion=12\nsuite=bookworm\nrecipe=old\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := append(fakeEtc(t, map[string]string{"os-release": osRelease, "apt/sources.list": "deb http://line.example/debian bookworm main\n"}),
		"WARREN="+warren)
	run := func(variant string) (string, error) {
		cmd := exec.Command("bash", "build-debian-image", "--variant", variant, "--register", out)
		cmd.Env = env
		b, err := cmd.CombinedOutput()
		return string(b), err
	}
	calls := func() string {
		b, _ := os.ReadFile(filepath.Join(state, "calls"))
		os.Remove(filepath.Join(state, "calls"))
		return string(b)
	}

	if b, err := run("gcc"); err != nil || !strings.Contains(b, "another recipe") {
		t.Fatalf("register: %v: %s", err, b)
	}
	want := "layer get debian-gcc@12\n" +
		"layer build --kind base --name debian-gcc --version 12 " + out + "\n" +
		"env get debian-gcc@12\n" +
		"env create debian-gcc@12 --base debian-gcc@12\n"
	if got := calls(); got != want {
		t.Errorf("first --register ran:\n%swant\n%s", got, want)
	}
	if b, err := run("gcc"); err != nil || strings.Count(b, "already registered") != 2 {
		t.Fatalf("register again: %v: %s", err, b)
	}
	if got, want := calls(), "layer get debian-gcc@12\nenv get debian-gcc@12\n"; got != want {
		t.Errorf("second --register ran:\n%swant\n%s", got, want)
	}
	if b, err := run("python"); err == nil || !strings.Contains(b, "is a debian-gcc image, not debian-python") {
		t.Errorf("python over a gcc image: %v: %s", err, b)
	}
}

// TestDebianImageBuild checks each image as built into the cache (a
// minute or two each and traffic to the mirror when the cache lacks it,
// so it is gated: WARREN_TEST_DEBOOTSTRAP=1), then that building again is
// a no-op. The images' tools run in a chroot whose /tmp is a private
// tmpfs, so the shared cache is never written.
func TestDebianImageBuild(t *testing.T) {
	if os.Getenv("WARREN_TEST_DEBOOTSTRAP") != "1" {
		t.Skip("set WARREN_TEST_DEBOOTSTRAP=1 to run debootstrap")
	}
	testutil.RequireRoot(t)
	testutil.RequireBinary(t, "debootstrap", "unshare")
	for _, tt := range []struct {
		variant, name string
		maxMiB        int64
		check         func(t *testing.T, root string)
	}{
		{"python", "debian-python", 200, func(t *testing.T, root string) {
			if got := inImage(t, root, "", "python3 -c 'import ssl, json; print(1)'"); got != "1" {
				t.Errorf("python3 in the image: got %q, want 1", got)
			}
		}},
		{"gcc", "debian-gcc", 400, func(t *testing.T, root string) {
			cpp := "#include <iostream>\nint main() { std::cout << \"hello, \" << 6 * 7 << std::endl; }\n"
			if got := inImage(t, root, cpp, "cat > /tmp/a.cpp && g++ -O2 -o /tmp/a /tmp/a.cpp && /tmp/a"); got != "hello, 42" {
				t.Errorf("C++ hello world: got %q", got)
			}
			c := "#include <stdio.h>\n#include <math.h>\nint main(void) { printf(\"%.0f\\n\", sqrt(1764.0)); return 0; }\n"
			if got := inImage(t, root, c, "cat > /tmp/a.c && gcc -O2 -o /tmp/a /tmp/a.c -lm && /tmp/a"); got != "42" {
				t.Errorf("C hello world: got %q", got)
			}
			if _, err := os.Lstat(filepath.Join(root, "usr/bin/python3")); err == nil {
				t.Error("python3 in the gcc image")
			}
		}},
	} {
		t.Run(tt.variant, func(t *testing.T) {
			root := imagetest.DebianRootfs(t, tt.variant)
			stamp, err := imagetest.ImageStamp(root)
			if err != nil || stamp["name"] != tt.name {
				t.Fatalf("/etc/warren-image: got %v, %v; want name=%s", stamp, err, tt.name)
			}
			t.Logf("%s: %v", root, stamp)
			tt.check(t, root)
			checkSlim(t, root, tt.maxMiB)

			start := time.Now()
			b, err := exec.Command("bash", "build-debian-image", "--variant", tt.variant, root).CombinedOutput()
			if err != nil || !strings.Contains(string(b), "already built") || time.Since(start) > 10*time.Second {
				t.Errorf("second build was not a no-op: %v: %s", err, b)
			}
		})
	}
}

// inImage runs script with sh in a chroot of root, in a private mount
// namespace whose /tmp is a fresh tmpfs, with stdin on stdin, and returns
// its trimmed stdout.
func inImage(t *testing.T, root, stdin, script string) string {
	t.Helper()
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
		`mount -t tmpfs -o mode=1777 tmpfs "$0/tmp" && exec chroot "$0" /bin/sh -c "$1"`, root, script)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"}
	cmd.Stdin = strings.NewReader(stdin)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("in the image: %s: %v\n%s", script, err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// checkSlim: the image is a layer's worth of files and nothing more (no
// device nodes, apt lists, docs but copyright, man pages or locales), its
// root is 0755, and it is under maxMiB.
func checkSlim(t *testing.T, root string, maxMiB int64) {
	t.Helper()
	if fi, err := os.Stat(root); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("image root: got %v, %v; want mode 0755", fi.Mode(), err)
	}
	if lists, _ := filepath.Glob(filepath.Join(root, "var/lib/apt/lists/*_Packages")); len(lists) != 0 {
		t.Errorf("apt lists left: %v", lists)
	}
	var size int64
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, _ := d.Info()
		rel, _ := filepath.Rel(root, p)
		switch {
		case fi.Mode()&(fs.ModeDevice|fs.ModeCharDevice) != 0:
			t.Errorf("device node in the image: %s", rel)
		case d.IsDir():
		case strings.HasPrefix(rel, "usr/share/doc/") && d.Name() != "copyright",
			strings.HasPrefix(rel, "usr/share/man/"),
			strings.HasPrefix(rel, "usr/share/locale/") && rel != "usr/share/locale/locale.alias":
			t.Errorf("not slim: %s", rel)
		}
		if fi.Mode().IsRegular() {
			size += fi.Size()
		}
		return nil
	})
	t.Logf("image: %d MiB", size>>20)
	if size > maxMiB<<20 {
		t.Errorf("image is %d MiB, want at most %d", size>>20, maxMiB)
	}
}
