package container

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/mountns"
)

// Create mounts the sandbox's root (an overlay of its layers with a fresh
// upper dir), writes its OCI bundle and runs the runtime's create
// (spec.Runtime's: runc or runsc): namespaces, cgroups and limits are set
// up, and the init waits for Start. On error everything is undone.
// ErrInvalid for a bad spec, ErrConflict if the id is taken (also by a
// sandbox of an earlier process that was not recovered or destroyed),
// ErrUnavailable for a runtime this host cannot run (GVisorAvailable).
func (c *Container) Create(ctx context.Context, spec backend.Spec) (err error) {
	if err := validateSpec(spec); err != nil {
		return err
	}
	rt, err := c.runtime(spec)
	if err != nil {
		return err
	}
	if c.initErr != nil {
		return errdefs.Unavailable("create sandbox %s: %v", spec.ID, c.initErr)
	}
	if rt.gvisor() {
		if err := c.GVisorAvailable(ctx); err != nil {
			return fmt.Errorf("create sandbox %s: %w", spec.ID, err)
		}
	}
	roots, err := c.roots()
	if err != nil {
		return fmt.Errorf("create sandbox %s: %w", spec.ID, err)
	}
	id := spec.ID
	s := &sandbox{spec: spec, rt: rt, roots: roots}
	s.mu.Lock()
	defer s.mu.Unlock()
	c.mu.Lock()
	if c.sandboxes[id] != nil {
		c.mu.Unlock()
		return errdefs.New(errdefs.ErrConflict, "sandbox_exists", "sandbox %s already exists", id)
	}
	c.sandboxes[id] = s
	c.mu.Unlock()

	// Undo in reverse order on failure.
	var undo []func() error
	defer func() {
		if err == nil {
			return
		}
		for i := len(undo) - 1; i >= 0; i-- {
			if uerr := undo[i](); uerr != nil {
				err = fmt.Errorf("%w (cleanup: %v)", err, uerr)
			}
		}
		c.mu.Lock()
		delete(c.sandboxes, id)
		c.mu.Unlock()
	}()

	dir := c.dir(id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return errdefs.New(errdefs.ErrConflict, "sandbox_exists", "sandbox %s already exists on disk", id)
		}
		return fmt.Errorf("create sandbox %s: %w", id, err)
	}
	undo = append(undo, func() error { return c.removeDir(id) })
	rw, err := c.prepareWritable(id, spec.Resources) // disk.go
	if err != nil {
		return fmt.Errorf("create sandbox %s: %w", id, err)
	}
	upper, work, root := filepath.Join(rw, "upper"), filepath.Join(rw, "work"), filepath.Join(dir, "rootfs")
	for _, d := range []string{upper, work, root} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return fmt.Errorf("create sandbox %s: %w", id, err)
		}
	}

	undo = append(undo, func() error { return c.releaseLayers(s) })
	lower := make([]string, len(spec.Layers))
	for i, l := range spec.Layers {
		mp, err := c.cfg.Mounts.Acquire(ctx, l)
		if err != nil {
			return fmt.Errorf("create sandbox %s: %w", id, err)
		}
		s.layers = append(s.layers, l.Digest)
		lower[len(lower)-1-i] = mp // overlayfs wants the top layer first
	}
	// Every mount of the sandbox is made in a scratch namespace, in
	// which the runtime then starts it (mountns): the host's mount table
	// never sees them, and they go with the container's namespace. It
	// is a copy of the host's taken now, with the layers' mounts in it.
	scratch, err := mountns.New()
	if err != nil {
		return fmt.Errorf("create sandbox %s: %w", id, err)
	}
	defer scratch.Close()
	if c.UserNS() == nil && !rt.gvisor() { // the sentry has a user namespace of its own
		if lower, upper, work, err = c.setupUserNS(scratch, s, lower, rw); err != nil {
			return fmt.Errorf("create sandbox %s: %w", id, err)
		}
		if s.ids != nil {
			r := *s.ids
			undo = append(undo, func() error { c.ids.free(id, r); return nil })
		}
	}
	// The platform's files (platformDir): the node's under every layer,
	// the sandbox's own (its boot id, its resolv.conf) above them.
	lower = append(lower, c.platformDir())
	own := filepath.Join(dir, "platform")
	if err := os.MkdirAll(filepath.Join(own, platformSub), 0o755); err != nil {
		return fmt.Errorf("create sandbox %s: %w", id, err)
	}
	if err := os.WriteFile(filepath.Join(own, platformSub, bootIDFile), []byte(newUUID()+"\n"), 0o444); err != nil { // identity.go
		return fmt.Errorf("create sandbox %s: %w", id, err)
	}
	if len(spec.DNS) > 0 {
		if err := os.WriteFile(filepath.Join(own, platformSub, resolvConf), resolvConfFor(spec.DNS), 0o644); err != nil {
			return fmt.Errorf("create sandbox %s: %w", id, err)
		}
	}
	lower = append([]string{own}, lower...)

	// Bind: on ext4 the overlay must not write as root with CAP_SYS_RESOURCE,
	// or it would pass the disk limit (disk.go); in a user namespace it
	// writes as the sandbox's root.
	err = c.quota.Bind(diskLimit(spec.Resources), s.fsid(), func() error {
		if err := scratch.Enter(); err != nil {
			return err
		}
		return mountOverlay(lower, upper, work, root)
	})
	if err != nil {
		return fmt.Errorf("create sandbox %s: %w", id, err)
	}
	// The agent's way to the sandbox's files (withRoot).
	clone, err := scratch.Clone(unix.AT_FDCWD, root, 0)
	if err != nil {
		return fmt.Errorf("create sandbox %s: %w", id, err)
	}
	if err := s.keepRoot(clone); err != nil {
		return fmt.Errorf("create sandbox %s: %w", id, err)
	}
	undo = append(undo, func() error { return s.closeRoot() })

	var oci *specs.Spec
	err = s.withRoot(func(held string) (err error) {
		oci, err = c.ociSpec(rt, spec, root, held, s.ids)
		return err
	})
	if err != nil {
		return fmt.Errorf("create sandbox %s: %w", id, err)
	}
	b, err := json.Marshal(oci)
	if err != nil {
		return fmt.Errorf("create sandbox %s: %w", id, err)
	}
	// No fsync: after a host crash the sandbox is gone anyway.
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600); err != nil {
		return fmt.Errorf("create sandbox %s: %w", id, err)
	}

	// Undo covers a half-done create too: the runtime may leave state or
	// cgroups behind when it fails late.
	undo = append(undo, func() error { return c.deleteRuntime(context.WithoutCancel(ctx), id, s) })
	var mergeVia string
	if c.merges(s) {
		mergeVia = c.cfg.EnterPath
	}
	if err := rt.create(ctx, id, dir, scratch, mergeVia); err != nil {
		return fmt.Errorf("create sandbox %s: %w", id, err)
	}
	st, err := c.readState(rt, id)
	if err != nil {
		return fmt.Errorf("create sandbox %s: %w", id, err)
	}
	cg, err := execCgroupOf(st.CgroupPaths)
	if err != nil {
		return fmt.Errorf("create sandbox %s: %w", id, err)
	}
	if err := c.giveIdentity(s, scratch, st.InitPid); err != nil { // identity.go
		return fmt.Errorf("create sandbox %s: %w", id, err)
	}
	if spec.BestEffort {
		if err := c.bestEffort(st.CgroupPaths, st.InitPid); err != nil { // qos.go
			return fmt.Errorf("create sandbox %s: %w", id, err)
		}
	}
	c.mu.Lock()
	s.init = initProc{pid: st.InitPid, start: st.InitStart}
	s.cg = cg
	s.cgPath = st.CgroupPaths
	s.ready = true
	c.mu.Unlock()
	return nil
}

func validateSpec(spec backend.Spec) error {
	if err := validID(spec.ID); err != nil {
		return err
	}
	if len(spec.Layers) == 0 {
		return errdefs.Invalid("sandbox %s: no layers", spec.ID)
	}
	r := spec.Resources
	if r.CPU < 0 || r.Memory < 0 || r.PIDs < 0 || r.Disk < 0 || r.DiskInodes < 0 {
		return errdefs.Invalid("sandbox %s: negative resources %+v", spec.ID, r)
	}
	if r.CPU > 0 && r.CPU*cfsPeriod < 1000 {
		return errdefs.Invalid("sandbox %s: cpu %g is below the minimum of 0.01", spec.ID, r.CPU)
	}
	if r.Memory > 0 && r.Memory < 4<<20 {
		return errdefs.Invalid("sandbox %s: memory %d is below the minimum of 4 MiB", spec.ID, r.Memory)
	}
	if spec.Workdir != "" && !strings.HasPrefix(spec.Workdir, "/") {
		return errdefs.Invalid("sandbox %s: workdir %q is not absolute", spec.ID, spec.Workdir)
	}
	return nil
}

// mountOverlay mounts the sandbox root. "volatile" skips the syncs
// overlayfs would otherwise do on every fsync and at unmount: the upper dir
// is scratch space that does not survive a host crash anyway.
//
// The directories are named to the kernel as /proc/self/fd/N of
// descriptors held for the call: overlayfs shows its options as given in
// every mount table, the sandbox's own /proc/self/mountinfo included, and
// those names say nothing of the host's paths (and stay short: the
// options must fit in a page).
func mountOverlay(lower []string, upper, work, target string) error {
	dirs := append(append([]string(nil), lower...), upper, work)
	names := make([]string, len(dirs))
	for i, d := range dirs {
		fd, err := unix.Open(d, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("mount overlay: %w", &os.PathError{Op: "open", Path: d, Err: err})
		}
		defer unix.Close(fd)
		names[i] = "/proc/self/fd/" + strconv.Itoa(fd)
	}
	n := len(lower)
	// No redirects, no metacopy, whatever the kernel's defaults: the
	// upper directory becomes a layer (a snapshot) that must stand on
	// its own, not name paths in the layers below (rootfs.MergeDiff).
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,redirect_dir=off,metacopy=off,volatile", strings.Join(names[:n], ":"), names[n], names[n+1])
	if len(opts) >= os.Getpagesize() {
		return errdefs.Invalid("overlay options for %d layers exceed a page", len(lower))
	}
	err := unix.Mount("overlay", target, "overlay", 0, opts)
	if errors.Is(err, unix.EINVAL) {
		// Kernels before 5.10 lack "volatile".
		err = unix.Mount("overlay", target, "overlay", 0, strings.TrimSuffix(opts, ",volatile"))
	}
	if err != nil {
		return fmt.Errorf("mount overlay: %w", err)
	}
	return nil
}

// unmountAll unmounts everything mounted on dir. A dir that is not a mount
// is fine.
func unmountAll(dir string) error {
	for {
		err := unix.Unmount(dir, 0)
		if errors.Is(err, unix.EBUSY) {
			err = unix.Unmount(dir, unix.MNT_DETACH)
		}
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil // not (or no longer) a mountpoint
		}
		if err != nil {
			return fmt.Errorf("unmount %s: %w", dir, err)
		}
	}
}

// Start starts a created sandbox's init. ErrConflict if it is not in the
// created state.
func (c *Container) Start(ctx context.Context, id string) error {
	s, err := c.get(id)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !c.created(s) || !s.init.alive() {
		return errdefs.New(errdefs.ErrConflict, "sandbox_not_created", "sandbox %s is not in the created state", id)
	}
	start := c.startInit
	if s.rt.gvisor() {
		start = func(ctx context.Context, s *sandbox) error { return s.rt.run(ctx, "start", s.spec.ID) }
	}
	if err := start(ctx, s); err != nil {
		return fmt.Errorf("start sandbox %s: %w", id, err)
	}
	// The marker's mtime is the start time, for Inspect after a restart.
	f, err := os.Create(filepath.Join(c.dir(id), "started"))
	if err != nil {
		return fmt.Errorf("start sandbox %s: %w", id, err)
	}
	return f.Close()
}

// startInit does what `runc start` does, without its fork and exec (a
// third of runc's share of a create): runc's init waits in an open of the
// exec fifo for writing, then writes a byte and execs the container's
// process; opening the fifo for reading and reading to EOF releases it.
// The fifo is removed after, which is what marks the container started.
func (c *Container) startInit(ctx context.Context, s *sandbox) error {
	path := c.runcFifo(s.spec.ID)
	// Non-blocking: a blocking open would hang forever if the init died.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if dl, ok := ctx.Deadline(); ok {
		f.SetReadDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { f.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	var got int
	buf := make([]byte, 8)
	for {
		n, err := f.Read(buf)
		got += n
		if err == nil {
			continue
		}
		if !errors.Is(err, io.EOF) {
			if errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("exec fifo: %w", err)
		}
		if got > 0 {
			break // written and closed by the exec: started
		}
		// EOF without data: the init has not reopened its end yet, or
		// it died.
		if !s.init.alive() {
			return errors.New("the container's init died before it started")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	return os.Remove(path)
}

// Wait blocks until the sandbox's init exits or ctx ends.
func (c *Container) Wait(ctx context.Context, id string) (backend.Status, error) {
	s, err := c.get(id)
	if err != nil {
		return backend.Status{}, err
	}
	if err := s.init.wait(ctx); err != nil {
		return backend.Status{}, err
	}
	return c.status(s), nil
}

// Stop sends the sandbox's init SIGTERM, then SIGKILL if it is still
// running after grace (which kills every process in the sandbox's pid
// namespace). Stopping a stopped sandbox is a no-op.
func (c *Container) Stop(ctx context.Context, id string, grace time.Duration) error {
	s, err := c.get(id)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.init.alive() {
		return nil
	}
	if grace > 0 {
		s.stopSignal.Store(int32(unix.SIGTERM))
		deadline := time.Now().Add(grace)
		// The kernel drops signals to a pid namespace's init that has no
		// handler for them yet, as right after Start: repeat the request
		// until the grace period is over.
		for d := 50 * time.Millisecond; time.Now().Before(deadline); d = min(2*d, time.Second) {
			if err := s.init.signal(unix.SIGTERM); err != nil {
				return fmt.Errorf("stop sandbox %s: %w", id, err)
			}
			wctx, cancel := context.WithTimeout(ctx, min(time.Until(deadline), d))
			err := s.init.wait(wctx)
			cancel()
			if err == nil {
				return nil
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
	}
	s.stopSignal.Store(int32(unix.SIGKILL))
	if err := s.init.signal(unix.SIGKILL); err != nil {
		return fmt.Errorf("stop sandbox %s: %w", id, err)
	}
	return s.init.wait(ctx)
}

// Destroy kills the sandbox and removes everything it holds: processes,
// exec cgroups, runc's state and cgroups, the overlay mount, its layer
// references and its directory. It works on sandboxes of an earlier
// process that were never recovered (their layer mounts are then left to
// image.Mounts.Prune), and an unknown id is not an error.
func (c *Container) Destroy(ctx context.Context, id string) error {
	if validID(id) != nil {
		return nil // no sandbox can have it, and it must not reach a path
	}
	c.mu.Lock()
	s := c.sandboxes[id]
	c.mu.Unlock()
	if s != nil {
		s.mu.Lock() // waits for a Create in progress to finish or undo
		defer s.mu.Unlock()
	}

	// Keep the rest if the container could not be removed: its processes
	// may still use the root, and a retry needs the same state.
	if err := c.deleteRuntime(ctx, id, s); err != nil {
		return fmt.Errorf("destroy sandbox %s: %w", id, err)
	}
	var errs []error
	if s != nil {
		s.closeRoot()
	}
	// Agents before mountns mounted roots and idmapped clones on the
	// host; a sandbox of theirs is still here after an upgrade.
	root := c.rootDir(id)
	if err := unmountAll(root); err != nil {
		errs = append(errs, err)
	} else if err := c.unmountIdmaps(id); err != nil {
		errs = append(errs, err)
	}
	if s != nil && s.ids != nil {
		c.ids.free(id, *s.ids)
	} else if r, ok, _ := readIDs(c.dir(id)); ok {
		c.ids.free(id, r) // a sandbox this process never adopted (Sweep)
	}
	if s != nil {
		if err := c.releaseLayers(s); err != nil {
			errs = append(errs, err)
		}
	}
	if err := c.removeDir(id); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("destroy sandbox %s: %w", id, errors.Join(errs...))
	}
	if s != nil {
		c.mu.Lock()
		if c.sandboxes[id] == s {
			delete(c.sandboxes, id)
		}
		c.mu.Unlock()
	}
	return nil
}

// removeDir removes the sandbox's directory, but never while its root is
// still mounted: that would delete through the overlay; nor through its
// idmapped clones of layers and of its writable directory.
func (c *Container) removeDir(id string) error {
	root := c.rootDir(id)
	if mounted, err := isMountpoint(root); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	} else if mounted {
		return fmt.Errorf("%s is still mounted", root)
	}
	if err := c.unmountIdmaps(id); err != nil {
		return err
	}
	if err := c.releaseWritable(id); err != nil { // disk.go
		return err
	}
	return os.RemoveAll(c.dir(id))
}

// deleteRuntime kills the container if it runs and removes its runtime
// state and cgroups (exec sub-cgroups first: cgroup v1 cannot remove a
// cgroup with children). s may be nil for a sandbox this process does not
// know.
func (c *Container) deleteRuntime(ctx context.Context, id string, s *sandbox) error {
	rt := c.runtimeOf(id, s)
	st, err := c.readState(rt, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil // never created, or already deleted
	}
	if err != nil {
		return err
	}
	init := initProc{pid: st.InitPid, start: st.InitStart}
	if s != nil {
		s.stopSignal.Store(int32(unix.SIGKILL))
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// Frozen tasks die only once thawed, and a pid namespace's init
	// waits for all of them: thaw first, whatever an exec left frozen.
	if err := thawAll(wctx, st.CgroupPaths); err != nil {
		return err
	}
	// Killing pid 1 of a pid namespace kills every process in it; the
	// exec trees are killed directly too.
	if err := init.signal(unix.SIGKILL); err != nil {
		return err
	}
	var errs []error
	if cg, err := execCgroupOf(st.CgroupPaths); err == nil {
		if err := cg.cleanup(wctx); err != nil {
			errs = append(errs, err)
		}
		// And whatever else is left in the container's cgroup.
		if err := cg.base.Kill(wctx); err != nil {
			errs = append(errs, err)
		}
	}
	if err := init.wait(wctx); err != nil {
		return errors.Join(append(errs, fmt.Errorf("wait for init of %s to die: %w", id, err))...)
	}
	if err := rt.run(ctx, "delete", "--force", id); err != nil && rt.hasState(id) {
		errs = append(errs, err)
	}
	// runc gives up on a cgroup that stays busy for a while; whatever it
	// left, try once more.
	if err := removeCgroups(st.CgroupPaths); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Inspect reports the sandbox's status from its runtime's state and /proc.
func (c *Container) Inspect(ctx context.Context, id string) (backend.Status, error) {
	s, err := c.get(id)
	if err != nil {
		return backend.Status{}, err
	}
	return c.status(s), nil
}

// status derives a sandbox's state as its runtime does: the init is alive
// (same pid and start time) and the runtime says it is created (runc's
// exec fifo exists, runsc's state says so) or not (running); otherwise it
// has stopped.
func (c *Container) status(s *sandbox) backend.Status {
	id := s.spec.ID
	st := backend.Status{Pid: s.init.pid}
	if fi, err := os.Stat(filepath.Join(c.dir(id), "started")); err == nil {
		st.StartedAt = fi.ModTime()
	}
	switch {
	case s.init.pid == 0:
		st.State, st.Reason = backend.StateStopped, "no runtime state"
	case !s.init.alive():
		st.State, st.Pid = backend.StateStopped, 0
		st.ExitCode, st.Reason = -1, "init exited; its exit status is unknown"
		if sig := unix.Signal(s.stopSignal.Load()); sig != 0 {
			st.ExitCode, st.Reason = 128+int(sig), "stopped by "+unix.SignalName(sig)
		}
	case c.created(s):
		st.State = backend.StateCreated
	case s.paused():
		st.State = backend.StatePaused
	default:
		st.State = backend.StateRunning
	}
	return st
}

// Recover re-adopts a sandbox this backend created in an earlier process:
// it takes references on its layers again (adopting their mounts) and
// reads the state of its runtime (spec.Runtime's). A sandbox whose init
// died meanwhile is reported stopped; one without a directory is
// ErrNotFound. Recovering a known sandbox just reports its status.
func (c *Container) Recover(ctx context.Context, spec backend.Spec) (backend.Status, error) {
	if err := validID(spec.ID); err != nil {
		return backend.Status{}, err
	}
	rt, err := c.runtime(spec)
	if err != nil {
		return backend.Status{}, err
	}
	id := spec.ID
	if s, err := c.get(id); err == nil {
		return c.status(s), nil
	}
	if !exists(c.dir(id)) {
		return backend.Status{}, errdefs.New(errdefs.ErrNotFound, "sandbox_not_found", "sandbox %s has no state on this node", id)
	}
	roots, rootsErr := c.roots()
	s := &sandbox{spec: spec, rt: rt, roots: roots}
	s.mu.Lock()
	c.mu.Lock()
	if c.sandboxes[id] != nil {
		c.mu.Unlock()
		s.mu.Unlock()
		return backend.Status{}, errdefs.New(errdefs.ErrConflict, "sandbox_busy", "sandbox %s is being created or recovered", id)
	}
	c.sandboxes[id] = s
	c.mu.Unlock()

	var reasons []string
	for _, l := range spec.Layers {
		if _, err := c.cfg.Mounts.Acquire(ctx, l); err != nil {
			// The overlay keeps its own reference to the layers; the
			// sandbox runs on. Report it and keep going.
			reasons = append(reasons, err.Error())
			continue
		}
		s.layers = append(s.layers, l.Digest)
	}
	if r, ok, err := readIDs(c.dir(id)); err != nil {
		reasons = append(reasons, err.Error())
	} else if ok {
		s.ids = &r
		c.ids.mark(id, r)
	}
	rootPid := 0
	if st, err := c.readState(rt, id); err == nil {
		s.init = initProc{pid: st.InitPid, start: st.InitStart}
		rootPid = st.RootPid
		if cg, err := execCgroupOf(st.CgroupPaths); err == nil {
			s.cg, s.cgPath = cg, st.CgroupPaths
		} else {
			reasons = append(reasons, err.Error())
		}
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		reasons = append(reasons, err.Error())
	}
	// Its root is mounted only in its own namespace now: while its init
	// lives, get a clone from there. (A stopped sandbox's files are gone
	// with it; what it wrote stays in its upper dir, for a snapshot.)
	if s.init.alive() {
		if rootsErr != nil {
			reasons = append(reasons, rootsErr.Error())
		} else if clone, err := adoptRoot(rootPid); err != nil {
			reasons = append(reasons, err.Error())
		} else if err := s.keepRoot(clone); err != nil {
			reasons = append(reasons, err.Error())
		}
	}
	c.mu.Lock()
	s.ready = true
	c.mu.Unlock()
	s.mu.Unlock()

	status := c.status(s)
	if len(reasons) > 0 {
		status.Reason = strings.Join(append([]string{status.Reason}, reasons...), "; ")
		status.Reason = strings.TrimPrefix(status.Reason, "; ")
	}
	return status, nil
}

// adoptRoot returns a detached clone of the root mount of process pid,
// whose root is a sandbox's (runtimeState.RootPid): how an agent that
// restarted gets back to the files of a sandbox an earlier one created.
// It must be an overlay, as every sandbox root is.
func adoptRoot(pid int) (*os.File, error) {
	if pid <= 0 {
		return nil, errors.New("root filesystem: the runtime names no process that has it")
	}
	_, start, err := procStat(pid)
	if err != nil {
		return nil, fmt.Errorf("root filesystem: %w", err)
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/root", pid), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("root filesystem: %w", err)
	}
	defer unix.Close(fd)
	ns, err := mountns.Of(pid)
	if err != nil {
		return nil, fmt.Errorf("root filesystem: %w", err)
	}
	defer ns.Close()
	if !(initProc{pid: pid, start: start}).alive() { // the same process all along
		return nil, errors.New("root filesystem: its process exited")
	}
	root, err := ns.Clone(fd, "", unix.AT_EMPTY_PATH)
	if err != nil {
		return nil, fmt.Errorf("root filesystem: %w", err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(root.Fd()), &st); err != nil || st.Type != unix.OVERLAYFS_SUPER_MAGIC {
		root.Close()
		return nil, fmt.Errorf("root filesystem: not the sandbox's overlay (type %#x, %v)", st.Type, err)
	}
	return root, nil
}

// isMountpoint reports whether dir is the root of a mount: its device
// differs from its parent's.
func isMountpoint(dir string) (bool, error) {
	var st, pst unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return false, &os.PathError{Op: "stat", Path: dir, Err: err}
	}
	if err := unix.Lstat(filepath.Dir(dir), &pst); err != nil {
		return false, &os.PathError{Op: "stat", Path: filepath.Dir(dir), Err: err}
	}
	return st.Dev != pst.Dev, nil
}
