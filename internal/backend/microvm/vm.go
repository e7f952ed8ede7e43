package microvm

import (
	"context"
	"errors"
	"fmt"
	"image"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/guest/proto"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/qemu"
	"github.com/warrenhq/warren/internal/rootfs"
)

// The vm backend (Config.Kind KindVM) runs a whole machine: q35 booted
// by its firmware from a disk image the user imported (qcow2; the
// sandbox's one layer), through a copy-on-write overlay of its own, with
// a VGA display (VNC on a unix socket in the sandbox's directory, and
// QMP screenshots), a PS/2 keyboard and a USB tablet: Screen and Input,
// and pause and resume as for microVMs. Nothing of warren runs inside
// unless the disk image carries the guest agent as a service
// (guest/agent's "warren-guest vm", which scripts/vm-disk-add-agent
// installs): the machine gets the microVM's agent port and fw_cfg secret,
// and exec, files and ports go through that agent when it answers
// (vmAgent); without it they are not_supported.

// Kinds of machine (Config.Kind).
const (
	KindMicroVM = "microvm"
	KindVM      = "vm"
)

// Files of a vm sandbox.
const (
	baseFile    = "base.qcow2" // a hard link to the imported disk (or a copy)
	overlayFile = "disk.qcow2" // its copy-on-write overlay
	vncSock     = "vnc.sock"
)

// defaultVMMemory is a vm's memory when the spec sets none.
const defaultVMMemory = 1 << 30

// vmCapabilities are what the vm backend offers.
var vmCapabilities = backend.Capabilities{Isolated: true, Limits: true, Recover: true, Pause: true}

var _ backend.Displayer = (*MicroVM)(nil)

// prepareVM checks what the vm backend needs on the host.
func (m *MicroVM) prepareVM() error {
	if _, err := exec.LookPath(m.cfg.QEMU); err != nil {
		return errdefs.Unavailable("vm: no QEMU (%s): install qemu-system-x86", m.cfg.QEMU)
	}
	if _, err := exec.LookPath("qemu-img"); err != nil {
		return errdefs.Unavailable("vm: no qemu-img: install qemu-utils")
	}
	return nil
}

// createVM makes a vm sandbox's disk: the imported image kept alive by a
// hard link in the sandbox's directory, and an overlay over it.
func (m *MicroVM) createVM(ctx context.Context, s *sandbox) error {
	if len(s.spec.Layers) != 1 {
		return errdefs.Invalid("sandbox %s: a vm boots one disk image, got %d layers", s.spec.ID, len(s.spec.Layers))
	}
	src := s.spec.Layers[0].Path
	if err := qemu.CheckDiskImage(ctx, src); err != nil {
		if errors.Is(err, qemu.ErrBadDisk) {
			return errdefs.Invalid("sandbox %s: image: %v", s.spec.ID, err)
		}
		return fmt.Errorf("sandbox %s: image: %w", s.spec.ID, err)
	}
	base := filepath.Join(s.dir, baseFile)
	if err := os.Link(src, base); err != nil {
		if _, err := copyFile(src, base); err != nil {
			return err
		}
	}
	out, err := exec.CommandContext(ctx, "qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", base,
		filepath.Join(s.dir, overlayFile)).CombinedOutput()
	if err != nil {
		return fmt.Errorf("qemu-img create: %v: %s", err, out)
	}
	return nil
}

// vmMachine is a vm sandbox's machine.
func (m *MicroVM) vmMachine(s *sandbox) qemu.Machine {
	mem := s.spec.Resources.Memory
	if mem == 0 {
		mem = defaultVMMemory
	}
	mach := qemu.Machine{
		Binary:    m.cfg.QEMU,
		Type:      "q35",
		Accel:     m.accel,
		CPUs:      cpusOf(s.spec.Resources.CPU),
		MemoryMiB: int(mem >> 20),
		Disks:     []qemu.Disk{{Path: filepath.Join(s.dir, overlayFile), Format: "qcow2", Boot: true, Discard: true}},
		Display:   &qemu.Display{VNC: filepath.Join(s.dir, vncSock), Pointer: qemu.USBTablet},
		RNG:       true,
		Balloon:   true,
		QMP:       filepath.Join(s.dir, qmpSock),
		// A vm is one tenant's machine too (Spec.MemoryMerge), else
		// off: QEMU's default is on.
		MemoryMerge: s.spec.MemoryMerge,
	}
	if m.accel == qemu.TCG {
		mach.TCGCacheMiB = 256
	}
	m.agentDevices(s, &mach)
	return mach
}

// defaultVMAgentWait is Config.VMAgentWait's default; vmAgentProbe, how
// long a vm's agent is asked after that, when it has not answered yet.
const (
	defaultVMAgentWait = 3 * time.Minute
	vmAgentProbe       = 5 * time.Second
)

// vmAgent checks that vm s has a guest agent, waiting for it while the
// machine boots; the first time it answers, it gets the sandbox's
// environment and working directory for its execs. not_supported when
// none answers.
func (m *MicroVM) vmAgent(ctx context.Context, s *sandbox, verb string) error {
	if s.agent.Load() {
		return nil
	}
	s.mu.Lock()
	p := s.proc
	s.mu.Unlock()
	if p == nil {
		return errdefs.New(errdefs.ErrConflict, "sandbox_not_running", "%s in %s: sandbox is not running", verb, s.spec.ID)
	}
	wait := max(time.Until(p.started.Add(m.cfg.VMAgentWait)), vmAgentProbe)
	actx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if _, err := s.guest.client(actx); err != nil {
		if ctx.Err() != nil || errors.Is(err, errGone) {
			return fmt.Errorf("%s in %s: %w", verb, s.spec.ID, err)
		}
		return errdefs.New(errdefs.ErrInvalid, api.CodeNotSupported,
			"%s in %s: no warren guest agent answered in the vm (up %s): exec, files and ports need one in its disk image (scripts/vm-disk-add-agent installs it)",
			verb, s.spec.ID, time.Since(p.started).Round(time.Second))
	}
	start := proto.StartRequest{Hostname: s.spec.ID, Env: s.spec.Env, Workdir: s.spec.Workdir}
	if err := s.guest.call(ctx, "POST", "/v1/start", nil, start, nil); err != nil {
		return fmt.Errorf("%s in %s: %w", verb, s.spec.ID, err)
	}
	s.agent.Store(true)
	return nil
}

// waitQMP waits until QEMU of s answers on its QMP socket.
func (m *MicroVM) waitQMP(ctx context.Context, s *sandbox) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	q, err := qemu.DialQMP(ctx, filepath.Join(s.dir, qmpSock))
	if err != nil {
		return err
	}
	return q.Close()
}

// powerdown asks a vm's guest to shut down (ACPI), as its power button.
func (m *MicroVM) powerdown(ctx context.Context, s *sandbox) error {
	q, err := qemu.DialQMP(ctx, filepath.Join(s.dir, qmpSock))
	if err != nil {
		return err
	}
	defer q.Close()
	return q.Execute(ctx, "system_powerdown", nil, nil)
}

// display runs f on a QMP session of sandbox id's running machine.
func (m *MicroVM) display(ctx context.Context, id, verb string, f func(*qemu.QMP) error) error {
	if m.kind != KindVM {
		return errdefs.New(errdefs.ErrInvalid, api.CodeNotSupported, "%s of %s: microVMs have no display (use --backend vm)", verb, id)
	}
	s, err := m.running(id, verb)
	if err != nil {
		return err
	}
	q, err := qemu.DialQMP(ctx, filepath.Join(s.dir, qmpSock))
	if err != nil {
		return fmt.Errorf("%s of %s: %w", verb, id, err)
	}
	defer q.Close()
	if err := f(q); err != nil {
		if errors.Is(err, qemu.ErrBadInput) {
			return errdefs.Invalid("%s of %s: %v", verb, id, err)
		}
		return fmt.Errorf("%s of %s: %w", verb, id, err)
	}
	return nil
}

// Screen implements backend.Displayer: a QMP screendump.
func (m *MicroVM) Screen(ctx context.Context, id string) (image.Image, error) {
	var img image.Image
	err := m.display(ctx, id, "screen", func(q *qemu.QMP) error {
		var err error
		img, err = q.Screendump(ctx)
		return err
	})
	return img, err
}

// Input implements backend.Displayer. Every event is checked before the
// first is sent.
func (m *MicroVM) Input(ctx context.Context, id string, events []backend.InputEvent) error {
	for i, e := range events {
		switch e.Type {
		case "text", "key", "move", "click":
		default:
			return errdefs.Invalid("input event %d: type %q (want text, key, move or click)", i, e.Type)
		}
		if e.X < 0 || e.Y < 0 {
			return errdefs.Invalid("input event %d: point %d,%d", i, e.X, e.Y)
		}
	}
	return m.display(ctx, id, "input", func(q *qemu.QMP) error {
		for _, e := range events {
			var err error
			switch e.Type {
			case "text":
				err = q.TypeText(ctx, e.Text)
			case "key":
				err = q.SendKeys(ctx, e.Key)
			case "move":
				err = q.PointerMove(ctx, e.X, e.Y)
			case "click":
				err = q.Click(ctx, e.X, e.Y, e.Button)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
}

// copyFile copies src to dst (a clone where the filesystem can).
func copyFile(src, dst string) (bool, error) {
	if filepath.Base(src) == filepath.Base(dst) {
		return rootfs.CopyFile(src, dst)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dst), ".copy-")
	if err != nil {
		return false, err
	}
	defer os.RemoveAll(tmp)
	mid := filepath.Join(tmp, filepath.Base(src))
	reflink, err := rootfs.CopyFile(src, mid)
	if err != nil {
		return false, err
	}
	return reflink, os.Rename(mid, dst)
}
