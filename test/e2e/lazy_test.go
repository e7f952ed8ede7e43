package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/lazy"
	"github.com/warrenhq/warren/internal/testutil"
)

// TestUpLazyLayers runs `warren up --lazy-layers`: node ls says the node
// loads layers on demand; sandboxes start from an environment whose
// layers were never downloaded whole, run a program from them, and the
// node fetched a part of the image, not all of it. Sandboxes keep reading
// their layers across a kill -9 of warren up (the layer server is a
// process of its own); when the layer server itself is killed, the agent
// reports the lost layer mounts, their sandboxes fail reads promptly and
// new sandboxes run; and the final stop leaves no server and no mount.
func TestUpLazyLayers(t *testing.T) {
	testutil.RequireContainers(t)
	var dataDir string
	t.Cleanup(func() { // after startUpWith's: whatever failed, no server is left running
		for _, pid := range lazyServers(filepath.Join(dataDir, "node", "lazy")) {
			t.Errorf("a layer server outlived the test: pid %d (killed)", pid)
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	c := startUpWith(t, "--no-fn", "--no-microvm", "--lazy-layers", "--chunk-cache", "1Gi")
	dataDir = c.DataDir
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

	// Up serves the node's layer metrics on its API's /metrics, beside
	// the apiserver's, with no token: per layer, adding up to the node's.
	resp, err := http.Get("http://" + c.Addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var fetched float64
	for _, m := range regexp.MustCompile(`(?m)^warren_layer_fetched_bytes_total\{layer="sha256:[0-9a-f]{64}"\} (.+)$`).FindAllStringSubmatch(string(body), -1) {
		v, _ := strconv.ParseFloat(m[1], 64)
		fetched += v
	}
	if resp.StatusCode != 200 || !strings.Contains(string(body), "warren_layer_cache_limit_bytes 1.073741824e+09\n") ||
		!strings.Contains(string(body), "warren_api_request_duration_seconds") || !strings.Contains(string(body), "warren_layer_fetch_duration_seconds_bucket{layer=") {
		t.Errorf("/metrics: %d, want the apiserver's and the node's layer metrics:\n%s", resp.StatusCode, body)
	}
	if fetched < float64(st.FetchedBytes) || fetched == 0 {
		t.Errorf("/metrics: the layers fetched %v bytes in all, node ls said %d before", fetched, st.FetchedBytes)
	}

	// The agent dies hard; its layer server, a process of its own, serves
	// on: the restarted agent goes on with it, and the sandboxes created
	// before read their layers still, including what is not in the page
	// cache.
	const readAll = "cat /usr/lib/python3.11/*.py | wc -c"
	dropCaches(t)
	want := c.MustRun("exec", sbs[0], "--", "sh", "-c", readAll)
	if n, _ := strconv.Atoi(strings.TrimSpace(want)); n < 1<<20 {
		t.Fatalf("%s in a sandbox: %q, want megabytes", readAll, want)
	}
	lazyDir := filepath.Join(c.DataDir, "node", "lazy")
	_, before, err := lazy.Dial(context.Background(), lazyDir)
	if err != nil {
		t.Fatalf("no layer server answers in %s: %v", lazyDir, err)
	}
	// Out of warren up's cgroup, so that a service manager stopping it
	// leaves the server running.
	nodeCgroup := "/warren/" + node().ID
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", before.Pid)); err != nil || !strings.Contains(string(b), nodeCgroup+"/lazyd\n") {
		t.Errorf("the layer server's cgroups: %q, %v; want %s/lazyd", b, err, nodeCgroup)
	}
	c.Kill9()
	c.StartWith()
	if !strings.Contains(c.Log.String(), "the layer server of an earlier agent is still serving") {
		t.Errorf("the restarted agent did not say it went on with the earlier layer server:\n%s", c.Log)
	}
	if _, after, err := lazy.Dial(context.Background(), lazyDir); err != nil || after.Pid != before.Pid {
		t.Errorf("the layer server after the agent's restart: %+v, %v; want the earlier one, pid %d", after, err, before.Pid)
	}
	dropCaches(t)
	for _, sb := range sbs {
		if out := c.MustRun("exec", sb, "--", "sh", "-c", readAll); out != want {
			t.Errorf("sandbox %s after the agent's restart: read %q bytes, %q before", sb, out, want)
		}
		c.MustRun("exec", sb, "--", "python3", "-c", "import email, http.server")
	}
	sb := strings.TrimSpace(c.MustRun("sandbox", "create", "--image", img))
	if out := c.MustRun("exec", sb, "--", "python3", "-c", "print('after a restart')"); out != "after a restart\n" {
		t.Errorf("python in a sandbox created after the agent's restart: %q", out)
	}

	// The layer server dies: the agent notices, says which layer mounts
	// and sandboxes it lost, and starts another. The old sandboxes fail
	// their uncached reads at once (EIO, no hang); new ones run.
	if err := syscall.Kill(before.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var next lazy.Info
	waitFor(t, "the agent to start another layer server", func() bool {
		_, info, err := lazy.Dial(context.Background(), lazyDir)
		next = info
		return err == nil && info.Pid != before.Pid
	})
	if log := c.Log.String(); !strings.Contains(log, "the layer server died") || !strings.Contains(log, "layer mounts on it are lost") || !strings.Contains(log, sbs[0]) {
		t.Errorf("the agent did not log the lost layer mounts and their sandboxes:\n%s", log)
	}
	problems := strings.Join(node().Problems, "\n")
	if !strings.Contains(problems, "layer server") || !strings.Contains(problems, "layer mounts lost") || !strings.Contains(problems, sbs[0]) {
		t.Errorf("node ls -o json problems after the layer server died: %q", problems)
	}
	t.Logf("node problems after the layer server died: %s", problems)
	dropCaches(t)
	start := time.Now()
	out, stderr, code := c.Run("exec", sbs[0], "--timeout", "30s", "--", "sh", "-c", "cat /usr/lib/python3.11/*.py >/dev/null")
	if took := time.Since(start); code == 0 || took > 20*time.Second {
		t.Errorf("an uncached read in a sandbox whose layer server died: exit %d after %v (%q %q); want a prompt failure", code, took, out, stderr)
	} else {
		t.Logf("an uncached read in a sandbox whose layer server died: exit %d after %v: %s", code, took.Round(time.Millisecond), strings.TrimSpace(stderr))
	}
	sb = strings.TrimSpace(c.MustRun("sandbox", "create", "--image", img))
	if out := c.MustRun("exec", sb, "--", "python3", "-c", "import email, http.server; print('after the layer server died')"); out != "after the layer server died\n" {
		t.Errorf("python in a sandbox created after the layer server died: %q", out)
	}
	if st := node().LayerCache; st == nil || st.LimitBytes != 1<<30 {
		t.Errorf("node ls layer cache from the new layer server (pid %d): %+v", next.Pid, st)
	}

	// Every sandbox gone, the agent's stop stops the layer server: no
	// process and no mount is left.
	c.MustRun("sandbox", "rm", "--all")
	c.Stop()
	if pids := lazyServers(lazyDir); len(pids) > 0 {
		t.Errorf("layer servers still running after warren up stopped with no sandbox: %v\n%s", pids, c.Log)
	}
	if mnts, err := image.MountsUnder(c.DataDir); err != nil || len(mnts) > 0 {
		t.Errorf("mounts left under the data dir: %v %v", mnts, err)
	}
	left, _ := filepath.Glob("/sys/fs/cgroup/*" + nodeCgroup + "/lazyd") // v1 and hybrid
	if _, err := os.Stat("/sys/fs/cgroup" + nodeCgroup + "/lazyd"); err == nil {
		left = append(left, "/sys/fs/cgroup"+nodeCgroup+"/lazyd") // unified
	}
	if len(left) > 0 {
		t.Errorf("the layer server's cgroups left: %v", left)
	}
}

// dropCaches drops the host's page cache: reads of a lazily loaded layer
// then go to its layer server.
func dropCaches(t *testing.T) {
	t.Helper()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
		t.Fatal(err)
	}
}

// lazyServers are the pids of the layer servers (`warren lazyd`) of dir.
func lazyServers(dir string) []int {
	var pids []int
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(b, []byte("\x00lazyd\x00")) || !bytes.Contains(b, []byte("\x00--dir\x00"+dir+"\x00")) {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}
