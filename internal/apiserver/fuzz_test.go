package apiserver_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/warrenhq/warren/internal/node"
)

// FuzzRequests sends arbitrary bodies to the JSON endpoints (create, exec,
// network). Whatever a stranger sends, the answer is a 2xx, a classified
// 4xx or a 503 saying what the node lacks (a network, here), never a 500,
// and the running sandbox keeps working.
func FuzzRequests(f *testing.F) {
	for _, s := range []string{
		`{"image":"busybox"}`,
		`{"image":"busybox","resources":{"cpu":0.5,"memory":"256Mi","pids":64},"ttl":"30m"}`,
		`{"image":"busybox","labels":{"a":"b"},"env":{"K":"V"},"idle_timeout":5}`,
		`{"cmd":"echo hi","timeout":"1s","max_output":"1Ki"}`,
		`{"argv":["echo","x"],"stdin":"aGk=","stdin_encoding":"base64","stream":true}`,
		`{"image":1e400}`, `{"resources":{"memory":"9999999Ti"}}`, `null`, `"`, `{}`,
		`{"image":"busybox","network":{"allow":["pypi.org","*.pythonhosted.org","198.51.100.0/24:443"]}}`,
		`{"mode":"none"}`, `{"mode":"open","add":["a.com"]}`, `{"allow":["[::1]:80"],"remove":["x"]}`, `{"mode":null}`,
	} {
		f.Add(0, s)
		f.Add(1, s)
		f.Add(2, s)
	}
	h := newHarness(f, func(c *node.Config) { c.Limits.Sandboxes = 4 })
	f.Fuzz(func(t *testing.T, which int, body string) {
		h.t = t
		sb := h.probe()
		method, path := "POST", "/v1/sandboxes"
		switch uint(which) % 3 {
		case 1:
			path += "/" + sb + "/exec"
		case 2:
			method, path = "PATCH", path+"/"+sb+"/network"
		}
		resp, b := h.json(method, path, body)
		if resp.StatusCode >= 500 && resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("POST %s %q: %d %s", path, body, resp.StatusCode, b)
		}
		if resp.StatusCode == http.StatusCreated {
			h.json("DELETE", "/v1/sandboxes/"+strings.Split(strings.Split(string(b), `"id":"`)[1], `"`)[0], "")
		}
		resp, b = h.json("POST", "/v1/sandboxes/"+sb+"/exec", `{"cmd":"echo ok"}`)
		if resp.StatusCode != 200 || !strings.Contains(string(b), `"stdout":"ok\n"`) {
			t.Fatalf("after %q the probe sandbox answers %d %s", body, resp.StatusCode, b)
		}
	})
}

// probe returns the id of a long-lived sandbox, creating it the first time.
func (h *harness) probe() string {
	if h.probeID == "" {
		h.probeID = h.create(`{"image":"busybox"}`).ID
	}
	return h.probeID
}
