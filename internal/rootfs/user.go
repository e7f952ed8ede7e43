package rootfs

import (
	"bufio"
	"errors"
	"strconv"
	"strings"

	"github.com/warrenhq/warren/internal/errdefs"
)

// LookupUser resolves "", "name", "uid", "uid:gid" or "name:group" (and the
// mixed forms) against root's /etc/passwd and /etc/group, both read in-root.
// "" is root (0:0). A name missing from the files is ErrInvalid; a numeric
// uid need not be listed: its gid is then the passwd entry's if there is one,
// else the same number as the uid.
func LookupUser(root, user string) (uid, gid uint32, err error) {
	if user == "" {
		return 0, 0, nil
	}
	name, group, hasGroup := strings.Cut(user, ":")
	if name == "" || hasGroup && group == "" {
		return 0, 0, errdefs.Invalid("user %q: want name, uid, name:group or uid:gid", user)
	}
	rt, err := openRoot(root)
	if err != nil {
		return 0, 0, err
	}
	defer rt.close()

	// passwd: name:password:uid:gid:gecos:home:shell
	if id, ok := parseID(name); ok {
		uid, gid = id, id
		err = rt.scanDB("etc/passwd", func(f []string) bool {
			if len(f) >= 4 && f[2] == name {
				if g, ok := parseID(f[3]); ok {
					gid = g
				}
				return true
			}
			return false
		})
	} else {
		found := false
		err = rt.scanDB("etc/passwd", func(f []string) bool {
			if len(f) >= 4 && f[0] == name {
				u, uok := parseID(f[2])
				g, gok := parseID(f[3])
				uid, gid, found = u, g, uok && gok
				return true
			}
			return false
		})
		if err == nil && !found {
			return 0, 0, errdefs.Invalid("user %q: no such user in the sandbox's /etc/passwd", name)
		}
	}
	if err != nil || !hasGroup {
		return uid, gid, err
	}

	// group: name:password:gid:members
	if id, ok := parseID(group); ok {
		return uid, id, nil
	}
	found := false
	err = rt.scanDB("etc/group", func(f []string) bool {
		if len(f) >= 3 && f[0] == group {
			gid, found = parseID(f[2])
			return true
		}
		return false
	})
	if err == nil && !found {
		return 0, 0, errdefs.Invalid("user %q: no such group %q in the sandbox's /etc/group", user, group)
	}
	return uid, gid, err
}

// parseID parses a numeric uid or gid. (uid_t)-1 is refused: chown(2)
// reads it as "leave unchanged".
func parseID(s string) (uint32, bool) {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n == 1<<32-1 {
		return 0, false
	}
	return uint32(n), true
}

// scanDB calls match with the ":"-separated fields of each entry of the
// colon file rel (passwd, group) until it returns true. A missing file has
// no entries.
func (r *dirRoot) scanDB(rel string, match func(fields []string) bool) error {
	f, err := r.openRegular(rel)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20) // group lines list members and can be long
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		if match(strings.Split(line, ":")) {
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		return wrap("read", display(rel), err)
	}
	return nil
}
