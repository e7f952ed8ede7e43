package image

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/loopdev"
)

// Mounts keeps one read-only EROFS mount per layer digest on a node, shared
// by every sandbox whose root uses that layer, and unmounts it when the last
// user releases it. Mounting a layer once instead of once per sandbox keeps
// its page cache shared and makes a create cost one overlay mount.
//
// Mounts are file-backed EROFS (kernel >= 6.12: no loop device), falling
// back to a read-only, auto-clearing loop device on older kernels.
//
// Reference counts live in memory. After an agent restart the mounts are
// still there: each recovered sandbox Acquires its layers again, which
// adopts the existing mount, and Prune then unmounts whatever no sandbox
// claimed. All methods are safe for concurrent use; a mount or unmount
// syscall holds only its own digest's lock.
type Mounts struct {
	dir string

	mu     sync.Mutex // guards layers and every layerMount.refs
	layers map[string]*layerMount
}

type layerMount struct {
	mu      sync.Mutex // held across mount and unmount of this digest
	refs    int        // guarded by Mounts.mu
	mounted bool       // guarded by mu
}

// NewMounts returns a Mounts that mounts layers under dir, which it owns:
// one directory per digest. dir is created on first use.
func NewMounts(dir string) *Mounts {
	return &Mounts{dir: dir, layers: make(map[string]*layerMount)}
}

// Dir is the directory holding the layer mountpoints.
func (m *Mounts) Dir() string { return m.dir }

// Path returns where the layer with digest is (or would be) mounted. It
// does not check that it is.
func (m *Mounts) Path(digest string) (string, error) {
	name, err := mountName(digest)
	if err != nil {
		return "", err
	}
	return filepath.Join(m.dir, name), nil
}

// Acquire mounts layer read-only if it is not mounted yet, adopting a mount
// left by an earlier process, takes a reference on it and returns its
// mountpoint. Every successful Acquire must be paired with a Release.
// ErrInvalid for a malformed digest or path, ErrNotFound if the layer file
// is missing, ErrUnavailable if the kernel cannot mount it.
func (m *Mounts) Acquire(ctx context.Context, layer backend.Layer) (string, error) {
	target, err := m.Path(layer.Digest)
	if err != nil {
		return "", err
	}
	if !filepath.IsAbs(layer.Path) {
		return "", errdefs.Invalid("layer %s: path %q is not absolute", layer.Digest, layer.Path)
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}

	// Take the reference first so that a concurrent Release or Prune cannot
	// unmount what we are about to use.
	m.mu.Lock()
	lm := m.layers[layer.Digest]
	if lm == nil {
		lm = &layerMount{}
		m.layers[layer.Digest] = lm
	}
	lm.refs++
	m.mu.Unlock()

	lm.mu.Lock()
	defer lm.mu.Unlock()
	if lm.mounted {
		// Two stats: guards against the mount having been taken away
		// behind our back (by hand, or by another process's Prune).
		if ok, err := isMountpoint(target); err == nil && ok {
			return target, nil
		}
		lm.mounted = false
	}
	if err := mountLayer(layer.Path, target); err != nil {
		m.mu.Lock()
		lm.refs--
		if lm.refs == 0 && m.layers[layer.Digest] == lm {
			delete(m.layers, layer.Digest)
		}
		m.mu.Unlock()
		return "", fmt.Errorf("layer %s: %w", layer.Digest, err)
	}
	lm.mounted = true
	return target, nil
}

// Release drops a reference taken by Acquire and, at zero, unmounts the
// layer and removes its mountpoint. ErrNotFound if digest holds no
// reference.
func (m *Mounts) Release(digest string) error {
	m.mu.Lock()
	lm := m.layers[digest]
	if lm == nil || lm.refs == 0 {
		m.mu.Unlock()
		return errdefs.New(errdefs.ErrNotFound, "layer_not_acquired", "layer %s is not acquired", digest)
	}
	lm.refs--
	last := lm.refs == 0
	m.mu.Unlock()
	if !last {
		return nil
	}
	return m.unmountUnused(digest, lm)
}

// Refs returns the number of references held on digest.
func (m *Mounts) Refs(digest string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if lm := m.layers[digest]; lm != nil {
		return lm.refs
	}
	return 0
}

// Prune unmounts every layer mount under the directory that holds no
// reference, such as those left by an earlier process that no recovered
// sandbox claimed, and removes stray mountpoints. Call it after recovery.
// A running overlay keeps its own reference to a layer's filesystem, so
// pruning a layer still in use by an unrecovered sandbox does not break it;
// it only costs a second mount later.
func (m *Mounts) Prune() error {
	mounted, err := mountpointsUnder(m.dir)
	if err != nil {
		return err
	}
	entries, err := os.ReadDir(m.dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("prune layer mounts: %w", err)
	}
	names := make(map[string]bool, len(entries)+len(mounted))
	for _, e := range entries {
		names[e.Name()] = true
	}
	for _, n := range mounted {
		names[n] = true
	}
	var errs []error
	for name := range names {
		digest, ok := digestOf(name)
		if !ok {
			continue // not ours
		}
		m.mu.Lock()
		lm := m.layers[digest]
		if lm == nil {
			// Unknown to this process. unmountUnused checks the
			// mountpoint itself, and an Acquire racing with us mounts
			// or adopts as usual.
			lm = &layerMount{}
			m.layers[digest] = lm
		}
		busy := lm.refs > 0
		m.mu.Unlock()
		if !busy {
			if err := m.unmountUnused(digest, lm); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// unmountUnused unmounts lm if it is still unreferenced once its lock is
// held, and forgets it.
func (m *Mounts) unmountUnused(digest string, lm *layerMount) error {
	lm.mu.Lock()
	defer lm.mu.Unlock()
	m.mu.Lock()
	if lm.refs > 0 {
		// Acquired again meanwhile; that Acquire will find it mounted.
		m.mu.Unlock()
		return nil
	}
	m.mu.Unlock()

	target, err := m.Path(digest)
	if err != nil {
		return err
	}
	if err := unmountDir(target); err != nil {
		return fmt.Errorf("layer %s: %w", digest, err)
	}
	lm.mounted = false

	m.mu.Lock()
	if lm.refs == 0 && m.layers[digest] == lm {
		delete(m.layers, digest)
	}
	m.mu.Unlock()
	return nil
}

// mountName maps "sha256:<hex>" to "<hex>" and "<algo>:<hex>" to
// "<algo>-<hex>". Names stay short and free of ':' and ',' because they
// end up in overlayfs' lowerdir option, which is limited to a page.
func mountName(digest string) (string, error) {
	algo, hex, ok := strings.Cut(digest, ":")
	if !ok || !isLowerAlnum(algo) || len(hex) < 32 || !isHex(hex) {
		return "", errdefs.Invalid("malformed layer digest %q, want <algo>:<hex>", digest)
	}
	if algo == "sha256" {
		return hex, nil
	}
	return algo + "-" + hex, nil
}

// digestOf inverts mountName.
func digestOf(name string) (string, bool) {
	d := "sha256:" + name
	if algo, hex, ok := strings.Cut(name, "-"); ok {
		d = algo + ":" + hex
	}
	n, err := mountName(d)
	return d, err == nil && n == name
}

func isLowerAlnum(s string) bool {
	for _, c := range s {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return s != ""
}

func isHex(s string) bool {
	for _, c := range s {
		if (c < 'a' || c > 'f') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// mountLayer mounts the EROFS image file read-only on target, or adopts an
// EROFS mount already there.
func mountLayer(file, target string) error {
	if err := os.MkdirAll(target, 0o755); err != nil {
		return fmt.Errorf("mountpoint: %w", err)
	}
	if mounted, err := isMountpoint(target); err != nil {
		return err
	} else if mounted {
		var st unix.Statfs_t
		if err := unix.Statfs(target, &st); err != nil {
			return fmt.Errorf("statfs %s: %w", target, err)
		}
		if st.Type != unix.EROFS_SUPER_MAGIC_V1 {
			return fmt.Errorf("%s is a mountpoint but not erofs (type %#x)", target, st.Type)
		}
		return nil
	}
	if _, err := os.Stat(file); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return errdefs.New(errdefs.ErrNotFound, "layer_not_found", "layer file %s is missing", file)
		}
		return err
	}
	err := unix.Mount(file, target, "erofs", unix.MS_RDONLY, "")
	if errors.Is(err, unix.ENOTBLK) {
		// Kernel without file-backed EROFS (< 6.12): it wants a block
		// device.
		err = mountLoop(file, target)
	}
	if err != nil {
		os.Remove(target)
		if errors.Is(err, unix.ENODEV) {
			return errdefs.Unavailable("kernel lacks erofs: %v", err)
		}
		if errors.Is(err, unix.EIO) {
			// A layer served on demand whose blob store cannot be read.
			return errdefs.New(errdefs.ErrUnavailable, api.CodeImageUnavailable, "mount layer %s: cannot read it: %v", file, err)
		}
		return fmt.Errorf("mount erofs %s on %s: %w", file, target, err)
	}
	return nil
}

// mountLoop mounts the EROFS image file on target through a read-only
// loop device.
func mountLoop(file, target string) error {
	return loopdev.Mount(file, target, "erofs", unix.MS_RDONLY, "")
}

// isMountpoint reports whether dir is the root of a mount, by comparing its
// device with its parent's: two stats instead of parsing mountinfo.
func isMountpoint(dir string) (bool, error) {
	var st, pst unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return false, fmt.Errorf("stat %s: %w", dir, err)
	}
	if err := unix.Lstat(filepath.Dir(dir), &pst); err != nil {
		return false, fmt.Errorf("stat %s: %w", filepath.Dir(dir), err)
	}
	return st.Dev != pst.Dev || st.Ino == pst.Ino, nil
}

// unmountDir unmounts every mount stacked on dir and removes dir. A missing
// dir is not an error.
func unmountDir(dir string) error {
	for {
		mounted, err := isMountpoint(dir)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if !mounted {
			break
		}
		err = unix.Unmount(dir, 0)
		if errors.Is(err, unix.EBUSY) {
			// Someone holds a file open in it: detach it now, the kernel
			// frees it when they are done.
			err = unix.Unmount(dir, unix.MNT_DETACH)
		}
		if err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("unmount %s: %w", dir, err)
		}
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// mountpointsUnder lists the names of mounts directly under dir.
func mountpointsUnder(dir string) ([]string, error) {
	all, err := MountsUnder(dir)
	var names []string
	for _, mp := range all {
		if filepath.Dir(mp) == filepath.Clean(dir) {
			names = append(names, filepath.Base(mp))
		}
	}
	return names, err
}

// MountsUnder lists the mountpoints at or below dir, from
// /proc/self/mountinfo, deepest first (the order to unmount them in).
func MountsUnder(dir string) ([]string, error) {
	dir = filepath.Clean(dir)
	all, err := mountinfo()
	var out []string
	for _, m := range all {
		if m.point == dir || strings.HasPrefix(m.point, dir+"/") {
			out = append(out, m.point)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, err
}

// DetachMountsOf detaches (MNT_DETACH) every EROFS mount whose image file
// is under dir, and returns their mountpoints: the layer mounts of a lazy
// layer filesystem that went away (an agent restart), which read EIO from
// then on. Mounts.Acquire mounts those layers afresh; sandboxes already
// on them keep the dead mounts.
func DetachMountsOf(dir string) ([]string, error) {
	dir = filepath.Clean(dir)
	all, err := mountinfo()
	if err != nil {
		return nil, err
	}
	var out []string
	var errs []error
	for _, m := range all {
		if m.fstype != "erofs" || !strings.HasPrefix(m.source, dir+"/") {
			continue
		}
		if err := unix.Unmount(m.point, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("detach %s: %w", m.point, err))
			continue
		}
		out = append(out, m.point)
	}
	return out, errors.Join(errs...)
}

// mount is one line of /proc/self/mountinfo.
type mount struct{ point, fstype, source string }

// mountinfo reads /proc/self/mountinfo.
func mountinfo() ([]mount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mount
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		pre, post, _ := strings.Cut(sc.Text(), " - ")
		fields, tail := strings.Fields(pre), strings.Fields(post)
		if len(fields) < 5 {
			continue
		}
		m := mount{point: unescapeMountinfo(fields[4])}
		if len(tail) >= 2 {
			m.fstype, m.source = tail[0], unescapeMountinfo(tail[1])
		}
		out = append(out, m)
	}
	return out, sc.Err()
}

// unescapeMountinfo undoes the octal escapes (\040 for a space) the kernel
// puts in mountinfo paths.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			v := (int(s[i+1]-'0') << 6) | (int(s[i+2]-'0') << 3) | int(s[i+3]-'0')
			b.WriteByte(byte(v))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
