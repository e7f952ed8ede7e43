package e2e

import (
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/testutil"
)

// TestUpLazyLayers runs `warren up --lazy-layers`: node ls says the node
// loads layers on demand; sandboxes start from an environment whose
// layers were never downloaded whole, run a program from them, and the
// node fetched a part of the image, not all of it.
func TestUpLazyLayers(t *testing.T) {
	testutil.RequireContainers(t)
	c := startUpWith(t, "--no-fn", "--no-microvm", "--lazy-layers", "--chunk-cache", "1Gi")
	node := func() api.Node {
		var nodes api.NodeList
		mustJSON(t, c.MustRun("node", "ls", "-o", "json"), &nodes)
		return nodes.Nodes[0]
	}
	if n := node(); n.LayerLoading != api.LayersLazy || n.LayerCache == nil || n.LayerCache.LimitBytes != 1<<30 {
		t.Fatalf("node ls: layer loading %q, cache %+v; want lazy with a 1 GiB cache", n.LayerLoading, n.LayerCache)
	}
	if out := c.MustRun("node", "ls"); !strings.Contains(out, "LAYERS") || !strings.Contains(out, api.LayersLazy) {
		t.Errorf("node ls table does not say lazy:\n%s", out)
	}

	const img = "debian-python@12" // published by up from the runtime image cache
	waitFor(t, "up to publish "+img, func() bool {
		out, _, _ := c.Run("image", "ls")
		return strings.Contains(out, img)
	})
	var sbs []string
	for range 3 {
		out, stderr, code := c.Run("sandbox", "create", "--image", img)
		if code != 0 {
			t.Fatalf("sandbox create --image %s: exit %d: %s", img, code, stderr)
		}
		sbs = append(sbs, strings.TrimSpace(out))
	}
	for _, sb := range sbs {
		if out := c.MustRun("exec", sb, "--", "python3", "-c", "import json, sys; print(json.dumps(sys.version_info[:2]))"); out != "[3, 11]\n" {
			t.Errorf("python in a lazily loaded sandbox: %q", out)
		}
	}
	st := node().LayerCache
	var images api.ImageList
	mustJSON(t, c.MustRun("image", "ls", "-o", "json"), &images)
	var size int64
	for _, im := range images.Images {
		if im.Name == img {
			size = im.Size
		}
	}
	if size == 0 {
		t.Fatalf("image ls has no %s: %+v", img, images)
	}
	t.Logf("image %s: %d bytes; chunk cache: %+v", img, size, st)
	if st.FetchedBytes == 0 || st.FetchedBytes > size*3/4 {
		t.Errorf("fetched %d bytes of a %d-byte image for three sandboxes running python", st.FetchedBytes, size)
	}
	if st.Hits == 0 {
		t.Errorf("no chunk read from the cache: %+v", st)
	}

	// The agent dies hard, and its FUSE server with it: the next one
	// detaches the dead layer mounts, and new sandboxes start.
	c.Kill9()
	c.StartWith()
	if !strings.Contains(c.Log.String(), "layer mounts of the earlier agent's filesystem detached") {
		t.Errorf("the restarted agent did not report the dead layer mounts:\n%s", c.Log)
	}
	sb := strings.TrimSpace(c.MustRun("sandbox", "create", "--image", img))
	if out := c.MustRun("exec", sb, "--", "python3", "-c", "print('after a restart')"); out != "after a restart\n" {
		t.Errorf("python in a sandbox created after the agent's restart: %q", out)
	}
}
