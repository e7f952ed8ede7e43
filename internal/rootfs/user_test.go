package rootfs

import (
	"os"
	"path/filepath"
	"testing"
)

const passwd = `root:x:0:0:root:/root:/bin/sh
daemon:x:1:1::/:/bin/false
# a comment
alice:x:1000:1001:Alice:/home/alice:/bin/sh
`

const group = `root:x:0:
staff:x:50:alice,daemon
alicegrp:x:1001:
`

func TestLookupUser(t *testing.T) {
	s := newSandbox(t)
	s.mk(t, "etc/passwd="+passwd, "etc/group="+group)
	empty := newSandbox(t)
	hostileRoot := newSandbox(t)
	must(t, os.WriteFile(filepath.Join(hostileRoot.outside, "passwd"), []byte("evil:x:666:666::/:/bin/sh\n"), 0o644))
	hostileRoot.mk(t, "etc/passwd -> $OUT/passwd")

	tests := []struct {
		root     string
		user     string
		uid, gid uint32
		err      error
	}{
		{s.root, "", 0, 0, nil},
		{s.root, "root", 0, 0, nil},
		{s.root, "alice", 1000, 1001, nil},
		{s.root, "1000", 1000, 1001, nil},
		{s.root, "4242", 4242, 4242, nil},
		{s.root, "4242:7", 4242, 7, nil},
		{s.root, "alice:staff", 1000, 50, nil},
		{s.root, "alice:5", 1000, 5, nil},
		{s.root, "1000:staff", 1000, 50, nil},
		{s.root, "daemon:alicegrp", 1, 1001, nil},
		{s.root, "bob", 0, 0, invalidK},
		{s.root, "alice:nogroup", 0, 0, invalidK},
		{s.root, ":5", 0, 0, invalidK},
		{s.root, "alice:", 0, 0, invalidK},
		{s.root, "4294967295", 0, 0, invalidK}, // (uid_t)-1 is not a uid, nor a known name
		{empty.root, "1000", 1000, 1000, nil},
		{empty.root, "1000:1000", 1000, 1000, nil},
		{empty.root, "alice", 0, 0, invalidK},
		{hostileRoot.root, "evil", 0, 0, invalidK}, // the host file is never read
	}
	for _, tt := range tests {
		t.Run(tt.user, func(t *testing.T) {
			uid, gid, err := LookupUser(tt.root, tt.user)
			checkKind(t, err, tt.err)
			if uid != tt.uid || gid != tt.gid {
				t.Errorf("LookupUser(%q) = %d:%d, want %d:%d", tt.user, uid, gid, tt.uid, tt.gid)
			}
		})
	}
}
