package container

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/image"
)

// TestSnapshot: what a sandbox wrote survives the round trip through a
// snapshot into a layer a new sandbox stacks on the same base, with
// overlay semantics intact: deletions of lower files (whiteouts), a
// directory replaced whole (opaque), owners, modes, hard links, symlinks,
// fifos and sparse files; stripped paths are gone from it, whether the
// sandbox wrote them or a lower layer has them; the source runs on,
// untouched, and what it writes later is not in the snapshot.
func TestSnapshot(t *testing.T) {
	h := newHarness(t)
	testSnapshotRoundTrip(t, h, "copy", "reflink")
}

// TestDiskSnapshot is TestSnapshot for a sandbox with a disk limit on
// btrfs, whose writable layer is a subvolume: the copy is a snapshot of
// it.
func TestDiskSnapshot(t *testing.T) {
	h, _ := newBtrfsHarness(t)
	testSnapshotRoundTrip(t, h, "btrfs-snapshot")
}

func testSnapshotRoundTrip(t *testing.T, h *harness, methods ...string) {
	ctx := context.Background()
	src := h.spec("snap-src")
	src.Resources.Disk = 256 << 20 // a subvolume of its own on btrfs; ignored elsewhere
	if h.c.DiskQuota().Mechanism == "none" {
		src.Resources.Disk = 0
	}
	h.start(src)
	hostBoot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	a := strings.Fields(ident(h, "snap-src"))
	h.sh("snap-src", `set -e
mkdir -p /work/sub
echo hello > /work/a && ln /work/a /work/b && ln -s a /work/c
chown 1000:1000 /work/a && chmod 4755 /work/a
dd if=/dev/zero of=/work/sparse bs=1 count=0 seek=64M 2>/dev/null && echo tail >> /work/sparse
mkfifo /work/fifo
rm /bin/vi /etc/group
rm -rf /usr && mkdir -p /usr/local && echo new > /usr/local/only
mkdir -p /root/.cache && echo junk > /root/.cache/x && echo secret > /answers
(while :; do echo x >> /work/log; done) > /dev/null 2>&1 &`)

	snap, err := h.c.Snapshot(ctx, "snap-src", backend.SnapshotRequest{Strip: []string{"/root/.cache", "/answers", "/bin/ls"}})
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Remove()
	if snap.Freeze <= 0 || !slices.Contains(methods, snap.Method) {
		t.Errorf("snapshot: freeze %v, method %q; want one of %v", snap.Freeze, snap.Method, methods)
	}
	t.Logf("freeze %v (%s)", snap.Freeze, snap.Method)
	// The writer runs on: the sandbox was thawed.
	before := h.sh("snap-src", "wc -c < /work/log")
	time.Sleep(200 * time.Millisecond)
	if after := h.sh("snap-src", "wc -c < /work/log; echo later > /work/later; ls /root/.cache/x /bin/ls"); strings.HasPrefix(after, before+"\n") {
		t.Errorf("the source's writer stopped after the snapshot: %s bytes, then %q", before, after)
	}

	dst := h.spec("snap-dst")
	dst.Layers = append(dst.Layers, layerOf(t, snap.Upper))
	h.start(dst)
	got := h.sh("snap-dst", `
cat /work/a; stat -c '%u:%g %a %h' /work/a
[ "$(stat -c %i /work/a)" = "$(stat -c %i /work/b)" ] && echo linked
readlink /work/c
stat -c %s /work/sparse; tail -c 5 /work/sparse
[ -p /work/fifo ] && echo fifo
cat /usr/local/only
for p in /bin/vi /etc/group /usr/bin/env /root/.cache /answers /bin/ls /work/later; do [ -e $p ] || [ -L $p ] || echo "no $p"; done
[ -d /root ] && echo root-dir`)
	want := "hello\n1000:1000 4755 2\nlinked\na\n67108869\ntail\nfifo\nnew\n" +
		"no /bin/vi\nno /etc/group\nno /usr/bin/env\nno /root/.cache\nno /answers\nno /bin/ls\nno /work/later\nroot-dir"
	if got != want {
		t.Errorf("the sandbox from the snapshot sees:\n%s\nwant:\n%s", got, want)
	}
	// A machine of its own: machine id and boot id differ from the
	// source's (whose /etc/machine-id is in the snapshot) and the host's;
	// its boot id stays.
	b := strings.Fields(ident(h, "snap-dst"))
	if len(a) != 2 || len(b) != 2 || a[0] == b[0] || a[1] == b[1] || len(a[0]) != 32 || a[1] == strings.TrimSpace(string(hostBoot)) {
		t.Errorf("identities: source %q, from its snapshot %q, host boot id %q", a, b, hostBoot)
	}
	// The layer keeps the sparse file sparse: its data, not its size.
	if fi, err := os.Stat(dst.Layers[1].Path); err != nil || fi.Size() > 4<<20 {
		t.Errorf("diff layer: %v, %v (want well under the 64 MiB file)", fi, err)
	}
}

// TestSnapshotRefusals: what a snapshot refuses leaves the sandbox running
// untouched, and nothing outside it is touched, whatever the sandbox
// planted (a symlink where a strip path goes).
func TestSnapshotRefusals(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	h.start(h.spec("snap-bad"))
	target := t.TempDir()
	if err := os.WriteFile(filepath.Join(target, "keep"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	// /root is the agent's symlink to a host path (and to / inside).
	h.sh("snap-bad", "rm -rf /root && ln -s "+target+" /root && mkdir -p /work && echo 1 > /work/x")
	for _, strip := range [][]string{{"relative"}, {"/"}, {"/root/keep"}} {
		_, err := h.c.Snapshot(ctx, "snap-bad", backend.SnapshotRequest{Strip: strip})
		if !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("strip %q: %v, want ErrInvalid", strip, err)
		}
	}
	if _, err := os.Stat(filepath.Join(target, "keep")); err != nil {
		t.Errorf("a strip through the sandbox's symlink reached the host: %v", err)
	}
	if got := h.sh("snap-bad", "cat /work/x"); got != "1" {
		t.Errorf("the sandbox after refused snapshots: %q", got)
	}
	if _, err := h.c.Snapshot(ctx, "nope", backend.SnapshotRequest{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("snapshot of an unknown sandbox: %v", err)
	}
	// Nothing was left behind in the sandbox's directory.
	entries, _ := filepath.Glob(filepath.Join(h.c.dir("snap-bad"), "snapshot-*"))
	if len(entries) > 0 {
		t.Errorf("refused snapshots left %v", entries)
	}
}

// ident is a sandbox's machine id and boot id, and "writable" if its boot
// id can be written.
func ident(h *harness, id string) string {
	return h.sh(id, "cat /etc/machine-id /proc/sys/kernel/random/boot_id; (echo x > /proc/sys/kernel/random/boot_id) 2>/dev/null && echo writable; true")
}

// layerOf builds dir into an EROFS layer file, as a node packs a snapshot.
func layerOf(t *testing.T, dir string) backend.Layer {
	t.Helper()
	file := filepath.Join(t.TempDir(), "diff.erofs")
	if err := image.BuildEROFS(context.Background(), dir, file, image.WithSparse()); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sum := sha256.New()
	if _, err := io.Copy(sum, f); err != nil {
		t.Fatal(err)
	}
	return backend.Layer{Digest: "sha256:" + hex.EncodeToString(sum.Sum(nil)), Path: file}
}
