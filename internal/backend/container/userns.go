package container

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/mountns"
)

// User namespaces: each sandbox runs in a user namespace of its own whose
// ids 0-65535 are an unprivileged range of host ids no other sandbox
// shares, so root inside owns nothing outside (a file of the host's root
// is nobody's inside; a process that escaped would be an unprivileged
// user of the host). runc 1.1 cannot idmap mounts itself, so the agent
// does it before runc sees the root: every layer (shared by all sandboxes,
// stored with the image's own ids) and the sandbox's writable directory
// get an idmapped clone (open_tree + mount_setattr MOUNT_ATTR_IDMAP) under
// the sandbox's directory, in the namespace the sandbox is created in
// (package mountns; never the host's), and the overlay is stacked on those, mounted
// with the sandbox root's host id as its filesystem id (the overlay writes
// its upper layer with its mounter's credentials). Nothing is chowned,
// ever: the upper layer on disk holds the sandbox's own ids, as a layer
// built from it must.

const (
	idBase   = 1 << 24 // the first host id handed to sandboxes
	idSize   = 65536   // ids per sandbox
	idSlots  = 32512   // (2^31 - idBase) / idSize: host ids stay below 2^31
	idsFile  = "userns"
	idmapDir = "idmap"
)

// idRange is a sandbox's ids: 0..idSize-1 inside are base.. outside.
type idRange struct{ base uint32 }

func (r idRange) slot() int { return int(r.base-idBase) / idSize }

// idAllocator hands out id ranges, one per sandbox on the node, in turn
// (a range freed is the last to be handed out again).
type idAllocator struct {
	mu   sync.Mutex
	used map[int]string // slot -> sandbox
	next int

	// ready is a user namespace made ahead for slot readySlot, the one
	// alloc is likely to hand out next: making one costs a fork and
	// exec (~1 ms), off the create's path.
	ready     *os.File
	readySlot int
	preparing bool
}

// alloc reserves a range for sandbox id. ErrUnavailable when every range
// is taken.
func (a *idAllocator) alloc(id string) (idRange, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := 0; i < idSlots; i++ {
		s := (a.next + i) % idSlots
		if _, taken := a.used[s]; !taken {
			a.used[s] = id
			a.next = s + 1
			return idRange{base: uint32(idBase + s*idSize)}, nil
		}
	}
	return idRange{}, errdefs.Unavailable("no free user-namespace id range (%d sandboxes)", idSlots)
}

// mark records a range in use (found on disk).
func (a *idAllocator) mark(id string, r idRange) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.used[r.slot()] = id
}

// free gives back sandbox id's range (if it is still id's).
func (a *idAllocator) free(id string, r idRange) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.used[r.slot()] == id {
		delete(a.used, r.slot())
	}
}

// writeIDs records r in the sandbox's directory ("v1 BASE SIZE"), for
// Recover and for New after a restart.
func writeIDs(dir string, r idRange) error {
	return os.WriteFile(filepath.Join(dir, idsFile), []byte(fmt.Sprintf("v1 %d %d\n", r.base, idSize)), 0o600)
}

// readIDs reads what writeIDs wrote. ok is false for a sandbox without a
// user namespace.
func readIDs(dir string) (r idRange, ok bool, err error) {
	b, err := os.ReadFile(filepath.Join(dir, idsFile))
	if errors.Is(err, os.ErrNotExist) {
		return r, false, nil
	}
	if err != nil {
		return r, false, err
	}
	f := strings.Fields(string(b))
	if len(f) != 3 || f[0] != "v1" || f[2] != strconv.Itoa(idSize) {
		return r, false, fmt.Errorf("%s: unknown format %q", idsFile, b)
	}
	base, err := strconv.ParseUint(f[1], 10, 32)
	if err != nil || base < idBase || (base-idBase)%idSize != 0 || int(base-idBase)/idSize >= idSlots {
		return r, false, fmt.Errorf("%s: bad base %q", idsFile, f[1])
	}
	return idRange{base: uint32(base)}, true, nil
}

// userNS returns a user namespace with r's mapping: the one made ahead for
// it if there is one, else a new one; and starts making one for the range
// likely to be handed out next.
func (c *Container) userNS(r idRange) (*os.File, error) {
	a := &c.ids
	a.mu.Lock()
	ns := a.ready
	if ns != nil && a.readySlot != r.slot() {
		ns.Close()
		ns = nil
	}
	a.ready = nil
	next, start := a.next%idSlots, !a.preparing
	for i := 0; i < idSlots && a.used[next] != ""; i++ {
		next = (next + 1) % idSlots
	}
	a.preparing = a.preparing || start
	a.mu.Unlock()
	if start {
		go func() {
			f, err := c.newUserNS(idRange{base: uint32(idBase + next*idSize)})
			a.mu.Lock()
			defer a.mu.Unlock()
			a.preparing = false
			if err == nil {
				if a.ready != nil {
					a.ready.Close()
				}
				a.ready, a.readySlot = f, next
			}
		}()
	}
	if ns != nil {
		return ns, nil
	}
	return c.newUserNS(r)
}

// newUserNS returns a user namespace with r's mapping, held by a process
// that warren-enter makes and that exits once the namespace is open.
func (c *Container) newUserNS(r idRange) (*os.File, error) {
	cmd := exec.Command(c.cfg.EnterPath, "hold")
	cmd.Env = []string{}
	m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(r.base), Size: idSize}}
	// No Pdeathsig: it fires when the forking OS thread exits, which Go
	// may do at any time; the holder ends when its stdin closes, the
	// agent's death included.
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWUSER, UidMappings: m, GidMappings: m}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("user namespace: %w", err)
	}
	// The mappings are written before the child execs, so they are in
	// place once Start has returned.
	ns, err := os.Open("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/ns/user")
	in.Close()
	cmd.Wait() // once the namespace is open, how the holder ended does not matter
	if err != nil {
		return nil, fmt.Errorf("user namespace: %w", err)
	}
	return ns, nil
}

// idmappedClone returns a detached clone of the mount at src whose ids
// are shifted by the user namespace ns's mapping.
func idmappedClone(src string, ns *os.File) (int, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("idmap %s: open_tree: %w", src, err)
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(ns.Fd())}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("idmap %s: %w", src, err)
	}
	return fd, nil
}

// idmapMount attaches an idmappedClone of src at dst.
func idmapMount(src, dst string, ns *os.File) error {
	fd, err := idmappedClone(src, ns)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := os.Mkdir(dst, 0o700); err != nil {
		return fmt.Errorf("idmap %s: %w", src, err)
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("idmap %s: move_mount: %w", src, err)
	}
	return nil
}

// unmountIdmaps unmounts the sandbox's idmapped clones (after its root)
// where an agent before mountns mounted them on the host, and removes
// their mount points.
func (c *Container) unmountIdmaps(id string) error {
	dir := filepath.Join(c.dir(id), idmapDir)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if err := unmountAll(p); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := os.Remove(p); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// usernsProbe says whether sandboxes get user namespaces here: the kernel
// must idmap mounts of the state directory's filesystem (ext4, xfs, btrfs;
// tmpfs from 6.3) and of EROFS layers, which is tried on the first create
// (setupUserNS); and runc, already in the sandbox's user namespace when it
// mounts the root, must be able to reach it: every directory above the
// state directory must be searchable by others (the state directory and
// the sandboxes directory are made so: 0711, not listable; each sandbox's
// own directory is 0710 with the group of its root). nil means yes.
func (c *Container) usernsProbe() error {
	for _, d := range []string{c.cfg.StateDir, c.sandboxDir} {
		if err := os.Chmod(d, 0o711); err != nil {
			return err
		}
	}
	for d := filepath.Dir(c.cfg.StateDir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("%s is not searchable by other users (a sandbox's root must reach its root filesystem below it: chmod o+x)", d)
		}
		if d == "/" {
			break
		}
	}
	ns, err := c.newUserNS(idRange{base: idBase})
	if err != nil {
		return err
	}
	defer ns.Close()
	fd, err := idmappedClone(c.sandboxDir, ns)
	if err != nil {
		return err
	}
	return unix.Close(fd)
}

// idShift is how far the sandbox's ids are from the host's.
func (s *sandbox) idShift() int { return max(s.fsid(), 0) }

// fsid is the host id the sandbox's root writes files as, or -1 for the
// host's root (no user namespace).
func (s *sandbox) fsid() int {
	if s.ids == nil {
		return -1
	}
	return int(s.ids.base)
}

// setupUserNS gives sandbox s a user namespace: an id range (recorded in
// its directory), idmapped clones of its layers and of its writable
// directory rw, and returns the overlay's layers, upper and work dirs on
// those. Where the kernel cannot idmap a layer's filesystem (EROFS before
// 5.19ish), it says so once (usernsErr) and s goes without: the paths come
// back as they were.
func (c *Container) setupUserNS(scratch *mountns.NS, s *sandbox, lower []string, rw string) (_ []string, upper, work string, err error) {
	id := s.spec.ID
	upper, work = filepath.Join(rw, "upper"), filepath.Join(rw, "work")
	r, err := c.ids.alloc(id)
	if err != nil {
		return nil, "", "", err
	}
	defer func() {
		if s.ids == nil {
			c.ids.free(id, r)
		}
	}()
	ns, err := c.userNS(r)
	if err != nil {
		return nil, "", "", err
	}
	defer ns.Close()
	dir := filepath.Join(c.dir(id), idmapDir)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, "", "", err
	}
	mapped := make([]string, len(lower))
	for i, l := range lower {
		mapped[i] = filepath.Join(dir, strconv.Itoa(i))
		if err := scratch.Run(func() error { return idmapMount(l, mapped[i], ns) }); err != nil {
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) {
				c.disableUserNS(fmt.Errorf("cannot idmap layers: %w", err))
				return lower, upper, work, nil // what was mounted goes with scratch
			}
			return nil, "", "", err
		}
	}
	mrw := filepath.Join(dir, "rw")
	if err := scratch.Run(func() error { return idmapMount(rw, mrw, ns) }); err != nil {
		return nil, "", "", err
	}
	if err := writeIDs(c.dir(id), r); err != nil {
		return nil, "", "", err
	}
	// runc mounts the root from inside the user namespace: the sandbox's
	// root must be able to pass its directory, and nobody else.
	if err := os.Chown(c.dir(id), 0, int(r.base)); err != nil {
		return nil, "", "", err
	}
	if err := os.Chmod(c.dir(id), 0o710); err != nil {
		return nil, "", "", err
	}
	s.ids = &r
	return mapped, filepath.Join(mrw, "upper"), filepath.Join(mrw, "work"), nil
}

// UserNS says whether new sandboxes get a user namespace of their own
// here (nil), or why not.
func (c *Container) UserNS() error {
	c.usernsMu.Lock()
	defer c.usernsMu.Unlock()
	return c.usernsErr
}

func (c *Container) disableUserNS(err error) {
	c.usernsMu.Lock()
	defer c.usernsMu.Unlock()
	c.usernsErr = err
}
