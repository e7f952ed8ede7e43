package microvm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/guest/proto"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/qemu"
	"github.com/warrenhq/warren/internal/qos"
)

// Files in a sandbox's directory.
const (
	specFile    = "spec.json"
	secretFile  = "secret"
	configFile  = "config.json" // fw_cfg: proto.Config
	upperFile   = "upper.img"
	agentSock   = "agent.sock"
	qmpSock     = "qmp.sock"
	pidFile     = "qemu.pid" // "PID STARTTIME"
	stoppedFile = "stopped"  // "EXITCODE REASON"
	consoleFile = "console.log"
)

// maxSocketPath is the longest path a unix socket can be bound at
// (sun_path less its terminating NUL).
const maxSocketPath = 107

// Guest sizing: the sandbox's memory limit is its processes'; the guest
// gets that plus room for its kernel and agent, and QEMU's own use is
// allowed on top in the host cgroup.
const (
	defaultMemory = 512 << 20
	guestOverhead = 128 << 20
	qemuOverhead  = 256 << 20 // TCG's translation cache among it
	tcgCacheMiB   = 64
)

// sandbox is one microVM. mu serialises its lifecycle calls.
type sandbox struct {
	mu    sync.Mutex
	spec  backend.Spec
	dir   string
	guest *guest
	proc  *process // nil unless QEMU runs (or ran, until Wait saw it end)
	// agent: a vm's guest agent has answered (vm.go: its disk carries one).
	agent atomic.Bool
}

func (m *MicroVM) sandboxDir(id string) string { return filepath.Join(m.dir, id) }

func (m *MicroVM) get(id string) (*sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.sandboxes[id]
	if s == nil {
		return nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	return s, nil
}

func validateSpec(spec backend.Spec) error {
	if err := backend.ValidID(spec.ID); err != nil {
		return err
	}
	if len(spec.Layers) == 0 {
		return errdefs.Invalid("sandbox %s: no layers", spec.ID)
	}
	r := spec.Resources
	if r.CPU < 0 || r.Memory < 0 || r.PIDs < 0 || r.Disk < 0 || r.DiskInodes < 0 {
		return errdefs.Invalid("sandbox %s: negative resources %+v", spec.ID, r)
	}
	if r.Memory > 0 && r.Memory < 16<<20 {
		return errdefs.Invalid("sandbox %s: memory %d is below the microvm minimum of 16 MiB", spec.ID, r.Memory)
	}
	if spec.Workdir != "" && !strings.HasPrefix(spec.Workdir, "/") {
		return errdefs.Invalid("sandbox %s: workdir %q is not absolute", spec.ID, spec.Workdir)
	}
	return nil
}

// Create implements backend.Backend: the sandbox's directory, its secret
// and its writable disk image.
func (m *MicroVM) Create(ctx context.Context, spec backend.Spec) (err error) {
	if err := validateSpec(spec); err != nil {
		return err
	}
	if m.initErr != nil {
		return m.initErr
	}
	id := spec.ID
	s := &sandbox{spec: spec, dir: m.sandboxDir(id)}
	if sock := filepath.Join(s.dir, agentSock); len(sock) > maxSocketPath {
		return errdefs.Unavailable("create sandbox %s: its agent socket %s would be longer than a unix socket path can be (%d bytes): give the node a shorter state directory", id, sock, maxSocketPath)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m.mu.Lock()
	if m.sandboxes[id] != nil {
		m.mu.Unlock()
		return errdefs.New(errdefs.ErrConflict, "sandbox_exists", "sandbox %s already exists", id)
	}
	m.sandboxes[id] = s
	m.mu.Unlock()
	made := false
	defer func() {
		if err != nil {
			if made {
				os.RemoveAll(s.dir)
			}
			m.mu.Lock()
			delete(m.sandboxes, id)
			m.mu.Unlock()
		}
	}()
	if err := os.Mkdir(s.dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return errdefs.New(errdefs.ErrConflict, "sandbox_exists", "sandbox %s already exists on disk", id)
		}
		return fmt.Errorf("create sandbox %s: %w", id, err)
	}
	made = true
	for _, l := range spec.Layers {
		if _, err := os.Stat(l.Path); err != nil {
			return errdefs.Invalid("sandbox %s: layer %s: %v", id, l.Digest, err)
		}
		if m.kind == KindMicroVM && qemu.IsDiskImage(l.Path) {
			return errdefs.Invalid("sandbox %s: layer %s is a disk image: it boots with --backend vm", id, l.Digest)
		}
		if m.dax {
			if err := m.pmemFile(ctx, l); err != nil {
				return fmt.Errorf("create sandbox %s: %w", id, err)
			}
		}
	}
	if m.kind == KindVM {
		if err := m.createVM(ctx, s); err != nil {
			return err
		}
	} else if err := makeDisk(ctx, filepath.Join(s.dir, upperFile), spec.Resources.Disk, spec.Resources.DiskInodes); err != nil {
		return fmt.Errorf("create sandbox %s: %w", id, err)
	}
	secret := proto.NewSecret()
	if err := os.WriteFile(filepath.Join(s.dir, secretFile), []byte(secret), 0o600); err != nil {
		return err
	}
	cfg := proto.Config{Secret: secret}
	if m.kind == KindMicroVM {
		cfg.Upper, cfg.DAX = "warren-upper", m.dax
		for i := range spec.Layers {
			cfg.Layers = append(cfg.Layers, fmt.Sprintf("warren-l%d", i))
		}
	}
	if err := writeJSON(filepath.Join(s.dir, configFile), cfg); err != nil {
		return err
	}
	// The spec last: a directory with it is a sandbox Recover can adopt.
	if err := writeJSON(filepath.Join(s.dir, specFile), spec); err != nil {
		return err
	}
	s.guest = m.newGuest(s, secret)
	return nil
}

func (m *MicroVM) newGuest(s *sandbox, secret string) *guest {
	return &guest{sock: filepath.Join(s.dir, agentSock), secret: secret, alive: func() bool {
		p := s.proc
		return p != nil && p.running()
	}}
}

func writeJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// cpusOf is the vCPUs for a CPU limit: at least one, at most eight.
func cpusOf(cpu float64) int { return max(1, min(int(math.Ceil(cpu)), 8)) }

// machine is the QEMU machine of sandbox s.
func (m *MicroVM) machine(s *sandbox) qemu.Machine {
	if m.kind == KindVM {
		return m.vmMachine(s)
	}
	r := s.spec.Resources
	cpus := cpusOf(r.CPU)
	mem := r.Memory
	if mem == 0 {
		mem = defaultMemory
	}
	mach := qemu.Machine{
		Binary:    m.cfg.QEMU,
		Type:      "pc",
		Accel:     m.accel,
		CPUs:      cpus,
		MemoryMiB: int((mem + guestOverhead + (1<<20 - 1)) >> 20),
		Kernel:    m.kernel,
		Initrd:    m.initrd,
		Cmdline: []string{"console=ttyS0", "quiet", "loglevel=3", "panic=-1", "oops=panic", "rdinit=/init",
			// No bounce buffer: these virtio devices do not use the DMA API
			// (no VIRTIO_F_ACCESS_PLATFORM), and with virtio-pmem's hotplug
			// range the kernel would otherwise reserve (and touch) 64 MiB.
			"swiotlb=noforce"},
		RNG:         true,
		QMP:         filepath.Join(s.dir, qmpSock),
		MemoryMerge: s.spec.MemoryMerge, // else off: QEMU's default is on
	}
	if m.accel == qemu.KVM {
		mach.Type = "microvm" // under TCG it hangs calibrating the TSC
	} else {
		mach.BIOS, mach.TCGCacheMiB = m.bios, tcgCacheMiB
	}
	for i, l := range s.spec.Layers {
		if m.dax {
			p := m.pmemPath(l)
			mach.PMem = append(mach.PMem, qemu.PMem{Path: p, Size: fileSize(p)})
			continue
		}
		mach.Disks = append(mach.Disks, qemu.Disk{Path: l.Path, ReadOnly: true, Serial: fmt.Sprintf("warren-l%d", i)})
	}
	mach.Disks = append(mach.Disks, qemu.Disk{Path: filepath.Join(s.dir, upperFile), Serial: "warren-upper", Discard: true})
	m.agentDevices(s, &mach)
	mach.Balloon = true
	return mach
}

// agentDevices gives mach the guest agent's port and its fw_cfg config.
func (m *MicroVM) agentDevices(s *sandbox, mach *qemu.Machine) {
	mach.Ports = []qemu.Port{{Name: proto.PortName, Socket: filepath.Join(s.dir, agentSock)}}
	mach.FwCfg = []qemu.FwCfg{{Name: proto.ConfigName, File: filepath.Join(s.dir, configFile)}}
}

func fileSize(p string) int64 {
	fi, err := os.Stat(p)
	if err != nil {
		return 0
	}
	return fi.Size()
}

func alignUp(n, a int64) int64 { return (n + a - 1) / a * a }

// Start implements backend.Backend: QEMU boots the guest, and Start
// returns once the guest agent has started the sandbox's processes.
func (m *MicroVM) Start(ctx context.Context, id string) error {
	s, err := m.get(id)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil || exists(filepath.Join(s.dir, stoppedFile)) {
		return errdefs.New(errdefs.ErrConflict, "sandbox_not_created", "start %s: sandbox is not in the created state", id)
	}
	if err := m.boot(ctx, s, false); err != nil {
		return fmt.Errorf("start %s: %w", id, err)
	}
	return nil
}

// boot starts QEMU for s (incoming: restore from a saved state instead)
// and starts the sandbox in the guest. On error QEMU is gone.
func (m *MicroVM) boot(ctx context.Context, s *sandbox, incoming bool) error {
	mach := m.machine(s)
	mach.Incoming = incoming
	argv, err := mach.Args()
	if err != nil {
		return err
	}
	os.Remove(filepath.Join(s.dir, agentSock))
	os.Remove(filepath.Join(s.dir, qmpSock))
	p, err := m.startQEMU(s, argv, incoming)
	if err != nil {
		return err
	}
	s.proc = p
	bctx, cancel := context.WithTimeout(ctx, bootTimeout)
	defer cancel()
	req := proto.StartRequest{Hostname: s.spec.ID, Env: s.spec.Env, Workdir: s.spec.Workdir,
		Memory: s.spec.Resources.Memory, PIDs: s.spec.Resources.PIDs, DNS: s.spec.DNS}
	if incoming {
		return nil // the caller restores and resumes the machine
	}
	if m.kind == KindVM {
		// Nothing of warren inside: up once QEMU answers.
		if err := m.waitQMP(bctx, s); err != nil {
			why := m.failure(s, err)
			m.kill(s)
			return why
		}
		return nil
	}
	if err := s.guest.call(bctx, "POST", "/v1/start", nil, req, nil); err != nil {
		why := m.failure(s, err)
		m.kill(s)
		return why
	}
	return nil
}

// failure explains a boot that did not reach the guest agent: QEMU's own
// error, or the end of the guest's console.
func (m *MicroVM) failure(s *sandbox, err error) error {
	if s.proc != nil && !s.proc.running() && s.proc.err != "" {
		return fmt.Errorf("qemu: %s", s.proc.err)
	}
	b, _ := os.ReadFile(filepath.Join(s.dir, consoleFile))
	if len(b) > 2048 {
		b = b[len(b)-2048:]
	}
	if tail := strings.TrimSpace(string(b)); tail != "" {
		return fmt.Errorf("%w; console: %s", err, tail)
	}
	return err
}

// Wait implements backend.Backend.
func (m *MicroVM) Wait(ctx context.Context, id string) (backend.Status, error) {
	s, err := m.get(id)
	if err != nil {
		return backend.Status{}, err
	}
	for {
		s.mu.Lock()
		p := s.proc
		s.mu.Unlock()
		if p == nil {
			st, err := m.Inspect(ctx, id)
			if err != nil || st.State == backend.StateStopped {
				return st, err
			}
			// Created (or paused): wait for a start.
			select {
			case <-ctx.Done():
				return backend.Status{}, ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		select {
		case <-ctx.Done():
			return backend.Status{}, ctx.Err()
		case <-p.done:
		}
		s.mu.Lock()
		if s.proc == p {
			m.exited(s, p)
		}
		s.mu.Unlock()
		st, err := m.Inspect(ctx, id)
		if err != nil || st.State == backend.StateStopped {
			return st, err
		}
	}
}

// exited records that QEMU of s ended (s.mu held).
func (m *MicroVM) exited(s *sandbox, p *process) {
	if !exists(filepath.Join(s.dir, stoppedFile)) {
		code := 0
		if p.signaled {
			code = 137
		}
		os.WriteFile(filepath.Join(s.dir, stoppedFile), []byte(strconv.Itoa(code)+" "+p.err), 0o600)
	}
	s.proc = nil
	s.guest.close()
	m.removeCgroup(s.spec.ID)
}

// Stop implements backend.Backend: the guest stops its processes within
// grace and powers off; QEMU is killed if it has not ended soon after.
func (m *MicroVM) Stop(ctx context.Context, id string, grace time.Duration) error {
	s, err := m.get(id)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.proc
	if p == nil {
		if !exists(filepath.Join(s.dir, stoppedFile)) {
			// Created, never started (or paused): it is stopped now.
			os.WriteFile(filepath.Join(s.dir, stoppedFile), []byte("0 stopped"), 0o600)
			os.Remove(filepath.Join(s.dir, pausedFile))
		}
		return nil
	}
	// A microVM's agent stops the processes within grace, then powers
	// off; a vm's guest gets the power button and grace to shut down.
	wait := grace + killWait
	if m.kind == KindVM {
		wait = grace
	}
	sctx, cancel := context.WithTimeout(ctx, wait)
	if m.kind == KindVM {
		err = m.powerdown(sctx, s)
	} else {
		err = s.guest.call(sctx, "POST", "/v1/shutdown", url.Values{"grace": {grace.String()}}, nil, nil)
	}
	if err == nil {
		select {
		case <-p.done:
		case <-sctx.Done():
		}
	}
	cancel()
	if p.running() {
		m.kill(s)
	} else {
		m.exited(s, p)
	}
	return nil
}

// kill kills QEMU of s and waits for it (s.mu held).
func (m *MicroVM) kill(s *sandbox) {
	p := s.proc
	if p == nil {
		return
	}
	p.kill()
	select {
	case <-p.done:
	case <-time.After(killWait):
	}
	m.exited(s, p)
}

// Destroy implements backend.Backend.
func (m *MicroVM) Destroy(ctx context.Context, id string) error {
	if backend.ValidID(id) != nil {
		return nil
	}
	m.mu.Lock()
	s := m.sandboxes[id]
	m.mu.Unlock()
	if s == nil {
		s = &sandbox{dir: m.sandboxDir(id), spec: backend.Spec{ID: id}}
		s.guest = m.newGuest(s, "")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		// A QEMU we do not know of (an agent that died before Recover).
		if p, err := adopt(s.dir); err == nil {
			s.proc = p
		}
	}
	m.kill(s)
	m.removeCgroup(id)
	if err := os.RemoveAll(s.dir); err != nil {
		return fmt.Errorf("destroy %s: %w", id, err)
	}
	m.mu.Lock()
	delete(m.sandboxes, id)
	m.mu.Unlock()
	return nil
}

// Inspect implements backend.Backend.
func (m *MicroVM) Inspect(ctx context.Context, id string) (backend.Status, error) {
	s, err := m.get(id)
	if err != nil {
		return backend.Status{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return m.status(s), nil
}

// status is s's status (s.mu held).
func (m *MicroVM) status(s *sandbox) backend.Status {
	if b, err := os.ReadFile(filepath.Join(s.dir, stoppedFile)); err == nil {
		code, reason, _ := strings.Cut(string(b), " ")
		n, _ := strconv.Atoi(code)
		return backend.Status{State: backend.StateStopped, ExitCode: n, Reason: reason}
	}
	if s.proc != nil && s.proc.running() {
		return backend.Status{State: backend.StateRunning, Pid: s.proc.pid, StartedAt: s.proc.started}
	}
	if exists(filepath.Join(s.dir, pausedFile)) {
		return backend.Status{State: backend.StatePaused}
	}
	if s.proc != nil { // ended; Wait has not seen it yet
		return backend.Status{State: backend.StateStopped, ExitCode: 137, Reason: s.proc.err}
	}
	return backend.Status{State: backend.StateCreated}
}

// Recover implements backend.Backend: it adopts the sandbox's QEMU, if it
// still runs, from its pid file.
func (m *MicroVM) Recover(ctx context.Context, spec backend.Spec) (backend.Status, error) {
	if err := backend.ValidID(spec.ID); err != nil {
		return backend.Status{}, err
	}
	dir := m.sandboxDir(spec.ID)
	if !exists(filepath.Join(dir, specFile)) {
		return backend.Status{}, fmt.Errorf("recover %s: %w", spec.ID, errdefs.ErrNotFound)
	}
	secret, err := os.ReadFile(filepath.Join(dir, secretFile))
	if err != nil {
		return backend.Status{}, fmt.Errorf("recover %s: %w", spec.ID, err)
	}
	s := &sandbox{spec: spec, dir: dir}
	s.guest = m.newGuest(s, string(secret))
	if p, err := adopt(dir); err == nil {
		s.proc = p
	} else if exists(filepath.Join(dir, pidFile)) && !exists(filepath.Join(dir, stoppedFile)) {
		os.WriteFile(filepath.Join(dir, stoppedFile), []byte("137 the machine ended while the agent was away"), 0o600)
	}
	m.mu.Lock()
	m.sandboxes[spec.ID] = s
	m.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	return m.status(s), nil
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// process is a QEMU process: a child of this agent, or one adopted from
// an earlier agent (then watched through a pidfd).
type process struct {
	pid     int
	started time.Time
	done    chan struct{}
	// After done: how it ended.
	signaled bool
	err      string
	kill     func()
}

func (p *process) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// startQEMU starts QEMU detached from the agent (its own session, stdio
// on the console file: a boot starts it anew, a resume adds to it), in
// the sandbox's host cgroup.
func (m *MicroVM) startQEMU(s *sandbox, argv []string, resume bool) (*process, error) {
	flags := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	if resume {
		flags = os.O_WRONLY | os.O_CREATE | os.O_APPEND
	}
	console, err := os.OpenFile(filepath.Join(s.dir, consoleFile), flags, 0o600)
	if err != nil {
		return nil, err
	}
	defer console.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = console, console
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cg, err := m.makeCgroup(s)
	if err != nil {
		return nil, err
	}
	start := cmd.Start
	if s.spec.BestEffort {
		// QEMU and every thread it makes under SCHED_IDLE, its
		// cgroup an idle group (internal/qos).
		start = func() error { return qos.StartIdle(cmd) }
	}
	if err := start(); err != nil {
		m.removeCgroup(s.spec.ID)
		return nil, fmt.Errorf("qemu: %w", err)
	}
	// Its cgroup, and its place before the agent in a host-wide OOM
	// (internal/qos): the guest's RAM is touched as it boots, after this.
	err = cg.join(cmd.Process.Pid)
	if err == nil {
		err = qos.SetOOMScoreAdj(cmd.Process.Pid, qos.OOMScoreAdj(s.spec.BestEffort))
	}
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		m.removeCgroup(s.spec.ID)
		return nil, fmt.Errorf("qemu: %w", err)
	}
	p := &process{pid: cmd.Process.Pid, started: time.Now(), done: make(chan struct{}), kill: func() { cmd.Process.Kill() }}
	st, _ := startTime(p.pid)
	if err := os.WriteFile(filepath.Join(s.dir, pidFile), []byte(fmt.Sprintf("%d %d", p.pid, st)), 0o600); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, err
	}
	go func() {
		err := cmd.Wait()
		if ee, ok := err.(*exec.ExitError); ok {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				p.signaled = true
			}
			b, _ := os.ReadFile(filepath.Join(s.dir, consoleFile))
			p.err = lastLines(string(b), 3)
			if p.err == "" {
				p.err = err.Error()
			}
		}
		close(p.done)
	}()
	return p, nil
}

// adopt finds the QEMU of the sandbox in dir from its pid file, checked
// to be the same process (start time) and ours (its command line names
// the sandbox's directory).
func adopt(dir string) (*process, error) {
	b, err := os.ReadFile(filepath.Join(dir, pidFile))
	if err != nil {
		return nil, err
	}
	var pid int
	var st uint64
	if _, err := fmt.Sscan(string(b), &pid, &st); err != nil || pid <= 0 {
		return nil, fmt.Errorf("pid file %q", b)
	}
	now, err := startTime(pid)
	if err != nil || now != st {
		return nil, errors.New("gone")
	}
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if !strings.Contains(string(cmdline), dir+"/") {
		return nil, errors.New("pid reused")
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, err
	}
	p := &process{pid: pid, done: make(chan struct{})}
	if fi, err := os.Stat(filepath.Join(dir, pidFile)); err == nil {
		p.started = fi.ModTime()
	}
	p.kill = func() { unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) }
	go func() {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			if _, err := unix.Poll(pfd, -1); err != unix.EINTR {
				break
			}
		}
		p.err = "the machine ended"
		close(p.done)
		unix.Close(fd)
	}()
	return p, nil
}

// startTime is the process's start time in clock ticks since boot.
func startTime(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("bad stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, errors.New("bad stat")
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// sessionLog marks the guest agent's console lines about its sessions.
const sessionLog = "warren-guest: session "

// lastLines is the last n lines of a console, but for the guest agent's
// lines about its sessions, which say nothing of why a machine ended.
func lastLines(s string, n int) string {
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		if !strings.Contains(l, sessionLog) {
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "; ")
}

// Sweep removes the sandboxes on disk that the node no longer knows of
// (orphan says which): their QEMU, cgroups and directories.
func (m *MicroVM) Sweep(ctx context.Context, orphan func(id string) bool) ([]string, error) {
	ents, err := os.ReadDir(m.dir)
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, e := range ents {
		id := e.Name()
		if !e.IsDir() || backend.ValidID(id) != nil || !orphan(id) {
			continue
		}
		if err := m.Destroy(ctx, id); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, id)
	}
	return removed, errors.Join(errs...)
}
