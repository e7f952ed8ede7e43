package client

import (
	"archive/tar"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// LinkPolicy says what CopyFrom does with a symbolic link in the copied
// tree whose target lies outside it. A sandbox's owner controls every link
// in it: a link to /root/.warren/token or ../../.ssh, copied as it is,
// makes the next program that reads the copy (a grader, a user's editor)
// read the local machine's file instead.
type LinkPolicy int

const (
	// LinksSkip (the default) creates only the links that stay inside the
	// copied tree and reports the others to the OnSkippedLink callback.
	LinksSkip LinkPolicy = iota
	// LinksRefuse fails the copy at a link that leaves the tree (files
	// extracted before it stay).
	LinksRefuse
	// LinksKeep creates every link as it is in the sandbox.
	LinksKeep
)

// ParseLinkPolicy reads "skip", "refuse" or "keep".
func ParseLinkPolicy(s string) (LinkPolicy, error) {
	switch s {
	case "skip", "":
		return LinksSkip, nil
	case "refuse":
		return LinksRefuse, nil
	case "keep":
		return LinksKeep, nil
	}
	return 0, fmt.Errorf("link policy %q: want skip, refuse or keep", s)
}

// CopyOption changes how CopyFrom unpacks what it copies.
type CopyOption func(*copyOptions)

type copyOptions struct {
	links   LinkPolicy
	skipped func(name, target string)
}

// WithLinks sets the policy for symbolic links leaving the copied tree.
func WithLinks(p LinkPolicy) CopyOption { return func(o *copyOptions) { o.links = p } }

// OnSkippedLink calls fn for every link LinksSkip leaves out, with its
// path relative to the copy's destination and its target in the sandbox.
func OnSkippedLink(fn func(name, target string)) CopyOption {
	return func(o *copyOptions) { o.skipped = fn }
}

// errNotLink is linkSet.take's answer for an entry it leaves to extract.
var errNotLink = errors.New("not a link")

// maxLinkHops bounds how many links resolving one path may follow, as the
// kernel's 40 does: a loop is unsafe, not an endless walk.
const maxLinkHops = 40

// linkSet holds a copy's symbolic links until the rest of the archive is
// unpacked, then creates those its policy lets through. A link is judged
// against every other link in the archive, resolved component by
// component as the kernel would ("a/b/.." is not "a" when b is a link),
// so a chain of links that each look harmless cannot lead out either.
// Absolute targets inside the copied tree (remote, its path in the
// sandbox) are rewritten as relative ones, which mean the same in the
// copy; other absolute targets leave it.
type linkSet struct {
	opts   copyOptions
	remote string            // the copied tree's path in the sandbox
	links  map[string]string // name under the destination -> target (absolute ones rewritten when inside)
	orig   map[string]string // name -> target as the sandbox had it, for reports
}

func newLinkSet(opts copyOptions, remote string) *linkSet {
	return &linkSet{opts: opts, remote: remote, links: map[string]string{}, orig: map[string]string{}}
}

// take records hdr if it is a symbolic link (or a hard link to one),
// refuses an entry under a recorded link's name, and answers errNotLink
// for anything else.
func (l *linkSet) take(hdr *tar.Header, name string, mapName func(string) (string, error)) error {
	if l.opts.links == LinksKeep {
		return errNotLink
	}
	for d := path.Dir(name); d != "." && d != "/"; d = path.Dir(d) {
		if _, ok := l.links[d]; ok {
			return refuse(hdr.Name, "under the symbolic link %s", d)
		}
	}
	target := hdr.Linkname
	switch hdr.Typeflag {
	case tar.TypeSymlink:
		if target == "" {
			return refuse(hdr.Name, "empty link target")
		}
	case tar.TypeLink: // a hard link to a link is that link again
		_, old, err := entryName(hdr.Linkname, mapName)
		if err != nil {
			return err
		}
		if _, ok := l.links[old]; !ok {
			return errNotLink
		}
		target = l.orig[old]
	default:
		if _, ok := l.links[name]; ok { // a later entry replaces the link
			delete(l.links, name)
			delete(l.orig, name)
		}
		return errNotLink
	}
	if name == "." {
		return refuse(hdr.Name, "a symbolic link at the top")
	}
	l.orig[name] = target
	l.links[name] = l.rewrite(name, target)
	return nil
}

// rewrite turns an absolute target inside the copied tree into the
// relative one that names the same file from name's directory; other
// targets come back as they are.
func (l *linkSet) rewrite(name, target string) string {
	if !path.IsAbs(target) {
		return target
	}
	t := path.Clean(target)
	var inTree string
	switch {
	case l.remote == "/":
		inTree = strings.TrimPrefix(t, "/")
	case t == l.remote:
		inTree = ""
	case strings.HasPrefix(t, l.remote+"/"):
		inTree = strings.TrimPrefix(t, l.remote+"/")
	default:
		return target
	}
	if inTree == "" {
		inTree = "."
	}
	rel, err := filepath.Rel("/"+path.Dir(name), "/"+inTree)
	if err != nil {
		return target
	}
	return filepath.ToSlash(rel)
}

// inside reports whether following the link at name never leaves the
// tree.
func (l *linkSet) inside(name string) bool {
	hops := 0
	var walk func(comps []string) bool
	walk = func(comps []string) bool {
		cur := "."
		for len(comps) > 0 {
			c := comps[0]
			comps = comps[1:]
			switch c {
			case "", ".":
				continue
			case "..":
				if cur == "." {
					return false
				}
				cur = path.Dir(cur)
				continue
			}
			next := path.Join(cur, c)
			t, ok := l.links[next]
			if !ok {
				cur = next
				continue
			}
			if hops++; hops > maxLinkHops || path.IsAbs(t) {
				return false
			}
			// Resolve the target from the link's directory (cur, already
			// free of links), then go on with what is left.
			comps = append(append(splitPath(cur), splitPath(t)...), comps...)
			cur = "."
		}
		return true
	}
	t := l.links[name]
	if path.IsAbs(t) { // rewrite kept it: outside
		return false
	}
	return walk(append(splitPath(path.Dir(name)), splitPath(t)...))
}

func splitPath(p string) []string {
	if p == "." || p == "" {
		return nil
	}
	return strings.Split(p, "/")
}

// finish creates the recorded links the policy allows, in name order.
func (l *linkSet) finish(root *os.Root) error {
	names := make([]string, 0, len(l.links))
	for n := range l.links {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if !l.inside(n) {
			if l.opts.links == LinksRefuse {
				return refuse(n, "symbolic link to %s leads out of the copied tree", l.orig[n])
			}
			if l.opts.skipped != nil {
				l.opts.skipped(n, l.orig[n])
			}
			continue
		}
		if err := prepareLeaf(root, n, n); err != nil {
			return err
		}
		if err := root.Symlink(l.links[n], n); err != nil {
			return fmt.Errorf("entry %q: %w", n, err)
		}
	}
	return nil
}
