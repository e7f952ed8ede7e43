package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/daemon"
	"github.com/warrenhq/warren/internal/testutil"
)

// TestUpLazyLayerShared: 50 sandboxes from one lazily loaded layer, all
// reading it at once, each see the image's bytes (a digest of python's
// standard library, as the host's copy of the image has it), and the node
// fetched each piece of it once at most: never more than the image, and
// here well under half of it.
func TestUpLazyLayerShared(t *testing.T) {
	testutil.RequireContainers(t)
	const n = 50
	const img = "debian-python@12"
	src := filepath.Join(daemon.DefaultImageCache, "debian-python-12")
	want := stdlibDigest(t, filepath.Join(src, "usr/lib/python3.11"))

	c := startUpWith(t, "--no-fn", "--no-microvm", "--lazy-layers")
	waitFor(t, "up to publish "+img, func() bool {
		out, _, _ := c.Run("image", "ls")
		return strings.Contains(out, img)
	})
	out, stderr, code := c.Run("sandbox", "create", "--image", img, "--count", "50", "--memory", "128Mi", "--cpu", "0.05")
	if code != 0 {
		t.Fatalf("sandbox create --count %d: exit %d: %s", n, code, stderr)
	}
	ids := strings.Fields(out)
	if len(ids) != n {
		t.Fatalf("sandbox create --count %d made %d: %q", n, len(ids), out)
	}
	const script = `import glob, hashlib
h = hashlib.sha256()
for p in sorted(glob.glob('/usr/lib/python3.11/*.py')):
    h.update(p.encode() + b'\0' + open(p, 'rb').read())
print(h.hexdigest())`
	var wg sync.WaitGroup
	sem := make(chan struct{}, 25)
	got := make([]string, n)
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			out, stderr, code := c.Run("exec", id, "--", "python3", "-c", script)
			got[i] = strings.TrimSpace(out)
			if code != 0 {
				got[i] = "exit " + stderr
			}
		}()
	}
	wg.Wait()
	for i, g := range got {
		if g != want {
			t.Errorf("sandbox %s read python's library as %q, want %s", ids[i], g, want)
		}
	}
	var nodes api.NodeList
	mustJSON(t, c.MustRun("node", "ls", "-o", "json"), &nodes)
	st := nodes.Nodes[0].LayerCache
	var images api.ImageList
	mustJSON(t, c.MustRun("image", "ls", "-o", "json"), &images)
	var size int64
	for _, im := range images.Images {
		if im.Name == img {
			size = im.Size
		}
	}
	t.Logf("%d sandboxes; image %d bytes; chunk cache %+v", n, size, st)
	if st == nil || size == 0 || st.FetchedBytes == 0 || st.FetchedBytes > size {
		t.Fatalf("fetched %+v of a %d-byte image for %d sandboxes: want each piece once at most", st, size, n)
	}
	// The layer is mounted once for all of them: the second reader of a
	// page finds it in the page cache, and only python's library and
	// startup are fetched, not the image.
	if st.FetchedBytes > size/2 {
		t.Errorf("fetched %d bytes of a %d-byte image: python's library is a fraction of it", st.FetchedBytes, size)
	}
}

// stdlibDigest is what the script above prints for the tree at dir.
func stdlibDigest(t *testing.T, dir string) string {
	t.Helper()
	ps, err := filepath.Glob(filepath.Join(dir, "*.py"))
	if err != nil || len(ps) == 0 {
		testutil.Unavailable(t, "no python library in %s (scripts/build-runtime-images): %v", dir, err)
	}
	sort.Strings(ps)
	h := sha256.New()
	for _, p := range ps {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		h.Write([]byte("/usr/lib/python3.11/" + filepath.Base(p) + "\x00"))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))
}
