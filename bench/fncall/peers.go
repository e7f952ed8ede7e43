package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// peer runs one call of a job and returns its stdout; the driver checks
// it.
type peer struct {
	name  string
	about string
	skip  string            // why this peer cannot run here ("" if it can)
	not   map[string]string // job -> why this peer does not run it
	call  func(ctx context.Context, j *job) (string, error)
	cpu   func() time.Duration // CPU of processes outside this one's cgroup (the daemon)
	close func()

	pythonArgs []string // warren: its python3 runtime's interpreter flags
}

func (p *peer) runs(j *job) bool {
	return p.not[j.name] == "" && (!j.warrenOnly || strings.HasPrefix(p.name, "warren"))
}

func newPeer(ctx context.Context, name string, cfg config, dir string, jobs []*job, g *cpuGroup) (*peer, error) {
	switch name {
	case "bare":
		return &peer{name: name, about: "the program chrooted into the job's root (Go SysProcAttr.Chroot), cwd /box; no /proc or /dev",
			call: bareCall}, nil
	case "bwrap":
		return newBwrap(ctx)
	case "runc":
		return newRunc(ctx, dir, jobs)
	case "podman":
		return newPodman(ctx, g)
	case "warren":
		return newWarren(ctx, cfg, jobs, g)
	case "warren-b":
		if cfg.bURL == "" {
			return &peer{name: name, skip: "no -b-url"}, nil
		}
		b := cfg
		b.url, b.tokenFile, b.warrenPID, b.warrenCgroup = cfg.bURL, cfg.bToken, 0, ""
		p, err := newWarren(ctx, b, jobs, g)
		if p != nil {
			p.name = name
		}
		return p, err
	}
	return nil, fmt.Errorf("unknown peer (bare, bwrap, runc, podman, warren, warren-b)")
}

// runCmd runs cmd and returns its stdout, or an error with its stderr's
// tail.
func runCmd(cmd *exec.Cmd) (string, error) {
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%v: %s", err, tail(errb.Bytes()))
	}
	return out.String(), nil
}

func bareCall(ctx context.Context, j *job) (string, error) {
	cmd := exec.CommandContext(ctx, j.argv[0], j.argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: j.root}
	cmd.Dir, cmd.Env = "/box", env
	return runCmd(cmd)
}

func version(name string, args ...string) string {
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		return "?"
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return line
}

func newBwrap(ctx context.Context) (*peer, error) {
	path, err := exec.LookPath("bwrap")
	if err != nil {
		return &peer{name: "bwrap", skip: "no bwrap on PATH (apt-get install -y bubblewrap)"}, nil
	}
	return &peer{name: "bwrap",
		about: fmt.Sprintf("%s: bwrap --unshare-all --die-with-parent --ro-bind ROOT / --proc /proc --dev /dev --tmpfs /tmp --chdir /box -- PROGRAM",
			version(path, "--version")),
		call: func(ctx context.Context, j *job) (string, error) {
			args := append([]string{"--unshare-all", "--die-with-parent", "--ro-bind", j.root, "/",
				"--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--chdir", "/box", "--"}, j.argv...)
			cmd := exec.CommandContext(ctx, path, args...)
			cmd.Env = env
			return runCmd(cmd)
		}}, nil
}

// newRunc prepares one OCI bundle per job from runc's default spec (`runc
// spec`: fresh pid, network, ipc, uts and mount namespaces, the default
// capabilities, masked and read-only paths, no seccomp), with the job's
// root read-only and a tmpfs /tmp. Every call is `runc run` of a new
// container id, which runc deletes when the program exits.
func newRunc(ctx context.Context, dir string, jobs []*job) (*peer, error) {
	path, err := exec.LookPath("runc")
	if err != nil {
		return &peer{name: "runc", skip: "no runc on PATH"}, nil
	}
	state := filepath.Join(dir, "runc-state")
	bundles := map[string]string{}
	for _, j := range jobs {
		b := filepath.Join(dir, "runc-bundle-"+j.name)
		if err := os.MkdirAll(b, 0o755); err != nil {
			return nil, err
		}
		if out, err := exec.CommandContext(ctx, path, "spec", "--bundle", b).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("runc spec: %v: %s", err, out)
		}
		if err := writeRuncSpec(b, j); err != nil {
			return nil, err
		}
		bundles[j.name] = b
	}
	var seq atomic.Int64
	pid := os.Getpid()
	return &peer{name: "runc",
		about: fmt.Sprintf("%s: runc run --bundle B ID per call; runc's default spec, root read-only, tmpfs /tmp, cwd /box",
			version(path, "--version")),
		call: func(ctx context.Context, j *job) (string, error) {
			id := fmt.Sprintf("wbf-%d-%d", pid, seq.Add(1))
			cmd := exec.CommandContext(ctx, path, "--root", state, "run", "--bundle", bundles[j.name], id)
			return runCmd(cmd)
		},
		close: func() {
			// Anything a killed call left behind.
			out, _ := exec.Command(path, "--root", state, "list", "-q").Output()
			for _, id := range strings.Fields(string(out)) {
				exec.Command(path, "--root", state, "delete", "--force", id).Run()
			}
		}}, nil
}

func writeRuncSpec(bundle string, j *job) error {
	b, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return err
	}
	var spec map[string]any
	if err := json.Unmarshal(b, &spec); err != nil {
		return err
	}
	spec["root"] = map[string]any{"path": j.root, "readonly": true}
	proc := spec["process"].(map[string]any)
	proc["terminal"] = false
	proc["args"] = j.argv
	proc["cwd"] = "/box"
	proc["env"] = env
	spec["mounts"] = append(spec["mounts"].([]any), map[string]any{
		"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
		"options": []string{"nosuid", "nodev", "mode=1777"}})
	out, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(bundle, "config.json"), out, 0o644)
}

// newPodman checks that podman runs here at all (`podman info`), and says
// exactly why not when it does not.
func newPodman(ctx context.Context, g *cpuGroup) (*peer, error) {
	path, err := exec.LookPath("podman")
	if err != nil {
		return &peer{name: "podman", skip: "no podman on PATH (apt-get install -y podman)"}, nil
	}
	info, err := exec.CommandContext(ctx, path, "info", "--format",
		"{{.Host.OCIRuntime.Name}} {{.Host.OCIRuntime.Version}}; cgroups {{.Host.CgroupsVersion}} {{.Host.CgroupManager}}; events {{.Host.EventLogger}}; storage {{.Store.GraphDriverName}}").CombinedOutput()
	if err != nil {
		return &peer{name: "podman", skip: fmt.Sprintf("`podman info` failed: %v: %s", err, tail(info))}, nil
	}
	rt, _, _ := strings.Cut(strings.TrimSpace(string(info)), "\n")
	label := fmt.Sprintf("wbench-fncall=%d", os.Getpid())
	return &peer{name: "podman",
		about: fmt.Sprintf("%s (%s): podman run --rm --network none --ulimit nofile=1024:1024 --ulimit nproc=16384:16384 --workdir /box --cgroup-parent BENCHCG/podman --rootfs ROOT PROGRAM per call",
			version(path, "--version"), rt),
		call: func(ctx context.Context, j *job) (string, error) {
			// podman (as root) asks for RLIMIT_NOFILE and RLIMIT_NPROC of
			// 1048576 by default: above this machine's hard limits, which
			// runc cannot raise without CAP_SYS_RESOURCE (not granted
			// here), and --ulimit host fails the same way. NOFILE as in
			// runc's default spec; NPROC below conmon's limit here (32768).
			args := []string{"run", "--rm", "--network", "none", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=16384:16384",
				"--workdir", "/box", "--cgroup-parent", g.rel + "/podman", "--label", label}
			for _, e := range env {
				args = append(args, "--env", e)
			}
			// --rootfs is a switch: ROOT takes the image's place, last
			// before the program.
			args = append(append(args, "--rootfs", j.root), j.argv...)
			return runCmd(exec.CommandContext(ctx, path, args...))
		},
		close: func() {
			// Containers of calls killed by an interrupt.
			out, _ := exec.Command(path, "ps", "-aq", "--filter", "label="+label).Output()
			if ids := strings.Fields(string(out)); len(ids) > 0 {
				exec.Command(path, append([]string{"rm", "-f"}, ids...)...).Run()
			}
		}}, nil
}
