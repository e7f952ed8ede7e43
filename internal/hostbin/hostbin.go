// Package hostbin finds the helper programs warren ships beside its own
// binary (warren-fninit, warren-enter: small static C programs built by
// scripts/build-helpers).
package hostbin

import (
	"os"
	"os/exec"
	"path/filepath"
)

// Find returns the path of helper name: beside this executable, else the
// first in $PATH, else name itself (for the caller's "not found" error).
func Find(name string) string {
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), name)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	return name
}
