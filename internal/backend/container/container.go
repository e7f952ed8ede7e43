// Package container is the container backend: each sandbox is an OCI
// container run by runc, whose root is an overlayfs with a private writable
// upper directory over the sandbox's read-only EROFS layers, shared by
// every sandbox on the node (image.Mounts).
//
// A sandbox may choose gVisor's runsc instead (Spec.Runtime "gvisor",
// gvisor.go): the same bundle, root and cgroups, with a kernel in user
// space between the sandbox and the host's, for users who want one
// without KVM. One node serves both; RuntimeCapabilities says how their
// sandboxes differ and GVisorAvailable whether this host runs gVisor.
//
// There is no platform daemon inside a sandbox. Its pid 1 is catatonit in
// pause mode (it reaps zombies and does nothing else), bound read-only on
// /dev/init (in the sandbox's /dev tmpfs) from the node's platform layer
// (platformDir). Exec enters the
// sandbox from the host through warren-enter, the platform's own launcher
// (cmd/warren-enter, enter.go), which joins the init's namespaces and
// cgroups and applies the init's own seccomp filters; file calls read and
// write the merged root from the host through package rootfs.
//
// Sandboxes outlive the agent: `runc create` detaches the container's init
// from the agent, and all state needed to re-adopt a sandbox is on disk
// (the sandbox directory under Config.StateDir, runc's state under
// Config.RuncRoot or runsc's under Config.RunscRoot, the mounts). Recover
// rebuilds the in-memory view.
//
// Every exec runs in its own child cgroup of the sandbox's cgroup (the
// freezer hierarchy on cgroup v1, a plain child on v2), so a timeout kills
// exactly that exec's process tree, including children it put in the
// background, and leaves the sandbox running.
package container

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/diskquota"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/guard"
	"github.com/warrenhq/warren/internal/hostbin"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/mountns"
	"github.com/warrenhq/warren/internal/qos"
)

// Config configures a Container backend. Everything it creates on the host
// is namespaced by StateDir, RuncRoot, RunscRoot and CgroupParent, so
// several agents can share a host if they differ in all of them.
type Config struct {
	// StateDir holds the backend's on-disk state: one directory per
	// sandbox under sandboxes/ (overlay upper and work dirs, the merged
	// root, the OCI bundle) and, by default, the layer mounts and runc's
	// state. Required; it must be on a local filesystem that can be an
	// overlayfs upper dir (ext4, xfs, btrfs, tmpfs).
	StateDir string
	// RuncRoot is runc's --root directory. Default <StateDir>/runc.
	RuncRoot string
	// CgroupParent is the cgroup path under which each sandbox gets
	// <CgroupParent>/<id> in every hierarchy, such as "/warren/<node-id>".
	// Default "/warren".
	CgroupParent string
	// Mounts shares layer mounts between sandboxes (and with other users
	// on the node, such as the fncall backend). Default
	// image.NewMounts(<StateDir>/layers).
	Mounts *image.Mounts
	// RuncPath is the runc binary. Default "runc" from PATH.
	RuncPath string
	// RunscPath is gVisor's runsc, for sandboxes whose Runtime is
	// "gvisor". Default "runsc" from PATH.
	RunscPath string
	// RunscRoot is runsc's --root directory. Default <StateDir>/runsc.
	RunscRoot string
	// InitPath is the static catatonit binary run as every sandbox's pid
	// 1. Default "catatonit" from PATH.
	InitPath string
	// EnterPath is warren-enter, the launcher every exec goes through
	// (cmd/warren-enter). Default: beside this executable, else from PATH.
	EnterPath string
	// ShellPath is the static shell `exec --sh` runs (ExecRequest.Shell),
	// the platform's own: never the sandbox's /bin/sh. Default
	// bash-static (Debian's) from PATH, else /bin/bash-static.
	ShellPath string
	// NoUserNS runs sandboxes without user namespaces: root inside is
	// the host's root with a reduced capability set. By default each
	// sandbox gets a user namespace of its own where the kernel can idmap
	// the mounts it needs (userns.go).
	NoUserNS bool
	// ExecOutputGrace is how long Exec waits, after the command's main
	// process exited, for the processes it left in the background to let
	// go of its stdout and stderr before it kills those that did not.
	// Default 100ms.
	ExecOutputGrace time.Duration
}

// Container is the container backend. Its methods are safe for concurrent
// use; lifecycle calls on one sandbox are serialised.
type Container struct {
	cfg         Config
	sandboxDir  string // <StateDir>/sandboxes
	noSwapCtl   bool   // cgroup v1 without swap accounting: cannot set memsw
	rlimits     []specs.POSIXRlimit
	runc        *ociRuntime
	gvisor      *ociRuntime
	quota       *diskquota.Quota // limits each sandbox directory (disk.go)
	shell       trustedShell     // for ExecRequest.Shell
	initErr     error            // why the init binary is missing, if it is
	devTemplate bool             // sandboxes' /dev is the platform layer's template (dev.go)
	landlock    [2]uint64        // handled and allowed rights, guard.LandlockRules
	apparmor    string           // the AppArmor profile of every sandbox process; "": none
	qos         qos.Support      // what best-effort sandboxes get here (qos.go)
	ids         idAllocator      // user-namespace id ranges (userns.go)
	usernsMu    sync.Mutex
	usernsErr   error // why sandboxes get no user namespace here, if they do not

	shelfOnce sync.Once
	shelf     *mountns.Shelf // where sandboxes' roots are kept (mountns.Shelf)
	shelfErr  error

	mergeOnce sync.Once
	mergeErr  error // why sandboxes' memory cannot merge here (merge.go)

	gvisorMu      sync.Mutex
	gvisorChecked bool  // GVisorAvailable has an answer
	gvisorErr     error // why this host cannot run gVisor sandboxes, if it cannot

	mu        sync.Mutex
	sandboxes map[string]*sandbox
}

// Interface guards.
var (
	_ backend.Backend = (*Container)(nil)
	_ backend.Execer  = (*Container)(nil)
	_ backend.Files   = (*Container)(nil)
)

// New returns a container backend, creating its state directories. It does
// not check the host: Available does. ErrInvalid for a bad Config.
func New(cfg Config) (*Container, error) {
	if !filepath.IsAbs(cfg.StateDir) {
		return nil, errdefs.Invalid("container backend: StateDir %q must be an absolute path", cfg.StateDir)
	}
	cfg.StateDir = filepath.Clean(cfg.StateDir)
	if cfg.RuncRoot == "" {
		cfg.RuncRoot = filepath.Join(cfg.StateDir, "runc")
	}
	if cfg.RunscRoot == "" {
		cfg.RunscRoot = filepath.Join(cfg.StateDir, "runsc")
	}
	for _, root := range []string{cfg.RuncRoot, cfg.RunscRoot} {
		if !filepath.IsAbs(root) {
			return nil, errdefs.Invalid("container backend: runtime root %q must be an absolute path", root)
		}
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = "/warren"
	}
	if !strings.HasPrefix(cfg.CgroupParent, "/") || strings.Contains(cfg.CgroupParent, "..") || strings.Contains(cfg.CgroupParent, ":") {
		return nil, errdefs.Invalid("container backend: CgroupParent %q must be an absolute cgroup path", cfg.CgroupParent)
	}
	cfg.CgroupParent = filepath.Clean(cfg.CgroupParent)
	if cfg.Mounts == nil {
		cfg.Mounts = image.NewMounts(filepath.Join(cfg.StateDir, "layers"))
	}
	if cfg.RuncPath == "" {
		cfg.RuncPath = "runc"
	}
	if cfg.RunscPath == "" {
		cfg.RunscPath = "runsc"
	}
	if cfg.InitPath == "" {
		cfg.InitPath = "catatonit"
	}
	// Resolve once so that every create does not search PATH; a missing
	// binary is Available's (or GVisorAvailable's) business, not an error
	// here.
	for _, bin := range []*string{&cfg.RuncPath, &cfg.RunscPath, &cfg.InitPath} {
		if p, err := exec.LookPath(*bin); err == nil {
			*bin = p
		}
	}
	if cfg.EnterPath == "" {
		cfg.EnterPath = hostbin.Find("warren-enter")
	}
	if cfg.ShellPath == "" {
		cfg.ShellPath = "/bin/bash-static"
		if p, err := exec.LookPath("bash-static"); err == nil {
			cfg.ShellPath = p
		}
	}
	if cfg.ExecOutputGrace <= 0 {
		cfg.ExecOutputGrace = 100 * time.Millisecond
	}
	c := &Container{
		cfg:        cfg,
		sandboxDir: filepath.Join(cfg.StateDir, "sandboxes"),
		sandboxes:  make(map[string]*sandbox),
	}
	for _, d := range []string{c.sandboxDir, cfg.RuncRoot, cfg.RunscRoot} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("container backend: %w", err)
		}
	}
	if err := c.installInit(); err != nil {
		return nil, fmt.Errorf("container backend: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(c.platformDir(), platformSub, emptyDir), 0o555); err != nil {
		return nil, fmt.Errorf("container backend: %w", err)
	}
	var err error
	if c.devTemplate, err = c.makeDevTemplate(); err != nil {
		return nil, fmt.Errorf("container backend: /dev template: %w", err)
	}
	c.noSwapCtl = cgroupV1WithoutSwap()
	c.rlimits = sandboxRlimits()
	env := runtimeEnv()
	c.runc = &ociRuntime{name: RuntimeRunc, path: cfg.RuncPath, root: cfg.RuncRoot, env: env}
	c.gvisor = &ociRuntime{name: RuntimeGVisor, path: cfg.RunscPath, root: cfg.RunscRoot, flags: runscFlags, env: env}
	c.quota = diskquota.Detect(c.sandboxDir)
	_, _ = c.quota.ClearStale() // an earlier agent's leftovers; each removal sweeps again
	c.shell = loadTrustedShell(cfg.ShellPath)
	c.landlock[0], c.landlock[1], _ = guard.LandlockRules()
	c.apparmor, _ = guard.LoadAppArmor() // where it fails, node ls says why
	c.qos = qos.Probe()
	c.ids.used = make(map[int]string)
	if cfg.NoUserNS {
		c.usernsErr = errors.New("turned off (NoUserNS)")
	} else if err := c.usernsProbe(); err != nil {
		c.usernsErr = err
	}
	// Ranges of sandboxes from before a restart stay theirs.
	if entries, err := os.ReadDir(c.sandboxDir); err == nil {
		for _, e := range entries {
			if r, ok, err := readIDs(c.dir(e.Name())); err == nil && ok {
				c.ids.mark(e.Name(), r)
			}
		}
	}
	return c, nil
}

// Name returns "container".
func (c *Container) Name() string { return "container" }

// Capabilities of the container backend: of its runc sandboxes, the
// default (gVisor's offer less: RuntimeCapabilities).
func (c *Container) Capabilities() backend.Capabilities {
	return backend.Capabilities{
		Exec:     true,
		Files:    true,
		Hostname: true,
		Isolated: true,
		Limits:   true,
		Recover:  true,
		Snapshot: true,
		QoS:      true,
	}
}

// Available checks what the backend needs: root, runc, catatonit,
// warren-enter, mkfs.erofs (to build layers on this node), overlay and erofs in the
// kernel, and a cgroup filesystem. ErrUnavailable says what is missing.
func (c *Container) Available(ctx context.Context) error {
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "needs root")
	}
	for _, bin := range []string{c.cfg.RuncPath, c.cfg.InitPath, c.cfg.EnterPath, "mkfs.erofs"} {
		if _, err := exec.LookPath(bin); err != nil {
			missing = append(missing, fmt.Sprintf("%s not found", bin))
		}
	}
	fss, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		missing = append(missing, fmt.Sprintf("cannot read /proc/filesystems: %v", err))
	}
	for _, fs := range []string{"overlay", "erofs"} {
		if err == nil && !hasFilesystem(string(fss), fs) {
			missing = append(missing, fmt.Sprintf("kernel lacks %s", fs))
		}
	}
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &st); err != nil {
		missing = append(missing, fmt.Sprintf("no cgroup filesystem at /sys/fs/cgroup: %v", err))
	}
	if len(missing) > 0 {
		return errdefs.Unavailable("container backend: %s", strings.Join(missing, "; "))
	}
	return nil
}

func hasFilesystem(procFilesystems, name string) bool {
	for _, line := range strings.Split(procFilesystems, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[len(f)-1] == name {
			return true
		}
	}
	return false
}

// sandbox is the in-memory view of one sandbox. spec, layers, init and cg
// are set before ready and not changed after.
type sandbox struct {
	mu sync.Mutex // serialises lifecycle calls (Create, Start, Stop, Destroy)

	ready  bool // created or recovered; guarded by Container.mu
	spec   backend.Spec
	rt     *ociRuntime       // the spec's
	layers []string          // digests this process holds a reference on
	init   initProc          // the container's pid 1
	cg     execCgroup        // where exec sub-cgroups go
	cgPath map[string]string // the sandbox's cgroup in each hierarchy, as runc records them

	ids *idRange // its user namespace's ids; nil: none (the host's)

	roots *mountns.Shelf // the node's, where a clone of its root mount is kept (Container.roots)

	filterMu sync.Mutex
	filters  [][]byte // the init's seccomp filters (initFilters), read on first exec

	freezeMu sync.Mutex // one Snapshot at a time: each freezes and thaws the cgroup

	stopSignal atomic.Int32 // last signal Stop or Destroy sent to init
}

// validID keeps ids safe as path elements, runc ids and cgroup names.
func validID(id string) error { return backend.ValidID(id) }

func (c *Container) dir(id string) string { return filepath.Join(c.sandboxDir, id) }

// rootDir is where the sandbox's merged root is mounted in the namespace
// the runtime starts it in (mountns), and the runtime's bundle root. It
// is no mount on the host (but was, for agents before mountns).
func (c *Container) rootDir(id string) string { return filepath.Join(c.sandboxDir, id, "rootfs") }

// withRoot runs f on the sandbox's merged root, named by a path of f's
// own: /proc/self/fd/N of a descriptor of the clone its node keeps
// (keepRoot), so that a Destroy meanwhile cannot take it from under f.
func (s *sandbox) withRoot(f func(root string) error) error {
	if s.roots == nil {
		return s.noRoot()
	}
	held, err := s.roots.Open(s.spec.ID)
	if errors.Is(err, fs.ErrNotExist) {
		return s.noRoot()
	}
	if err != nil {
		return fmt.Errorf("sandbox %s: root: %w", s.spec.ID, err)
	}
	defer held.Close()
	return f("/proc/self/fd/" + strconv.Itoa(int(held.Fd())))
}

func (s *sandbox) noRoot() error {
	return errdefs.New(errdefs.ErrConflict, "sandbox_no_root", "sandbox %s has no root filesystem: it stopped while the node agent was down, or is being destroyed", s.spec.ID)
}

// keepRoot puts clone, a detached clone of the sandbox's root mount, on
// the node's shelf, and closes it: a node of 10,000 sandboxes does not
// hold a descriptor for each.
func (s *sandbox) keepRoot(clone *os.File) error {
	defer clone.Close()
	if s.roots == nil {
		return errors.New("no mount shelf")
	}
	return s.roots.Put(s.spec.ID, clone)
}

// closeRoot drops the node's hold on the sandbox's root.
func (s *sandbox) closeRoot() error {
	if s.roots == nil {
		return nil
	}
	return s.roots.Drop(s.spec.ID)
}

// Close lets go of what the backend holds for its sandboxes, as the
// process's exit would: the roots on its shelf (a running sandbox keeps
// its own; a later Container re-adopts it with Recover). Sandboxes run on.
func (c *Container) Close() error {
	c.shelfOnce.Do(func() { c.shelfErr = errors.New("container backend closed") })
	if c.shelf != nil {
		return c.shelf.Close()
	}
	return nil
}

// roots returns the shelf where sandboxes' roots are kept, set up on
// first use (it needs root, which New does not).
func (c *Container) roots() (*mountns.Shelf, error) {
	c.shelfOnce.Do(func() {
		dir := filepath.Join(c.cfg.StateDir, "roots")
		if c.shelfErr = os.MkdirAll(dir, 0o700); c.shelfErr == nil {
			c.shelf, c.shelfErr = mountns.NewShelf(dir)
		}
	})
	return c.shelf, c.shelfErr
}

// get returns a created or recovered sandbox. ErrNotFound if unknown,
// ErrConflict while it is being created.
func (c *Container) get(id string) (*sandbox, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sandboxes[id]
	if s == nil {
		return nil, errdefs.New(errdefs.ErrNotFound, "sandbox_not_found", "sandbox %s not found", id)
	}
	if !s.ready {
		return nil, errdefs.New(errdefs.ErrConflict, "sandbox_busy", "sandbox %s is being created", id)
	}
	return s, nil
}

// releaseLayers drops the layer references s holds.
func (c *Container) releaseLayers(s *sandbox) error {
	var errs []error
	for _, d := range s.layers {
		if err := c.cfg.Mounts.Release(d); err != nil {
			errs = append(errs, err)
		}
	}
	s.layers = nil
	return errors.Join(errs...)
}

// installInit copies the init binary (catatonit) into the node's platform
// layer (platformDir) with mode 0111, execute only. A process that execs a
// file it may not read is made non-dumpable by the kernel, and the
// sandbox's init runs with no capabilities (ociSpec), so it cannot read
// its own binary: nothing in the sandbox (root without CAP_SYS_PTRACE) may
// ptrace it, read or write its memory through /proc/1/mem or
// process_vm_writev, or take its file descriptors with pidfd_getfd. The
// node enters sandboxes through their init's namespaces. A missing binary
// is left to Available and Create (initErr).
func (c *Container) installInit() error {
	src, err := os.ReadFile(c.cfg.InitPath)
	if err != nil {
		c.initErr = fmt.Errorf("init binary: %w", err)
		return nil
	}
	dir := filepath.Join(c.platformDir(), platformSub)
	dst := filepath.Join(dir, "init")
	if old, err := os.ReadFile(dst); err == nil && bytes.Equal(old, src) {
		if fi, err := os.Stat(dst); err == nil && fi.Mode().Perm() == 0o111 {
			return nil
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp := dst + ".tmp"
	os.Remove(tmp)
	if err := os.WriteFile(tmp, src, 0o700); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o111); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// platformDir is the node's platform layer: the lowest layer of every
// sandbox's overlay, holding the init binary at /.warren/init. The
// sandbox's /dev/init is a read-only bind of that file made from inside
// its own root, so that its /proc/self/mountinfo shows "/.warren/init" on
// the sandbox's overlay, never a path of the host's; an empty read-only
// tmpfs then covers /.warren. Nothing writes to a lower layer: an agent's
// write to /.warren/init is a copy-up into its own upper layer.
func (c *Container) platformDir() string { return filepath.Join(c.cfg.StateDir, "platform") }

// platformSub is the directory the platform's files appear in, in every
// sandbox's root (covered by an empty directory once they are bound).
const platformSub = ".warren"

// emptyDir is an empty directory among the platform's files, bound
// read-only over what a sandbox must not see (platformSub itself, masked
// directories of /sys): a bind of what the sandbox's root already holds
// costs no filesystem of its own, where a tmpfs would (ociSpec).
const emptyDir = "empty"
