package scripts

import (
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestVMDiskPath: build-vm-disk names its image by the Debian version and
// its own hash, in its cache, and --print-path says so without building.
func TestVMDiskPath(t *testing.T) {
	cache := t.TempDir()
	env := append(fakeEtc(t, map[string]string{"os-release": osRelease, "apt/sources.list": "deb http://line.example/debian bookworm main\n"}),
		"WARREN_VM_CACHE="+cache)
	cmd := exec.Command("bash", "build-vm-disk", "--print-path")
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("build-vm-disk --print-path: %v: %s", err, out)
	}
	script, err := os.ReadFile("build-vm-disk")
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(cache, fmt.Sprintf("debian-12-%.16s.qcow2", fmt.Sprintf("%x", sha256.Sum256(script))))
	if got := strings.TrimSpace(string(out)); got != want {
		t.Errorf("--print-path: got %q, want %q", got, want)
	}
	if ents, _ := os.ReadDir(cache); len(ents) != 0 {
		t.Errorf("--print-path wrote to the cache: %v", ents)
	}
	// A cached image is printed as it is, by anyone.
	if err := os.WriteFile(want, []byte("qcow2"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd = exec.Command("bash", "build-vm-disk")
	cmd.Env = env
	if out, err := cmd.Output(); err != nil || strings.TrimSpace(string(out)) != want {
		t.Errorf("with the image cached: %q, %v; want %q", out, err, want)
	}
}
