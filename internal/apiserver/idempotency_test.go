package apiserver_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/node"
)

func createWithKey(t *testing.T, h *harness, body, key string) (int, api.Sandbox, []byte) {
	t.Helper()
	resp, b := h.do("POST", "/v1/sandboxes", "application/json", strings.NewReader(body), "Idempotency-Key", key)
	var sb api.Sandbox
	if resp.StatusCode == http.StatusCreated {
		if err := json.Unmarshal(b, &sb); err != nil {
			t.Fatal(err)
		}
	}
	return resp.StatusCode, sb, b
}

// replayGone checks that key, whose sandbox id was ended for reason,
// replays as sandbox_gone naming the sandbox and the reason, never as the
// running sandbox it once created.
func replayGone(t *testing.T, h *harness, body, key, id, reason string) {
	t.Helper()
	code, sb, b := createWithKey(t, h, body, key)
	if code != http.StatusConflict || errorCode(t, b) != api.CodeSandboxGone {
		t.Fatalf("replay of %q after its sandbox was %s: %d %+v %s; want 409 %s", key, reason, code, sb, b, api.CodeSandboxGone)
	}
	if !strings.Contains(string(b), id) || !strings.Contains(string(b), reason) {
		t.Errorf("replay answer %s does not name the sandbox %s and why (%s)", b, id, reason)
	}
}

func TestIdempotentReplayAfterDelete(t *testing.T) {
	h := newHarness(t, func(c *node.Config) { c.ReapInterval = 20 * time.Millisecond })
	const body = `{"image":"busybox"}`
	code, sb, b := createWithKey(t, h, body, "rollout-1")
	if code != http.StatusCreated {
		t.Fatalf("create: %d %s", code, b)
	}
	// While it lives, a replay answers it as it is now.
	if code, again, b := createWithKey(t, h, body, "rollout-1"); code != http.StatusCreated || again.ID != sb.ID || again.State != api.StateRunning {
		t.Fatalf("replay while it runs: %d %s", code, b)
	}
	if resp, b := h.do("DELETE", "/v1/sandboxes/"+sb.ID, "", nil); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("delete: %d %s", resp.StatusCode, b)
	}
	replayGone(t, h, body, "rollout-1", sb.ID, "deleted")

	// Reaped for its TTL: the replay says so.
	const short = `{"image":"busybox","ttl":"1s"}`
	code, sb, b = createWithKey(t, h, short, "rollout-2")
	if code != http.StatusCreated {
		t.Fatalf("create: %d %s", code, b)
	}
	waitUntil(t, "the 1s sandbox reaped", 5*time.Second, func() bool {
		resp, _ := h.do("GET", "/v1/sandboxes/"+sb.ID, "", nil)
		return resp.StatusCode == http.StatusNotFound
	})
	replayGone(t, h, short, "rollout-2", sb.ID, "ttl expired")
}

func TestIdempotentReplayRouted(t *testing.T) {
	f := newFleet(t, "a1", "b2")
	const body = `{"image":"busybox"}`
	code, sb, b := createWithKey(t, f.harness, body, "k-del")
	if code != http.StatusCreated {
		t.Fatalf("create: %d %s", code, b)
	}
	if resp, b := f.do("DELETE", "/v1/sandboxes/"+sb.ID, "", nil); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("delete: %d %s", resp.StatusCode, b)
	}
	replayGone(t, f.harness, body, "k-del", sb.ID, "deleted")

	// A key whose node is lost replays its sandbox as lost, as a GET
	// answers it: never running.
	var onB api.Sandbox
	var onBKey string
	for i := 0; onB.ID == ""; i++ {
		key := "k-lost-" + string(rune('a'+i))
		code, sb, b := createWithKey(t, f.harness, body, key)
		if code != http.StatusCreated {
			t.Fatalf("create: %d %s", code, b)
		}
		if sb.Node == "b2" {
			onB, onBKey = sb, key
		}
	}
	f.nodes["b2"].kill()
	waitUntil(t, "b2's sandbox lost", 3*time.Second, func() bool {
		_, sb, _ := f.get(onB.ID)
		return sb.State == api.StateLost
	})
	code, sb, b = createWithKey(t, f.harness, body, onBKey)
	if code != http.StatusCreated || sb.ID != onB.ID || sb.State != api.StateLost {
		t.Errorf("replay of a key whose node is lost: %d %s; want its sandbox, lost", code, b)
	}
}
