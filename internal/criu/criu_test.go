package criu

import (
	"context"
	"os/exec"
	"strings"
	"testing"
)

// What Debian 12's criu 3.17.1 prints on a 6.18 kernel: the reason names
// the first error and the known cause.
func TestWhy(t *testing.T) {
	out := []byte("Error (criu/vdso.c:381): vdso: Unexpected rt vDSO area bounds\n" +
		"Error (criu/vdso.c:613): vdso: Failed to fill self vdso symtable\n" +
		"Error (criu/crtools.c:260): Could not initialize kernel features detection.\n")
	got := why(out)
	if !strings.HasPrefix(got, "Error (criu/vdso.c:381): vdso: Unexpected rt vDSO area bounds") || !strings.Contains(got, "criu#2532") {
		t.Errorf("why: %q", got)
	}
	if got := why([]byte("Looks good but something odd\n")); got != "Looks good but something odd" {
		t.Errorf("why without an Error line: %q", got)
	}
}

// Probe answers, whatever this host has, and says why when it fails.
func TestProbe(t *testing.T) {
	v, err := Probe(context.Background())
	if _, lerr := exec.LookPath("criu"); lerr != nil {
		if err == nil || !strings.Contains(err.Error(), "not installed") {
			t.Errorf("Probe without criu: %q, %v", v, err)
		}
		return
	}
	if v == "" {
		t.Errorf("Probe: no version (err %v)", err)
	}
	t.Logf("criu %s: %v", v, err)
}
