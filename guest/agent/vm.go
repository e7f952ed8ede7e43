package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/warrenhq/warren/guest/boot"
	"github.com/warrenhq/warren/guest/proto"
	"github.com/warrenhq/warren/internal/errdefs"
)

// A vm sandbox is a whole machine booted from the user's disk image; when
// that image carries this binary as a service ("warren-guest vm", the
// unit below), the node's vm backend reaches it on the same virtio-serial
// port, with the same fw_cfg secret and protocol as a microVM's agent,
// for exec, files and ports. The machine is the sandbox: commands run in
// its own root and namespaces, as root with every capability (or as the
// user asked for), in a cgroup of their own under the service's (the
// unit delegates it), so that an exec's leftovers can be killed. Nothing
// of the microVM's containment applies: the wall is the machine.
//
// The agent waits for its port; a machine without one (the image booted
// elsewhere) ends the service quietly.

// VMUnit is the systemd unit a disk image carries the agent with, as
// scripts/vm-disk-add-agent installs it.
const VMUnit = `[Unit]
Description=warren guest agent (exec and files for the warren vm backend)
After=systemd-udevd.service systemd-modules-load.service

[Service]
ExecStart=/usr/local/sbin/warren-guest vm
Restart=on-failure
RestartSec=1
Delegate=yes
OOMScoreAdjust=-1000

[Install]
WantedBy=multi-user.target
`

func vmMain() {
	a := &agent{reaps: newReaps(), vm: true}
	if err := a.vmBoot(); err != nil {
		boot.Logf("%v", err)
		os.Exit(1)
	}
	go a.reaps.loop()
	a.serve() // never returns
}

func (a *agent) vmBoot() error {
	a.booted = time.Now().Add(-uptime())
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	selfExe, rootDir, shellPath = exe, "/", "/bin/sh"
	// The drivers, where udev has not loaded them yet.
	for _, mod := range []string{"virtio_console", "qemu_fw_cfg"} {
		exec.Command("modprobe", "-q", mod).Run()
	}
	if _, err := findPort(); err != nil {
		boot.Logf("no port %s: not a warren vm, nothing to serve", proto.PortName)
		os.Exit(0)
	}
	raw, err := a.readConfig()
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, &a.cfg); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if a.cfg.Secret == "" {
		return fmt.Errorf("config: no secret")
	}
	cg, err := ownCgroup()
	if err != nil {
		return err
	}
	sandboxCg = cg
	if a.ns, err = openNamespaces(os.Getpid()); err != nil {
		return err
	}
	a.started = true
	a.ready = uptime()
	return nil
}

// ownCgroup is the agent's cgroup (v2), which execs' cgroups go under.
func ownCgroup() (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			return filepath.Join(cgroupDir, p), nil
		}
	}
	return "", fmt.Errorf("not on cgroup v2 (/proc/self/cgroup: %q)", strings.TrimSpace(string(b)))
}

// startVM takes the sandbox's environment and working directory for its
// execs; the machine itself runs already.
func (a *agent) startVM(req proto.StartRequest) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.start = proto.StartRequest{Env: req.Env, Workdir: req.Workdir}
	return nil
}

// notInVM refuses what only a microVM's agent does.
func notInVM(what string) error {
	return errdefs.Invalid("%s: not in a vm (the machine is the sandbox)", what)
}
