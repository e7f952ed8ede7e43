// Package benchup starts the warren under measurement for the benchmark
// programs: `warren up` in this process, or a given binary's in a process
// of its own (an A/B of two builds).
package benchup

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/client"
	"github.com/warrenhq/warren/internal/daemon"
	"github.com/warrenhq/warren/internal/hostbin"
	"github.com/warrenhq/warren/internal/pki"
)

// Proc runs `bin up` on dataDir in a process of its own, serving no
// FnCall and publishing no runtime images, until ctx ends, and returns a
// client of it.
func Proc(ctx context.Context, bin, dataDir string) (*client.Client, error) {
	d, err := StartProc(ctx, bin, dataDir)
	if err != nil {
		return nil, err
	}
	return d.Client, nil
}

// Daemon is a `warren up` running in a process of its own.
type Daemon struct {
	Client *client.Client
	Cmd    *exec.Cmd
	// Addr is its API's URL; DataDir, its data directory.
	Addr, DataDir string
	exited        chan struct{}
}

// StartProc runs `bin up` on dataDir with args added, serving no FnCall and
// publishing no runtime images, until ctx ends or Stop, and waits until
// it answers. Its log goes to dataDir + ".log".
func StartProc(ctx context.Context, bin, dataDir string, args ...string) (*Daemon, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	logf, err := os.OpenFile(dataDir+".log", os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, bin, append([]string{"up", "--data-dir", dataDir, "--listen", addr, "--no-fn",
		"--image-cache", filepath.Join(dataDir, "no-images")}, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Cancel = func() error { return cmd.Process.Signal(unix.SIGTERM) }
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	d := &Daemon{Cmd: cmd, Addr: "http://" + addr, DataDir: dataDir, exited: make(chan struct{})}
	go func() { cmd.Wait(); logf.Close(); close(d.exited) }()
	deadline := time.Now().Add(time.Minute)
	for {
		tok, err := os.ReadFile(filepath.Join(dataDir, daemon.AdminTokenFile))
		if err == nil && len(strings.TrimSpace(string(tok))) > 0 {
			c := client.New(d.Addr, strings.TrimSpace(string(tok)))
			if _, err := c.GetImage(ctx, "busybox"); err == nil {
				d.Client = c
				return d, nil
			}
		}
		select {
		case <-d.exited:
			return nil, fmt.Errorf("%s up exited: %s", bin, logTail(dataDir+".log"))
		default:
		}
		if time.Now().After(deadline) {
			d.Stop()
			return nil, fmt.Errorf("%s up did not answer within a minute (log: %s.log)", bin, dataDir)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// logTail is the end of a log, for an error.
func logTail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// Stop ends the daemon (SIGTERM, then SIGKILL after a minute) and waits
// for it to exit.
func (d *Daemon) Stop() {
	d.Cmd.Process.Signal(unix.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(time.Minute):
		d.Cmd.Process.Kill()
		<-d.exited
	}
}

// Build compiles ./cmd/warren into dir/bin (run from the repository's root)
// and returns the binary, with warren's helpers (bin/) findable by it.
func Build(ctx context.Context, dir string) (string, error) {
	if err := FindHelpers(); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "bin", "warren")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/warren")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/warren: %v\n%s", err, out)
	}
	return bin, nil
}

// InProcess runs `warren up` in this process on dataDir until ctx ends
// and returns a client of it: over TLS with a certificate of its own CA
// when withTLS; with no FnCall and no runtime images when quiet.
func InProcess(ctx context.Context, dataDir string, withTLS, quiet bool) (*client.Client, error) {
	cfg := daemon.UpConfig{
		DataDir: dataDir,
		Listen:  "127.0.0.1:0",
		Log:     slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	if quiet {
		cfg.Fn.Disabled, cfg.ImageCache = true, filepath.Join(dataDir, "no-images")
	}
	var opts []client.Option
	if withTLS {
		ca := filepath.Join(dataDir, "pki")
		if err := pki.InitCA(ca); err != nil {
			return nil, err
		}
		crt, err := pki.Issue(ca, "127.0.0.1")
		if err != nil {
			return nil, err
		}
		cfg.TLS = daemon.TLSConfig{Cert: crt, Key: strings.TrimSuffix(crt, ".crt") + ".key"}
		opts = append(opts, client.WithCAFile(filepath.Join(ca, pki.CACert)))
	}
	return Run(ctx, cfg, opts...)
}

// Run runs daemon.Up(cfg) in this process until ctx ends (setting
// cfg.Ready) and returns a client of it with the admin token: over https
// when cfg.TLS has a certificate, with opts (a CA to trust).
func Run(ctx context.Context, cfg daemon.UpConfig, opts ...client.Option) (*client.Client, error) {
	if err := FindHelpers(); err != nil {
		return nil, err
	}
	ready := make(chan string, 1)
	done := make(chan error, 1)
	cfg.Ready = func(addr string) { ready <- addr }
	go func() { done <- daemon.Up(ctx, cfg) }()
	var addr string
	select {
	case addr = <-ready:
	case err := <-done:
		return nil, fmt.Errorf("warren up: %w", err)
	}
	tok, err := os.ReadFile(filepath.Join(cfg.DataDir, daemon.AdminTokenFile))
	if err != nil {
		return nil, err
	}
	scheme := "http://"
	if cfg.TLS.Cert != "" {
		scheme = "https://"
	}
	return client.New(scheme+addr, strings.TrimSpace(string(tok)), opts...), nil
}

// FindHelpers puts the repository's bin/ (scripts/setup builds warren's C
// helpers there) on PATH when the helpers are neither beside this
// executable (`go run` builds it elsewhere) nor on PATH already.
func FindHelpers() error {
	if p := hostbin.Find("warren-enter"); filepath.IsAbs(p) {
		return nil
	}
	bin, err := filepath.Abs("bin")
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(bin, "warren-enter")); err != nil {
		return fmt.Errorf("warren-enter not found beside this program, on PATH or in ./bin: run scripts/setup (or scripts/build-helpers) from the repository's root")
	}
	return os.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
}

// TempDir makes a temporary directory for a benchmark's warren up,
// searchable by others (0711) as warren's own data directories are: a
// sandbox's root, an unprivileged id in its user namespace, passes the
// directories above its root filesystem (without that, warren runs
// sandboxes without user namespaces and the figures are not warren's).
func TempDir(prefix string) (string, error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", err
	}
	return dir, os.Chmod(dir, 0o711)
}
