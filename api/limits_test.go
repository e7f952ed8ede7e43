package api_test

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
)

// TestLimitsAtTheEdge: a field exactly at its limit passes, one byte or
// entry more is a *LimitError naming it.
func TestLimitsAtTheEdge(t *testing.T) {
	b64 := func(n int) string { return base64.StdEncoding.EncodeToString(make([]byte, n)) }
	for _, tc := range []struct {
		name  string
		ok    api.ExecRequest
		over  api.ExecRequest
		field string
	}{
		{"stdin", api.ExecRequest{Stdin: strings.Repeat("x", api.MaxExecStdin)}, api.ExecRequest{Stdin: strings.Repeat("x", api.MaxExecStdin+1)}, "stdin"},
		{"base64 stdin", api.ExecRequest{Stdin: b64(api.MaxExecStdin), StdinEncoding: api.EncodingBase64},
			api.ExecRequest{Stdin: b64(api.MaxExecStdin + 1), StdinEncoding: api.EncodingBase64}, "stdin"},
		{"max_output", api.ExecRequest{MaxOutput: api.MaxExecOutput}, api.ExecRequest{MaxOutput: api.MaxExecOutput + 1}, "max_output"},
		{"env entry", api.ExecRequest{Env: map[string]string{"A": strings.Repeat("x", api.MaxEnvEntry-2)}},
			api.ExecRequest{Env: map[string]string{"A": strings.Repeat("x", api.MaxEnvEntry-1)}}, "env[A]"},
		{"argv", api.ExecRequest{Argv: make([]string, api.MaxArgs)}, api.ExecRequest{Argv: make([]string, api.MaxArgs+1)}, "argv"},
		{"cwd", api.ExecRequest{Cwd: strings.Repeat("x", api.MaxPathLen)}, api.ExecRequest{Cwd: strings.Repeat("x", api.MaxPathLen+1)}, "cwd"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := api.CheckExec(&tc.ok); err != nil {
				t.Errorf("at the limit: %v", err)
			}
			var le *api.LimitError
			if err := api.CheckExec(&tc.over); !errors.As(err, &le) || le.Field != tc.field {
				t.Errorf("over the limit: got %v, want a LimitError on %s", err, tc.field)
			}
		})
	}
}

// TestCheckCreateRuntime: runc and gvisor, of the container backend; no
// network for gvisor.
func TestCheckCreateRuntime(t *testing.T) {
	open := &api.NetworkPolicy{Mode: api.NetworkOpen}
	for _, tc := range []struct {
		req api.CreateSandboxRequest
		err string // "" for none
	}{
		{api.CreateSandboxRequest{}, ""},
		{api.CreateSandboxRequest{Runtime: api.RuntimeRunc, Network: open}, ""},
		{api.CreateSandboxRequest{Runtime: api.RuntimeGVisor, Backend: api.BackendContainer}, ""},
		{api.CreateSandboxRequest{Runtime: api.RuntimeGVisor, Network: &api.NetworkPolicy{Mode: api.NetworkNone}}, ""},
		{api.CreateSandboxRequest{Runtime: "kata"}, `runtime "kata": want runc or gvisor`},
		{api.CreateSandboxRequest{Runtime: api.RuntimeRunc, Backend: api.BackendVM}, "backend vm has no runtimes"},
		{api.CreateSandboxRequest{Runtime: api.RuntimeGVisor, Network: open}, "network must be none"},
	} {
		err := api.CheckCreate(&tc.req)
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("CheckCreate(runtime %q, backend %q, network %v) = %v, want %q", tc.req.Runtime, tc.req.Backend, tc.req.Network, err, tc.err)
		}
	}
}
