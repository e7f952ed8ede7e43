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

	"github.com/warrenhq/warren/internal/testutil"
)

// printConfig runs build-debian-python --print-config against a fake /etc.
func printConfig(t *testing.T, files map[string]string, args ...string) (map[string]string, error) {
	t.Helper()
	etc := t.TempDir()
	for name, content := range files {
		p := filepath.Join(etc, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("bash", append([]string{"build-debian-python", "--print-config"}, args...)...)
	cmd.Env = append(os.Environ(),
		"WARREN_APT_ETC="+filepath.Join(etc, "apt"),
		"WARREN_OS_RELEASE="+filepath.Join(etc, "os-release"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, &exec.ExitError{Stderr: out}
	}
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		k, v, _ := strings.Cut(line, "=")
		got[k] = v
	}
	return got, nil
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

// TestDebianPythonBuild runs the real build (a minute or more and network
// traffic to the mirror), so it is gated: WARREN_TEST_DEBOOTSTRAP=1.
func TestDebianPythonBuild(t *testing.T) {
	if os.Getenv("WARREN_TEST_DEBOOTSTRAP") != "1" {
		t.Skip("set WARREN_TEST_DEBOOTSTRAP=1 to run debootstrap")
	}
	testutil.RequireRoot(t)
	testutil.RequireBinary(t, "debootstrap")
	out := filepath.Join(t.TempDir(), "rootfs")
	build := func() string {
		b, err := exec.Command("bash", "build-debian-python", out).CombinedOutput()
		if err != nil {
			t.Fatalf("build-debian-python: %v\n%s", err, b)
		}
		return string(b)
	}
	t.Log(build())

	b, err := exec.Command("chroot", out, "python3", "-c", "import ssl, json; print('ok')").CombinedOutput()
	if err != nil || strings.TrimSpace(string(b)) != "ok" {
		t.Fatalf("python3 in the image: %v: %s", err, b)
	}
	if fi, err := os.Stat(out); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("image root: got %v, %v; want mode 0755", fi.Mode(), err)
	}
	stamp, err := os.ReadFile(filepath.Join(out, "etc/warren-image"))
	if err != nil || !strings.Contains(string(stamp), "name=debian-python") {
		t.Fatalf("/etc/warren-image: %v %q", err, stamp)
	}
	if lists, _ := filepath.Glob(filepath.Join(out, "var/lib/apt/lists/*_Packages")); len(lists) != 0 {
		t.Errorf("apt lists left: %v", lists)
	}
	var size int64
	filepath.WalkDir(out, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, _ := d.Info()
		if fi.Mode()&(fs.ModeDevice|fs.ModeCharDevice) != 0 {
			t.Errorf("device node in the image: %s", p)
		}
		if fi.Mode().IsRegular() {
			size += fi.Size()
		}
		return nil
	})
	t.Logf("image: %d MiB", size>>20)
	if size > 200<<20 {
		t.Errorf("image is %d MiB, want a lean one", size>>20)
	}

	start := time.Now()
	if again := build(); !strings.Contains(again, "already built") || time.Since(start) > 10*time.Second {
		t.Errorf("second build was not a no-op: %s", again)
	}
}
