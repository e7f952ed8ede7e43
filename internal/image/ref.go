package image

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/warrenhq/warren/internal/errdefs"
)

const (
	maxNameLen    = 255
	maxVersionLen = 128
)

// Ref names one version of a layer or an environment: "name@version". A
// Ref with no Version stands for the latest version of Name.
type Ref struct {
	Name, Version string
}

func (r Ref) String() string {
	if r.Version == "" {
		return r.Name
	}
	return r.Name + "@" + r.Version
}

// ParseRef parses "name@version" or, when latestOK, a bare "name". Names
// are 1 to 255 characters from [a-z0-9._-/], starting with a letter or
// digit, with no empty, "." or ".." path segments; versions are 1 to 128
// characters from [A-Za-z0-9._-], starting with a letter or digit.
// ErrInvalid otherwise.
func ParseRef(s string, latestOK bool) (Ref, error) {
	name, version, hasVersion := strings.Cut(s, "@")
	if err := ValidateName(name); err != nil {
		return Ref{}, err
	}
	if !hasVersion {
		if !latestOK {
			return Ref{}, errdefs.New(errdefs.ErrInvalid, "invalid_ref", "%q: want name@version", s)
		}
		return Ref{Name: name}, nil
	}
	if err := ValidateVersion(version); err != nil {
		return Ref{}, err
	}
	return Ref{Name: name, Version: version}, nil
}

// ValidateName checks a layer or environment name (see ParseRef).
// ErrInvalid (code "invalid_name") otherwise.
func ValidateName(name string) error {
	bad := func(why string) error {
		return errdefs.New(errdefs.ErrInvalid, "invalid_name", "invalid name %q: %s", name, why)
	}
	if name == "" || len(name) > maxNameLen {
		return bad(fmt.Sprintf("want 1 to %d characters", maxNameLen))
	}
	if c := name[0]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
		return bad("must start with a lowercase letter or digit")
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || strings.ContainsRune("._-/", c)) {
			return bad("only lowercase letters, digits and . _ - / are allowed")
		}
	}
	for _, seg := range strings.Split(name, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return bad(`empty, "." and ".." path segments are not allowed`)
		}
	}
	return nil
}

// ValidateVersion checks a version (see ParseRef). ErrInvalid (code
// "invalid_version") otherwise.
func ValidateVersion(v string) error {
	bad := func(why string) error {
		return errdefs.New(errdefs.ErrInvalid, "invalid_version", "invalid version %q: %s", v, why)
	}
	if v == "" || len(v) > maxVersionLen {
		return bad(fmt.Sprintf("want 1 to %d characters", maxVersionLen))
	}
	if c := v[0]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
		return bad("must start with a letter or digit")
	}
	for _, c := range v {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("._-", c)) {
			return bad("only letters, digits and . _ - are allowed")
		}
	}
	return nil
}

// CompareVersions orders versions the way people number them: runs of
// digits compare as numbers, everything else byte by byte, so 2 < 10 and
// 1.9 < 1.10. The latest version of a name is the greatest.
func CompareVersions(a, b string) int {
	for a != "" && b != "" {
		ad, bd := isDigit(a[0]), isDigit(b[0])
		if ad && bd {
			na, ra := leadingRun(a, isDigit)
			nb, rb := leadingRun(b, isDigit)
			ta, tb := strings.TrimLeft(na, "0"), strings.TrimLeft(nb, "0")
			if len(ta) != len(tb) {
				return cmpInt(len(ta), len(tb))
			}
			if c := strings.Compare(ta, tb); c != 0 {
				return c
			}
			a, b = ra, rb
			continue
		}
		if a[0] != b[0] {
			return cmpInt(int(a[0]), int(b[0]))
		}
		a, b = a[1:], b[1:]
	}
	return cmpInt(len(a), len(b))
}

// nextVersion returns the version after the greatest all-digit version in
// versions: "1" when there is none.
func nextVersion(versions []string) string {
	best := uint64(0)
	for _, v := range versions {
		if n, err := strconv.ParseUint(v, 10, 63); err == nil && n > best {
			best = n
		}
	}
	return strconv.FormatUint(best+1, 10)
}

// latest returns the greatest version; versions is not empty.
func latest(versions []string) string {
	s := append([]string(nil), versions...)
	sort.Slice(s, func(i, j int) bool { return CompareVersions(s[i], s[j]) < 0 })
	return s[len(s)-1]
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func leadingRun(s string, f func(byte) bool) (run, rest string) {
	i := 0
	for i < len(s) && f(s[i]) {
		i++
	}
	return s[:i], s[i:]
}

func cmpInt(a, b int) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
