package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/testutil"
)

// TestUpLazyPrefetch runs `warren up --lazy-layers` with a short trace
// window: a first sandbox runs python; the node reports the trace of
// its layers' first reads and up keeps it with the layer (`layer get`);
// after a restart with an empty chunk cache, a new sandbox's layer is
// prefetched from that trace in the background, and python runs.
func TestUpLazyPrefetch(t *testing.T) {
	testutil.RequireContainers(t)
	var dataDir string
	t.Cleanup(func() {
		for _, pid := range lazyServers(filepath.Join(dataDir, "node", "lazy")) {
			t.Errorf("a layer server outlived the test: pid %d (killed)", pid)
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	c := startUpWith(t, "--no-fn", "--no-microvm", "--lazy-layers", "--chunk-cache", "1Gi", "--lazy-trace-window", "5s")
	dataDir = c.DataDir
	node := func() api.Node {
		var nodes api.NodeList
		mustJSON(t, c.MustRun("node", "ls", "-o", "json"), &nodes)
		return nodes.Nodes[0]
	}
	const img = "debian-python@12" // published by up from the runtime image cache
	waitFor(t, "up to publish "+img, func() bool {
		out, _, _ := c.Run("image", "ls")
		return strings.Contains(out, img)
	})
	var images api.ImageList
	mustJSON(t, c.MustRun("image", "ls", "-o", "json"), &images)
	var layers []string
	for _, im := range images.Images {
		if im.Name == img {
			layers = im.Layers
		}
	}
	if len(layers) == 0 {
		t.Fatalf("image ls has no %s: %+v", img, images)
	}
	const script = "import json, email, http.server; print(json.dumps('ok'))"
	sb := strings.TrimSpace(c.MustRun("sandbox", "create", "--image", img))
	if out := c.MustRun("exec", sb, "--", "python3", "-c", script); out != "\"ok\"\n" {
		t.Fatalf("python in a lazily loaded sandbox: %q", out)
	}
	if n := node(); !n.LayerPrefetch || n.LayerCache == nil || n.LayerCache.PrefetchedBytes != 0 {
		t.Errorf("node before any trace: layer_prefetch %v, cache %+v; want true and nothing prefetched", n.LayerPrefetch, n.LayerCache)
	}

	// The window closes 5 s after the first read; the agent collects
	// the trace, stores it, lists it and records it with the layer.
	traced := map[string]string{} // layer digest -> trace
	waitFor(t, "the node to report a prefetch trace of the image's layers", func() bool {
		for _, tr := range node().PrefetchTraces {
			traced[tr.Layer] = tr.Trace
		}
		for _, d := range layers {
			if traced[d] != "" {
				return true
			}
		}
		return false
	})
	var ls api.LayerList
	waitFor(t, "layer ls to show the trace", func() bool {
		mustJSON(t, c.MustRun("layer", "ls", "-o", "json"), &ls)
		for _, l := range ls.Layers {
			if traced[l.Digest] != "" && l.PrefetchTrace == traced[l.Digest] {
				return true
			}
		}
		return false
	})
	for _, l := range ls.Layers {
		if traced[l.Digest] != "" && l.PrefetchTrace == traced[l.Digest] {
			if out := c.MustRun("layer", "get", l.Ref); !strings.Contains(out, "Prefetch trace:") || !strings.Contains(out, l.PrefetchTrace) {
				t.Errorf("layer get %s does not show its trace %s:\n%s", l.Ref, l.PrefetchTrace, out)
			}
		}
	}

	t.Logf("before the restart: %+v", node().LayerCache)

	// A restart with an empty chunk cache: the new sandbox's layers are
	// prefetched from their traces.
	c.MustRun("sandbox", "rm", "--all")
	c.Stop()
	if pids := lazyServers(filepath.Join(c.DataDir, "node", "lazy")); len(pids) > 0 {
		t.Fatalf("layer servers %v serve on with no sandbox", pids)
	}
	chunks := filepath.Join(c.DataDir, "node", "lazy", "chunks")
	if err := os.RemoveAll(chunks); err != nil {
		t.Fatal(err)
	}
	c.Start()
	sb = strings.TrimSpace(c.MustRun("sandbox", "create", "--image", img))
	if out := c.MustRun("exec", sb, "--", "python3", "-c", script); out != "\"ok\"\n" {
		t.Fatalf("python in a sandbox whose layers were prefetched: %q", out)
	}
	var st *api.LayerCacheStats
	waitFor(t, "the trace's chunks to be prefetched", func() bool {
		st = node().LayerCache
		return st != nil && st.PrefetchedBytes > 0
	})
	t.Logf("after the restart: %+v", st)
	if st.PrefetchedBytes > st.FetchedBytes {
		t.Errorf("prefetched %d bytes of the %d fetched", st.PrefetchedBytes, st.FetchedBytes)
	}
	if b, _ := os.ReadFile(filepath.Join(c.DataDir, "node", "lazy", "server.log")); !strings.Contains(string(b), "prefetch trace replayed") {
		t.Errorf("the layer server's log does not say it replayed a trace:\n%s", b)
	}
}
