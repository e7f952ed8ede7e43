package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/testutil"
)

// Pause and resume through the CLI and `warren up`: one sandbox, then a
// label selector and a project across the node, a transparent resume by
// exec, TTL updates, and the Python SDK's calls.
func TestUpPause(t *testing.T) {
	testutil.RequireContainers(t)
	c := startUp(t)
	sb := strings.TrimSpace(c.MustRun("sandbox", "create", "--image", "busybox", "--ttl", "1h", "--label", "run=exp-17"))
	c.MustRun("exec", sb, "--sh", "dd if=/dev/zero of=/big bs=1M count=32 2>/dev/null; echo 1 > /state")
	out := c.MustRun("sandbox", "pause", sb)
	if !strings.Contains(out, sb+"\tpaused\tmemory") {
		t.Errorf("sandbox pause: %q", out)
	}
	var got api.Sandbox
	mustJSON(t, c.MustRun("sandbox", "get", sb, "-o", "json"), &got)
	if got.State != api.StatePaused || got.Pause == nil || got.Pause.By != "caller" || got.Pause.MemoryBefore-got.Pause.MemoryAfter < 24<<20 {
		t.Errorf("a paused sandbox: %+v, pause %+v", got, got.Pause)
	}
	var nodes api.NodeList
	mustJSON(t, c.MustRun("node", "ls", "-o", "json"), &nodes)
	if nodes.Nodes[0].Usage.Paused != 1 || nodes.Nodes[0].PauseReclaim == "" {
		t.Errorf("node ls: usage %+v, pause_reclaim %q; want 1 paused, and what pausing reclaims", nodes.Nodes[0].Usage, nodes.Nodes[0].PauseReclaim)
	}
	if out := c.MustRun("node", "ls"); !regexp.MustCompile(` 1/[0-9]+,1-paused `).MatchString(out) {
		t.Errorf("node ls does not count it paused:\n%s", out)
	}
	if out := c.MustRun("sandbox", "ls"); !strings.Contains(out, "paused") {
		t.Errorf("sandbox ls does not show it paused:\n%s", out)
	}

	// Any call resumes it first, transparently.
	if out := c.MustRun("exec", sb, "--sh", "cat /state"); out != "1\n" {
		t.Errorf("exec on a paused sandbox: %q", out)
	}
	mustJSON(t, c.MustRun("sandbox", "get", sb, "-o", "json"), &got)
	if got.State != api.StateRunning || got.Pause.ResumedBy != "exec" {
		t.Errorf("after the exec: state %s, pause %+v", got.State, got.Pause)
	}

	// By label, across the node's sandboxes: only the matching ones.
	other := strings.TrimSpace(c.MustRun("sandbox", "create", "--image", "busybox", "--label", "run=exp-17"))
	bystander := strings.TrimSpace(c.MustRun("sandbox", "create", "--image", "busybox", "--label", "run=exp-18"))
	if out := c.MustRun("sandbox", "pause", "--label", "run=exp-17"); !strings.Contains(out, "2 sandbox(es) paused on 1 node(s)") {
		t.Errorf("pause --label: %q", out)
	}
	for id, want := range map[string]string{sb: "paused", other: "paused", bystander: "running"} {
		mustJSON(t, c.MustRun("sandbox", "get", id, "-o", "json"), &got)
		if got.State != want {
			t.Errorf("%s after pause --label run=exp-17: %s, want %s", id, got.State, want)
		}
	}
	if out := c.MustRun("sandbox", "resume", "--label", "run=exp-17"); !strings.Contains(out, "2 sandbox(es) resumed") {
		t.Errorf("resume --label: %q", out)
	}

	// A project's subtree.
	c.MustRun("project", "create", "rl")
	c.MustRun("project", "create", "rl/math")
	inProj := strings.TrimSpace(c.MustRun("sandbox", "create", "--image", "busybox", "--project", "rl/math"))
	if out := c.MustRun("project", "pause", "rl"); !strings.Contains(out, "1 sandbox(es) paused") {
		t.Errorf("project pause rl: %q", out)
	}
	mustJSON(t, c.MustRun("sandbox", "get", inProj, "-o", "json"), &got)
	if got.State != api.StatePaused || got.Pause.By != "project" {
		t.Errorf("a sandbox of rl/math after project pause rl: %s %+v", got.State, got.Pause)
	}
	mustJSON(t, c.MustRun("sandbox", "get", bystander, "-o", "json"), &got)
	if got.State != api.StateRunning {
		t.Errorf("a sandbox outside rl after project pause rl: %s", got.State)
	}
	c.MustRun("project", "resume", "rl")

	// A rollout worker: pausing it pauses the sandboxes it drives, and
	// resuming it resumes them.
	worker := strings.TrimSpace(c.MustRun("sandbox", "create", "--image", "busybox", "--worker"))
	var driven []string
	for range 2 {
		driven = append(driven, strings.TrimSpace(c.MustRun("sandbox", "create", "--image", "busybox", "--worker-of", worker)))
	}
	if _, stderr, code := c.Run("sandbox", "create", "--image", "busybox", "--worker-of", bystander); code == 0 || !strings.Contains(stderr, "no worker") {
		t.Errorf("--worker-of a sandbox that is no worker: exit %d, %q", code, stderr)
	}
	for _, verb := range []string{"pause", "resume"} {
		c.MustRun("sandbox", verb, worker)
		want := map[string]string{"pause": api.StatePaused, "resume": api.StateRunning}[verb]
		for _, id := range append([]string{worker}, driven...) {
			mustJSON(t, c.MustRun("sandbox", "get", id, "-o", "json"), &got)
			if got.State != want {
				t.Errorf("%s after %s of its worker: %s, want %s", id, verb, got.State, want)
			}
		}
	}
	mustJSON(t, c.MustRun("sandbox", "get", bystander, "-o", "json"), &got)
	if got.State != api.StateRunning {
		t.Errorf("a sandbox no worker drives after the worker's pause: %s", got.State)
	}

	// Update: TTL from now, labels.
	before := time.Now()
	got = api.Sandbox{}
	mustJSON(t, c.MustRun("sandbox", "update", sb, "--ttl", "2h", "--label", "step=4", "--unlabel", "run", "-o", "json"), &got)
	if got.ExpiresAt == nil || got.ExpiresAt.Before(before.Add(119*time.Minute)) || got.Labels["step"] != "4" || got.Labels["run"] != "" {
		t.Errorf("update --ttl 2h: expires %v, labels %v", got.ExpiresAt, got.Labels)
	}
	for _, tc := range []struct {
		args []string
		code string
	}{
		{[]string{"sandbox", "update", sb, "--label", api.LabelGang + "=x"}, "invalid_argument"},
		{[]string{"sandbox", "pause", "n1-aaaaaaaaaaaaaaaa"}, "sandbox_not_found"},
		{[]string{"sandbox", "create", "--image", "busybox", "--auto-pause", "10ms"}, "invalid_argument"},
	} {
		if _, stderr, code := c.Run(tc.args...); code == 0 || !strings.Contains(stderr, tc.code) {
			t.Errorf("%v: exit %d, %q; want %s", tc.args, code, stderr, tc.code)
		}
	}

	// The journal: each call in order, the pause and the resume the exec
	// made among them.
	var j api.Journal
	mustJSON(t, c.MustRun("sandbox", "journal", sb, "-o", "json"), &j)
	var verbs []string
	for _, e := range j.Entries {
		verbs = append(verbs, e.Verb)
	}
	if got := strings.Join(verbs, ","); !strings.HasPrefix(got, "exec,pause,resume,exec,pause,resume,update") {
		t.Errorf("journal: %s", got)
	}
	if out := c.MustRun("sandbox", "journal", sb); !strings.Contains(out, "dd if=/dev/zero") || !strings.Contains(out, "exit 0") {
		t.Errorf("journal table:\n%s", out)
	}

	if _, err := exec.LookPath("python3"); err == nil {
		py := `
import sys
from warren import Client
c = Client()
sid = sys.argv[1]
p = c.pause(sid)
assert p["state"] == "paused" and p["pause"]["by"] == "caller", p
assert c.exec(sid, cmd="cat /state").stdout == b"1\n"
r = c.pause_sandboxes(labels={"step": "4"})
assert sum(n["done"] for n in r["nodes"].values()) == 1, r
r = c.resume_sandboxes(labels={"step": "4"})
assert r["sandboxes"][0]["state"] == "running", r
u = c.update_sandbox(sid, idle_timeout="30m", labels={"step": None})
assert u["idle_timeout"] == "30m0s" and "step" not in (u.get("labels") or {}), u
j = c.journal(sid, since=1)
assert j["entries"][0]["seq"] == 2 and j["entries"][-1]["verb"] == "update", j["entries"][-1]
print("ok")
`
		sdk, _ := filepath.Abs(filepath.Join("..", "..", "sdk", "python"))
		cmd := exec.Command("python3", "-c", py, sb)
		cmd.Env = append(os.Environ(), "PYTHONPATH="+sdk, "WARREN_ADDR=http://"+c.Addr, "WARREN_TOKEN="+c.Token(), "PYTHONDONTWRITEBYTECODE=1")
		if out, err := cmd.CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "ok" {
			t.Errorf("the Python SDK: %v\n%s", err, out)
		}
	} else if testutil.Strict() {
		t.Error("python3 missing: the Python SDK's pause calls went untested")
	}
}
