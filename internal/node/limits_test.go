package node

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
)

// TestNodeChecksLimits: the node refuses oversized input itself (it is
// reachable with no apiserver in front), with the same codes, and a
// create it does not match by pool or node_selector with 503.
func TestNodeChecksLimits(t *testing.T) {
	a := newAgent(t, t.TempDir(), func(c *Config) { c.Labels = map[string]string{"rack": "r1"} })
	ctx := context.Background()
	if s := a.Status(); s.Pool != api.PoolOnPrem || s.Labels["rack"] != "r1" {
		t.Fatalf("status pool %q labels %v, want onprem rack=r1", s.Pool, s.Labels)
	}
	sb := mustCreate(t, a, api.CreateSandboxRequest{NodeSelector: map[string]string{"rack": "r1"}})

	for _, tc := range []struct {
		name string
		err  error
		kind error
		code string
	}{
		{"30 MiB env", func() error {
			_, err := a.Create(ctx, api.CreateSandboxRequest{Image: "busybox", Env: map[string]string{"BIG": strings.Repeat("x", 30<<20)}})
			return err
		}(), errdefs.ErrInvalid, api.CodeTooLarge},
		{"labels", func() error {
			_, err := a.Create(ctx, api.CreateSandboxRequest{Image: "busybox", Labels: map[string]string{"k": strings.Repeat("v", 300)}})
			return err
		}(), errdefs.ErrInvalid, api.CodeTooLarge},
		{"selector", func() error {
			_, err := a.Create(ctx, api.CreateSandboxRequest{Image: "busybox", NodeSelector: map[string]string{"rack": "r2"}})
			return err
		}(), errdefs.ErrUnavailable, api.CodeNoMatchingNode},
		{"pool", func() error {
			_, err := a.Create(ctx, api.CreateSandboxRequest{Image: "busybox", Pool: api.PoolCloud})
			return err
		}(), errdefs.ErrUnavailable, api.CodeNoMatchingNode},
		{"max_output", func() error {
			_, err := a.Exec(ctx, sb.ID, api.ExecRequest{Argv: []string{"true"}, MaxOutput: 1 << 30}, nil, nil)
			return err
		}(), errdefs.ErrInvalid, api.CodeTooLarge},
		{"exec env", func() error {
			_, err := a.Exec(ctx, sb.ID, api.ExecRequest{Argv: []string{"true"}, Env: map[string]string{"A": strings.Repeat("x", 200<<10)}}, nil, nil)
			return err
		}(), errdefs.ErrInvalid, api.CodeTooLarge},
	} {
		if !errors.Is(tc.err, tc.kind) || errdefs.Code(tc.err) != tc.code {
			t.Errorf("%s: got %v (code %q), want %v with code %s", tc.name, tc.err, errdefs.Code(tc.err), tc.kind, tc.code)
		}
	}
	if list, _ := a.List(ctx, Filter{}); len(list) != 1 {
		t.Errorf("%d sandboxes after the refusals, want 1", len(list))
	}
}
