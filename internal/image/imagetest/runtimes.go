package imagetest

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/testutil"
)

// DebianImageCache is where scripts/build-runtime-images keeps the Debian
// runtime images, one root filesystem per <name>-<version> directory
// (debian-python-12, debian-gcc-12). WARREN_IMAGE_CACHE overrides it.
const DebianImageCache = "/var/cache/warren/images"

// debianNames maps a variant of scripts/build-debian-image to the name of
// the image it builds.
var debianNames = map[string]string{
	"python": "debian-python", // python3, ca-certificates
	"gcc":    "debian-gcc",    // gcc, g++, libc6-dev
}

// DebianRootfsDir returns where the cache keeps the Debian image variant
// ("python" or "gcc") for this host's Debian version, as
// scripts/build-runtime-images does, whether or not it is built.
func DebianRootfsDir(variant string) (string, error) {
	name, ok := debianNames[variant]
	if !ok {
		return "", fmt.Errorf("unknown Debian image variant %q (want python or gcc)", variant)
	}
	version, err := hostDebianVersion()
	if err != nil {
		return "", err
	}
	cache := os.Getenv("WARREN_IMAGE_CACHE")
	if cache == "" {
		cache = DebianImageCache
	}
	return filepath.Join(cache, name+"-"+version), nil
}

// hostDebianVersion is the image version build-debian-image uses: the
// host's VERSION_ID, else its codename.
func hostDebianVersion() (string, error) {
	p := os.Getenv("WARREN_OS_RELEASE")
	if p == "" {
		p = "/etc/os-release"
	}
	f, err := readKV(p)
	if err != nil {
		return "", err
	}
	for _, k := range []string{"VERSION_ID", "VERSION_CODENAME"} {
		if v := strings.Trim(f[k], `"'`); v != "" {
			return v, nil
		}
	}
	return "", fmt.Errorf("%s names no VERSION_ID or VERSION_CODENAME", p)
}

// DebianRootfs returns the root filesystem of the Debian runtime image
// variant: "python" (debian-python: python3) or "gcc" (debian-gcc: gcc,
// g++, libc6-dev), from the cache scripts/build-runtime-images fills (CI
// fills it before the tests). As root with debootstrap on PATH it runs
// scripts/build-debian-image --replace first: a no-op for a current image,
// 1-2 minutes and the Debian mirror for a missing or stale one. Otherwise
// a missing image skips t, or fails it when WARREN_TEST_STRICT=1. Every
// test and run shares the tree: treat it as read-only.
func DebianRootfs(t testing.TB, variant string) string {
	t.Helper()
	dir, err := DebianRootfsDir(variant)
	if err != nil {
		t.Fatal(err)
	}
	_, lookErr := exec.LookPath("debootstrap")
	if os.Geteuid() != 0 || lookErr != nil {
		if _, err := os.Stat(filepath.Join(dir, "etc/warren-image")); err != nil {
			testutil.Unavailable(t, "needs the %s image in %s: run scripts/build-runtime-images as root (needs debootstrap)", debianNames[variant], dir)
		}
		return dir
	}
	script, err := repoFile("scripts/build-debian-image")
	if err != nil {
		t.Fatal(err)
	}
	// build-debian-image takes a lock: test binaries running in parallel
	// build an image once.
	start := time.Now()
	out, err := exec.Command("bash", script, "--variant", variant, "--replace", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("%s --variant %s: %v\n%s", script, variant, err, out)
	}
	if !strings.Contains(string(out), "already built") {
		t.Logf("built %s in %s:\n%s", dir, time.Since(start).Round(time.Second), out)
	}
	return dir
}

// DebianLayer builds an EROFS layer (in t.TempDir()) of the Debian image
// variant, for backends that take layers directly; see DebianRootfs. It
// takes a few seconds: the gcc image is 300 MiB.
func DebianLayer(t testing.TB, variant string) backend.Layer {
	t.Helper()
	return FromDir(t, DebianRootfs(t, variant))
}

// ImageStamp reads the /etc/warren-image record build-debian-image leaves
// in a root filesystem: name, version, suite, packages, built, ...
func ImageStamp(rootfs string) (map[string]string, error) {
	return readKV(filepath.Join(rootfs, "etc/warren-image"))
}

// readKV reads KEY=VALUE lines.
func readKV(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	kv := map[string]string{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		if k, v, ok := strings.Cut(s.Text(), "="); ok && !strings.HasPrefix(k, "#") {
			kv[strings.TrimSpace(k)] = v
		}
	}
	return kv, s.Err()
}

// repoFile finds rel in the repository holding the working directory (a
// test runs in its package's directory).
func repoFile(rel string) (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, rel)
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			if _, err := os.Stat(p); err != nil {
				return "", fmt.Errorf("repository %s has no %s: %w", dir, rel, err)
			}
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}
