package rootfs

import (
	"errors"
	"path"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/errdefs"
)

// Residue are the patterns (path.Match, one per component, absolute) of
// what a build leaves behind that an environment must not ship: shell and
// REPL histories (an agent's commands, answers typed in), caches of
// package managers and tools, and the contents of the temporary
// directories (the directories themselves stay, with their modes). A
// snapshot strips them unless asked to keep them; a fork never does (its
// branches continue the same trajectory).
var Residue = func() []string {
	histories := []string{".bash_history", ".ash_history", ".sh_history", ".zsh_history",
		".python_history", ".node_repl_history", ".psql_history", ".mysql_history",
		".sqlite_history", ".lesshst", ".viminfo", ".wget-hsts", ".cache", ".npm/_cacache"}
	var ps []string
	for _, home := range []string{"/root", "/home/*"} {
		for _, h := range histories {
			ps = append(ps, home+"/"+h)
		}
	}
	return append(ps,
		"/tmp/*", "/var/tmp/*",
		"/var/cache/apt/*.bin", "/var/cache/apt/archives/*.deb", "/var/lib/apt/lists/*",
		"/var/cache/apk/*", "/var/cache/dnf/*", "/var/cache/yum/*")
}()

// FindResidue returns the paths in upper (a copy of a sandbox's overlayfs
// upper directory: what the sandbox wrote) that match one of patterns,
// sorted, none under another. Only what the sandbox wrote is searched:
// residue in the layers below came with the environment. Nothing is
// followed: a symlink matches as itself and is never descended, so a tree
// the sandbox wrote cannot lead the search elsewhere. Whiteouts (the
// sandbox deleted something) are not residue: stripping one would bring
// back what it hides.
func FindResidue(upper string, patterns []string) ([]string, error) {
	root, err := openRoot(upper)
	if err != nil {
		return nil, err
	}
	defer root.close()
	var found []string
	for _, p := range patterns {
		comps := strings.Split(strings.TrimPrefix(path.Clean(p), "/"), "/")
		if err := matchIn(root.fd, "", comps, &found); err != nil {
			return nil, err
		}
	}
	slices.Sort(found)
	found = slices.Compact(found)
	// Drop what an earlier match covers (/root/.cache and /root/.cache/x).
	out := found[:0]
	for _, f := range found {
		if n := len(out); n > 0 && strings.HasPrefix(f, out[n-1]+"/") {
			continue
		}
		out = append(out, f)
	}
	return out, nil
}

// matchIn adds to found the entries under dirfd (at sandbox path dir)
// that match comps.
func matchIn(dirfd int, dir string, comps []string, found *[]string) error {
	names, err := namesIn(dirfd)
	if err != nil || names == nil {
		return err
	}
	last := len(comps) == 1
	for _, name := range names {
		if ok, _ := path.Match(comps[0], name); !ok {
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue // gone meanwhile
		}
		if st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0 {
			continue // a whiteout
		}
		p := dir + "/" + name
		if last {
			*found = append(*found, p)
			continue
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		err = matchIn(fd, p, comps[1:], found)
		unix.Close(fd)
		if err != nil {
			return err
		}
	}
	return nil
}

// namesIn lists the directory at O_PATH fd dirfd; nil if it is gone.
func namesIn(dirfd int) ([]string, error) {
	fd, err := unix.Openat(dirfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil
	}
	defer unix.Close(fd)
	return readNames(fd)
}

// StripAll strips the paths strip (declared: any failure is an error)
// and then whatever matches residue (FindResidue) from upper, over
// lowers (top first; see Strip). It returns the residue it took out. A
// residue path Strip refuses (a lower layer has a symlink on its way)
// is left out of upper all the same, and not hidden below: the
// environment shipped it already.
func StripAll(upper string, lowers, strip, residue []string) ([]string, error) {
	for _, p := range strip {
		if err := Strip(upper, lowers, p); err != nil {
			return nil, err
		}
	}
	if len(residue) == 0 {
		return nil, nil
	}
	found, err := FindResidue(upper, residue)
	if err != nil {
		return nil, err
	}
	for _, p := range found {
		if err := Strip(upper, lowers, p); err != nil && !errors.Is(err, errdefs.ErrInvalid) {
			return nil, err
		}
	}
	return found, nil
}
