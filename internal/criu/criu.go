// Package criu says whether this host can checkpoint running processes
// with CRIU (checkpoint-restore), for snapshots that carry processes
// (`warren sandbox snapshot --with-processes`), and why not when it
// cannot.
//
// Measured on the machines warren is built on: Debian 12's criu 3.17.1
// cannot start on kernels 6.13 and later ("vdso: Unexpected rt vDSO area
// bounds": the vDSO/vvar layout changed; checkpoint-restore/criu#2532,
// fixed in CRIU 4.1, which Debian 12 does not package). And wherever CRIU
// runs, a container sandbox's processes are confined by Landlock, which
// CRIU neither saves nor restores: a restored process would run without
// its domain. So warren takes filesystem snapshots only, and says so.
package criu

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// Probe runs `criu check` once per process (the answer is cached) and
// returns CRIU's version when it works here, or an error saying why not.
func Probe(ctx context.Context) (string, error) {
	once.Do(func() { version, probeErr = probe(ctx) })
	return version, probeErr
}

var (
	once     sync.Once
	version  string
	probeErr error
)

func probe(ctx context.Context) (string, error) {
	bin, err := exec.LookPath("criu")
	if err != nil {
		return "", errors.New("criu is not installed (Debian package criu)")
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, bin, "--version").CombinedOutput()
	v := strings.TrimSpace(strings.TrimPrefix(firstLine(out), "Version:"))
	if v == "" {
		v = "unknown"
	}
	out, err = exec.CommandContext(ctx, bin, "check").CombinedOutput()
	if err != nil {
		return v, fmt.Errorf("criu %s: `criu check` fails here: %s", v, why(out))
	}
	return v, nil
}

// why is the first error `criu check` printed, with a hint where one is
// known.
func why(out []byte) string {
	var first string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); strings.HasPrefix(l, "Error") {
			first = l
			break
		}
	}
	if first == "" {
		first = strings.TrimSpace(firstLine(out))
	}
	if strings.Contains(string(out), "Unexpected rt vDSO area bounds") {
		first += " (kernels since 6.13 lay out the vDSO differently; CRIU 4.1 and later know it: checkpoint-restore/criu#2532)"
	}
	return first
}

func firstLine(b []byte) string {
	l, _, _ := strings.Cut(string(b), "\n")
	return l
}
