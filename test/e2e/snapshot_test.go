package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/testutil"
)

// Snapshots through the CLI and `warren up`: an agent's sandbox becomes a
// versioned environment others start from; the source runs on; a taken
// name@version is refused before anything is packed; lineage reaches the
// snapshot of a snapshot; a bad request loses nothing.
func TestUpSnapshot(t *testing.T) {
	testutil.RequireContainers(t)
	testutil.RequireBinary(t, "go")
	c := startUp(t)

	src := strings.TrimSpace(c.MustRun("sandbox", "create", "--image", "busybox", "--env", "STAGE=build"))
	// A build plants an answer (declared: --strip) and leaves residue a
	// snapshot strips by itself: a shell history with the answer typed
	// in, a cache, temp files.
	const answer = "ANSWER-5f1c9e02d7"
	c.MustRun("exec", src, "--sh", "mkdir -p /work /root/.cache/pip && echo built-artifact > /work/artifact && echo "+answer+" > /work/answers && "+
		"echo 'echo "+answer+"' > /root/.ash_history && echo "+answer+" > /root/.cache/pip/x && echo "+answer+" > /tmp/scratch")
	var snap api.Snapshot
	mustJSON(t, c.MustRun("sandbox", "snapshot", src, "--name", "task-7", "--version", "1",
		"--strip", "/work/answers", "--label", "step=3", "-o", "json"), &snap)
	if snap.Ref != "task-7@1" || snap.Source != src || snap.SourceImage != "busybox@1" || snap.Labels["step"] != "3" ||
		snap.Stats.Method == "" || snap.Stats.FreezeMS <= 0 || snap.Layer.Kind != api.LayerDiff {
		t.Errorf("snapshot: %+v", snap)
	}
	if got := strings.Join(snap.Stats.Residue, " "); got != "/root/.ash_history /root/.cache /tmp/scratch" {
		t.Errorf("residue left out: %q", got)
	}

	// The source runs on, untouched by the strip.
	if out := c.MustRun("exec", src, "--sh", "cat /work/answers /root/.ash_history /tmp/scratch; echo more > /work/later"); out != answer+"\necho "+answer+"\n"+answer+"\n" {
		t.Errorf("the source after its snapshot: %q", out)
	}
	// A sandbox from the snapshot: the build's files and env, not the
	// stripped ones, not what the source wrote after; /tmp is still
	// there, as it was.
	b := strings.TrimSpace(c.MustRun("sandbox", "create", "--image", "task-7@1"))
	out := c.MustRun("exec", b, "--sh", "cat /work/artifact; echo $STAGE; ls /work/answers /root/.ash_history /root/.cache /tmp/scratch /work/later 2>&1 | wc -l; stat -c %a /tmp")
	if out != "built-artifact\nbuild\n5\n1777\n" {
		t.Errorf("a sandbox from task-7@1 sees %q", out)
	}
	// Nor is the answer anywhere in the layers' bytes: the blob store
	// and the node's layer cache (where the artifact is, so the search
	// would find it).
	for _, dir := range []string{filepath.Join(c.DataDir, "blobs"), filepath.Join(c.DataDir, "node", "cache")} {
		if hits := grepTree(t, dir, answer); len(hits) > 0 {
			t.Errorf("the planted answer is in the layers' bytes: %v", hits)
		}
		if hits := grepTree(t, dir, "built-artifact"); len(hits) == 0 {
			t.Errorf("the build's artifact is not in %s: the search for the answer proves nothing", dir)
		}
	}

	// A snapshot of that sandbox: its parent is the first.
	c.MustRun("exec", b, "--sh", "echo step2 > /work/step2")
	var snap2 api.Snapshot
	mustJSON(t, c.MustRun("sandbox", "snapshot", b, "--name", "task-7", "-o", "json"), &snap2)
	if snap2.Ref != "task-7@2" || snap2.Parent != snap.ID {
		t.Errorf("snapshot of a snapshot's sandbox: ref %s parent %q, want task-7@2 with parent %s", snap2.Ref, snap2.Parent, snap.ID)
	}
	c2 := strings.TrimSpace(c.MustRun("sandbox", "create", "--image", "task-7@2"))
	if out := c.MustRun("exec", c2, "--sh", "cat /work/artifact /work/step2"); out != "built-artifact\nstep2\n" {
		t.Errorf("a sandbox from task-7@2 sees %q", out)
	}

	// Listing and lookup by id and by name@version.
	var list api.SnapshotList
	mustJSON(t, c.MustRun("snapshot", "ls", "--source", src, "-o", "json"), &list)
	if len(list.Snapshots) != 1 || list.Snapshots[0].ID != snap.ID {
		t.Errorf("snapshot ls --source %s: %+v", src, list.Snapshots)
	}
	for _, ref := range []string{snap.ID, "task-7@1"} {
		var got api.Snapshot
		mustJSON(t, c.MustRun("snapshot", "get", ref, "-o", "json"), &got)
		if got.ID != snap.ID {
			t.Errorf("snapshot get %s: %s", ref, got.ID)
		}
	}

	// Lineage: from a snapshot down, and from a sandbox up.
	var lin api.Lineage
	mustJSON(t, c.MustRun("snapshot", "lineage", snap.ID, "-o", "json"), &lin)
	if lin.Root.Snapshot == nil || lin.Root.Snapshot.ID != snap.ID || lin.Base != "busybox@1" || !hasChild(lin.Root, b, snap2.ID) {
		t.Errorf("lineage of %s: %+v; want sandbox %s under it, and %s under that", snap.ID, lin, b, snap2.ID)
	}
	mustJSON(t, c.MustRun("snapshot", "lineage", c2, "-o", "json"), &lin)
	if len(lin.Ancestors) != 2 || lin.Ancestors[0].ID != snap.ID || lin.Ancestors[1].ID != snap2.ID || lin.Root.Sandbox == nil {
		t.Errorf("lineage of sandbox %s: %+v; want ancestors %s, %s", c2, lin, snap.ID, snap2.ID)
	}
	if out := c.MustRun("snapshot", "lineage", c2); !strings.Contains(out, "busybox@1") || !strings.Contains(out, c2) {
		t.Errorf("lineage tree:\n%s", out)
	}

	// The Python SDK's calls: snapshot, fork (the branches, isolated from
	// each other), listing and lookup.
	if _, err := exec.LookPath("python3"); err == nil {
		py := `
import os, sys
from warren import Client
c = Client()
src = sys.argv[1]
snap = c.snapshot(src, "py-snap", "1", strip=["/work/answers"], labels={"via": "python"})
assert snap["ref"] == "py-snap@1" and snap["labels"] == {"via": "python"}, snap
kids = c.fork(src, 2, labels={"branch": "py"})
assert len(kids) == 2, kids
c.exec(kids[0]["id"], cmd="echo mine > /work/branch")
r = c.exec(kids[1]["id"], cmd="cat /work/artifact; cat /work/branch 2>/dev/null || echo isolated")
assert r.stdout == b"built-artifact\nisolated\n", r.stdout
assert any(s["id"] == snap["id"] for s in c.list_snapshots(source=src))
assert c.get_snapshot("py-snap@1")["id"] == snap["id"]
lin = c.lineage(kids[0]["id"])
assert lin["ancestors"][-1]["id"] == kids[0]["labels"]["warren.dev/snapshot"], lin
c.delete_snapshot("py-snap@1")
print("ok")
`
		sdk, _ := filepath.Abs(filepath.Join("..", "..", "sdk", "python")) // tests run in test/e2e
		cmd := exec.Command("python3", "-c", py, src)
		cmd.Env = append(os.Environ(), "PYTHONPATH="+sdk,
			"WARREN_ADDR=http://"+c.Addr, "WARREN_TOKEN="+c.Token(), "PYTHONDONTWRITEBYTECODE=1")
		if out, err := cmd.CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "ok" {
			t.Errorf("the Python SDK: %v\n%s", err, out)
		}
	} else if testutil.Strict() {
		t.Error("python3 missing: the Python SDK's snapshot calls went untested")
	}

	// Refusals: each a clear 4xx, the source running on.
	for _, tc := range []struct {
		args []string
		code string
	}{
		{[]string{"sandbox", "snapshot", src, "--name", "task-7", "--version", "1"}, "env_exists"},
		{[]string{"sandbox", "snapshot", src, "--strip", "relative/path"}, "invalid_argument"},
		{[]string{"sandbox", "snapshot", src, "--name", "Bad Name!"}, "invalid_name"},
		{[]string{"sandbox", "snapshot", "nope-123", "--name", "x"}, "sandbox_not_found"},
		{[]string{"snapshot", "get", "snap-0000000000000000"}, "snapshot_not_found"},
	} {
		if _, stderr, code := c.Run(tc.args...); code == 0 || !strings.Contains(stderr, tc.code) {
			t.Errorf("%v: exit %d, %q; want %s", tc.args, code, stderr, tc.code)
		}
	}
	// Processes: no node snapshots them (CRIU); each says why, in the
	// refusal and in node ls.
	for _, args := range [][]string{{"sandbox", "snapshot", src, "--with-processes"}, {"sandbox", "fork", src, "--with-processes"}} {
		if _, stderr, code := c.Run(args...); code == 0 || !strings.Contains(stderr, api.CodeProcessSnapshotUnavailable) || !strings.Contains(stderr, "criu") {
			t.Errorf("%v: exit %d, %q; want %s, saying why", args, code, stderr, api.CodeProcessSnapshotUnavailable)
		}
	}
	var nodes api.NodeList
	mustJSON(t, c.MustRun("node", "ls", "-o", "json"), &nodes)
	if len(nodes.Nodes) != 1 || nodes.Nodes[0].Snapshots == nil || !slices.Equal(nodes.Nodes[0].Snapshots.Kinds, []string{"filesystem"}) ||
		!strings.Contains(nodes.Nodes[0].Snapshots.ProcessesUnavailable, "criu") {
		t.Errorf("node ls: snapshots %+v", nodes.Nodes[0].Snapshots)
	}
	if out := c.MustRun("exec", src, "--sh", "cat /work/artifact"); out != "built-artifact\n" {
		t.Errorf("the source after refused snapshots: %q", out)
	}

	// Publishing: a builder's snapshot is invisible to runners until
	// published, and published only if its check passes; runners never
	// read a check's output. A runner's fork is its own.
	runner := strings.TrimSpace(c.MustRun("token", "create", "--role", "runner", "--name", "runner-1"))
	as := func(args ...string) (string, string, int) {
		return c.Run(append([]string{"--token", runner}, args...)...)
	}
	for _, tc := range [][]string{{"sandbox", "create", "--image", "task-7@1"}, {"env", "get", "task-7@1"}, {"snapshot", "get", "task-7@1"}} {
		if _, stderr, code := as(tc...); code == 0 || !strings.Contains(stderr, "not_found") {
			t.Errorf("a runner's %v of an unpublished snapshot: exit %d, %q", tc, code, stderr)
		}
	}
	if _, stderr, code := c.Run("env", "publish", "task-7@1", "--check", "cat /work/artifact; echo nope >&2; exit 3"); code == 0 || !strings.Contains(stderr, "check_failed") {
		t.Errorf("publish with a failing check: exit %d, %q", code, stderr)
	}
	if out := c.MustRun("env", "get", "task-7@1"); !strings.Contains(out, "FAILED (exit 3)") || !strings.Contains(out, "nope") ||
		!strings.Contains(out, "Published:") {
		t.Errorf("env get after a failed check:\n%s", out)
	}
	if _, _, code := as("sandbox", "create", "--image", "task-7@1"); code == 0 {
		t.Error("a runner created from an environment whose check failed")
	}
	c.MustRun("env", "publish", "task-7@1", "--check", "test -f /work/artifact")
	r, stderr, code := as("sandbox", "create", "--image", "task-7@1")
	if code != 0 {
		t.Fatalf("a runner's create from the published task-7@1: exit %d, %q", code, stderr)
	}
	rsb := strings.TrimSpace(r)
	if out, _, _ := as("env", "get", "task-7@1", "-o", "json"); strings.Contains(out, `"check"`) || strings.Contains(out, "unpublished") {
		t.Errorf("a runner reads the check of a published environment: %s", out)
	}
	if out, stderr, code := as("sandbox", "fork", rsb, "--count", "2"); code != 0 || len(strings.Fields(out)) != 2 {
		t.Errorf("a runner's fork: exit %d, %q, %q", code, out, stderr)
	}
	c.MustRun("sandbox", "rm", "--all", "--label", api.LabelForkOf+"="+rsb)
	c.MustRun("sandbox", "rm", rsb)

	// Removal: refused while built on, unless forced; the forced one's
	// sandbox runs on.
	if _, stderr, code := c.Run("snapshot", "rm", "task-7@2"); code == 0 || !strings.Contains(stderr, "snapshot_in_use") {
		t.Errorf("rm of a snapshot a live sandbox uses: exit %d, %q", code, stderr)
	}
	c.MustRun("sandbox", "rm", c2)
	c.MustRun("snapshot", "rm", "task-7@2")
	if _, stderr, code := c.Run("env", "get", "task-7@2"); code == 0 || !strings.Contains(stderr, "env_not_found") {
		t.Errorf("the environment of a removed snapshot: exit %d, %q", code, stderr)
	}
	c.MustRun("snapshot", "rm", "--force", "task-7@1")
	if out := c.MustRun("exec", b, "--sh", "cat /work/artifact"); out != "built-artifact\n" {
		t.Errorf("a sandbox of a force-removed snapshot: %q", out)
	}
}

// hasChild says whether n has a sandbox child id with a snapshot child
// snap.
func hasChild(n api.LineageNode, id, snap string) bool {
	for _, c := range n.Children {
		if c.Sandbox != nil && c.Sandbox.ID == id {
			for _, g := range c.Children {
				if g.Snapshot != nil && g.Snapshot.ID == snap {
					return true
				}
			}
		}
	}
	return false
}

func mustJSON(t *testing.T, s string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(s), v); err != nil {
		t.Fatalf("%v: %q", err, s)
	}
}

// grepTree returns the regular files under dir that contain s.
func grepTree(t *testing.T, dir, s string) []string {
	t.Helper()
	var hits []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(p)
		if err == nil && bytes.Contains(b, []byte(s)) {
			hits = append(hits, p)
		}
		return err
	})
	if err != nil {
		t.Fatalf("searching %s: %v", dir, err)
	}
	return hits
}

// A trajectory snapshotted step by step: each step a sandbox made from the
// last step's snapshot, so each snapshot stacks one more diff. Past
// api.MaxDiffDepth the chain is squashed into one diff in the background,
// and a sandbox from the squashed environment sees exactly what one from
// the chain sees: files written, overwritten and deleted at different
// steps, a directory replaced, a file of the base layer deleted.
func TestUpSquash(t *testing.T) {
	testutil.RequireContainers(t)
	c := startUp(t)
	steps := api.MaxDiffDepth + 1
	img := "busybox"
	var sbx string
	for i := 1; i <= steps; i++ {
		if sbx != "" {
			c.MustRun("sandbox", "rm", sbx) // the node's room: one step at a time
		}
		sbx = strings.TrimSpace(c.MustRun("sandbox", "create", "--image", img))
		cmd := fmt.Sprintf("mkdir -p /work && echo %d > /work/f%d && echo %d > /work/latest && rm -f /work/f%d", i, i, i, i-2)
		switch i {
		case 2:
			cmd += " && mkdir -p /work/d/sub && echo a > /work/d/a && echo s > /work/d/sub/s"
		case 3:
			cmd += " && rm /bin/vi" // a whiteout over the base layer
		case 5:
			cmd += " && rm -rf /work/d && mkdir /work/d && echo b > /work/d/b" // an opaque directory
		case 7:
			cmd += " && echo k > /work/keep && ln -s keep /work/link && chmod 0600 /work/keep"
		}
		c.MustRun("exec", sbx, "--sh", cmd)
		var snap api.Snapshot
		mustJSON(t, c.MustRun("sandbox", "snapshot", sbx, "--name", "traj", "-o", "json"), &snap)
		if want := fmt.Sprintf("traj@%d", i); snap.Ref != want {
			t.Fatalf("step %d: snapshot %s, want %s", i, snap.Ref, want)
		}
		img = snap.Ref
	}

	// The last snapshot put the chain past the limit: squashed, soon.
	var env api.Environment
	deadline := time.Now().Add(testutil.Scale(2 * time.Minute))
	for {
		mustJSON(t, c.MustRun("env", "get", img, "-o", "json"), &env)
		if env.Squashed != nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if env.Squashed == nil || len(env.Squashed.From) != steps || api.DiffDepth(env.Layers) != 1 ||
		env.Layers[len(env.Layers)-1].Ref != fmt.Sprintf("traj-squashed@%d", steps) {
		t.Fatalf("environment %s after %d snapshots: %+v", img, steps, env)
	}
	// The same files through the chain (the last step's sandbox was made
	// from traj@8's chain; the last snapshot only adds its own step) and
	// through the squash.
	view := "cd / && find work bin -xdev | sort && for f in $(find work -type f | sort); do echo $f $(cat $f); done && " +
		"stat -c '%n %a' work/keep && readlink work/link"
	flat := strings.TrimSpace(c.MustRun("sandbox", "create", "--image", img))
	want, got := c.MustRun("exec", sbx, "--sh", view), c.MustRun("exec", flat, "--sh", view)
	if got != want {
		t.Errorf("a sandbox from the squashed %s sees\n%s\nthe chain's:\n%s", img, got, want)
	}
	for _, s := range []string{"work/d/b b", "work/f9 9", "work/latest 9", "work/keep 600", "\nkeep\n"} {
		if !strings.Contains(got+"\n", s) {
			t.Errorf("the squashed view lacks %q:\n%s", s, got)
		}
	}
	for _, s := range []string{"work/f1", "work/d/a", "work/d/sub", "bin/vi"} {
		if strings.Contains(got, s+"\n") {
			t.Errorf("the squashed view has %s, deleted in the chain:\n%s", s, got)
		}
	}
	// Exported as OCI like any environment: the diff's deletions are OCI
	// whiteouts and opaque markers in its layer, and the image imported
	// back shows the same files.
	layout := filepath.Join(t.TempDir(), "oci")
	c.MustRun("env", "export", img, "--format", "oci-layout", layout, "-q")
	names := ociTopLayer(t, layout)
	for _, n := range []string{"bin/.wh.vi", "work/d/.wh..wh..opq", "work/d/b"} {
		if !slices.Contains(names, n) {
			t.Errorf("the exported diff layer lacks %s: %v", n, names)
		}
	}
	c.MustRun("image", "import", "oci-layout:"+layout, "--name", "traj-oci@1", "-q")
	back := strings.TrimSpace(c.MustRun("sandbox", "create", "--image", "traj-oci@1"))
	if got := c.MustRun("exec", back, "--sh", view); got != want {
		t.Errorf("a sandbox from the exported and imported %s sees\n%s\nthe chain's:\n%s", img, got, want)
	}
	c.MustRun("sandbox", "rm", back)

	// A snapshot on top of the squash stacks one diff on it.
	c.MustRun("exec", flat, "--sh", "echo 10 > /work/f10")
	var next api.Snapshot
	mustJSON(t, c.MustRun("sandbox", "snapshot", flat, "--name", "traj", "-o", "json"), &next)
	mustJSON(t, c.MustRun("env", "get", next.Ref, "-o", "json"), &env)
	if api.DiffDepth(env.Layers) != 2 {
		t.Errorf("a snapshot of a sandbox from the squashed environment: %d diffs", api.DiffDepth(env.Layers))
	}

	// Squash by hand: an environment with a shorter chain, and one with
	// nothing to squash.
	if out := c.MustRun("env", "squash", "traj@4"); !strings.Contains(out, "squashed traj@4: 4 diff layers into traj-squashed@4") {
		t.Errorf("env squash traj@4: %q", out)
	}
	if out := c.MustRun("env", "squash", "busybox"); !strings.Contains(out, "nothing to squash") {
		t.Errorf("env squash busybox: %q", out)
	}
	s4 := strings.TrimSpace(c.MustRun("sandbox", "create", "--image", "traj@4"))
	if out := c.MustRun("exec", s4, "--sh", "cat /work/latest /work/d/a; test -e /bin/vi && echo vi || echo no-vi"); out != "4\na\nno-vi\n" {
		t.Errorf("a sandbox from the squashed traj@4: %q", out)
	}
	// Removing a squashed snapshot takes its squashed layer along.
	c.MustRun("sandbox", "rm", s4)
	c.MustRun("snapshot", "rm", "--force", "traj@4")
	if _, stderr, code := c.Run("layer", "get", "traj-squashed@4"); code == 0 || !strings.Contains(stderr, "not_found") {
		t.Errorf("the squashed layer of a removed snapshot: exit %d, %q", code, stderr)
	}
}

// ociTopLayer returns the entry names of the top layer of the one image in
// the OCI layout dir.
func ociTopLayer(t *testing.T, dir string) []string {
	t.Helper()
	blob := func(digest string, v any) []byte {
		b, err := os.ReadFile(filepath.Join(dir, "blobs", "sha256", strings.TrimPrefix(digest, "sha256:")))
		if err != nil {
			t.Fatal(err)
		}
		if v != nil {
			mustJSON(t, string(b), v)
		}
		return b
	}
	var index struct{ Manifests []struct{ Digest string } }
	b, err := os.ReadFile(filepath.Join(dir, "index.json"))
	if err != nil {
		t.Fatal(err)
	}
	mustJSON(t, string(b), &index)
	if len(index.Manifests) != 1 {
		t.Fatalf("index: %s", b)
	}
	var m struct{ Layers []struct{ Digest string } }
	blob(index.Manifests[0].Digest, &m)
	zr, err := gzip.NewReader(bytes.NewReader(blob(m.Layers[len(m.Layers)-1].Digest, nil)))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return names
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, strings.TrimPrefix(strings.TrimSuffix(h.Name, "/"), "./"))
	}
}

// startUp starts `warren up` without FnCall for t, and at its end removes
// every sandbox and stops it (printing its log if t failed).
func startUp(t *testing.T) *cluster {
	t.Helper()
	return startUpWith(t, "--no-fn")
}

// startUpWith is startUp with these `warren up` flags (and not --no-fn
// unless given).
func startUpWith(t *testing.T, args ...string) *cluster {
	t.Helper()
	c := &cluster{T: t, Bin: warrenBin(t), DataDir: t.TempDir(), Addr: freeAddr(t), Args: args}
	c.Start()
	t.Cleanup(func() {
		c.Run("sandbox", "rm", "--all")
		c.Stop()
		if t.Failed() {
			t.Logf("warren up log:\n%s", c.Log)
		}
	})
	return c
}
