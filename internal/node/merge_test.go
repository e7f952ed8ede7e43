package node

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
)

// merger is a backend that says it merges memory.
type merger struct{ backend.Backend }

func (merger) MemoryMerge() error { return nil }

// A node merges one group's sandboxes at a time: another group's create
// is refused (429, so placement tries elsewhere) until the first group's
// last sandbox is gone, also after an agent restart; sandboxes of no
// group are not affected; the host's KSM is turned on for the first.
func TestMemoryMergeGroups(t *testing.T) {
	dir := t.TempDir()
	ksm := t.TempDir()
	run := filepath.Join(ksm, "run")
	if err := os.WriteFile(run, []byte("0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(ksm, "pages_sharing"), []byte("256\n"), 0o644)
	start := func() *Agent {
		return newAgent(t, dir, func(c *Config) {
			c.KSMDir = ksm
			for i, b := range c.Backends {
				c.Backends[i] = merger{b}
			}
		})
	}
	a := start()
	if st := a.Status().MemoryMerge; st == nil || st.Mechanism != "ksm" || st.Group != "" {
		t.Fatalf("idle node: memory merge %+v", st)
	}
	g1 := mustCreate(t, a, api.CreateSandboxRequest{MemoryMergeGroup: "g1"})
	if g1.MemoryMergeGroup != "g1" {
		t.Errorf("sandbox of group g1 says group %q", g1.MemoryMergeGroup)
	}
	if b, _ := os.ReadFile(run); strings.TrimSpace(string(b)) != "1" {
		t.Errorf("KSM run = %q after the first merging sandbox, want 1", b)
	}
	plain := mustCreate(t, a, api.CreateSandboxRequest{})
	if plain.MemoryMergeGroup != "" {
		t.Errorf("a sandbox of no group merges in %q", plain.MemoryMergeGroup)
	}
	mustCreate(t, a, api.CreateSandboxRequest{MemoryMergeGroup: "g1"})
	_, err := a.Create(context.Background(), api.CreateSandboxRequest{Image: "busybox", MemoryMergeGroup: "g2"})
	if !errors.Is(err, errdefs.ErrExhausted) || errdefs.Code(err) != api.CodeNodeFull || !strings.Contains(err.Error(), "merge group g1") {
		t.Fatalf("create of group g2 beside g1: %v, want 429 node_full naming g1", err)
	}
	st := a.Status().MemoryMerge
	if st.Group != "g1" || st.Sandboxes != 2 || st.Saved != api.Quantity(256*os.Getpagesize()) {
		t.Errorf("status: %+v, want group g1 with 2 sandboxes, 256 pages saved", st)
	}

	// After a restart the group is still the node's.
	a.Close()
	a = start()
	if _, err := a.Create(context.Background(), api.CreateSandboxRequest{Image: "busybox", MemoryMergeGroup: "g2"}); !errors.Is(err, errdefs.ErrExhausted) {
		t.Fatalf("after a restart, create of group g2 beside g1: %v, want 429", err)
	}
	list, err := a.List(context.Background(), Filter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range list {
		if sb.MemoryMergeGroup == "g1" {
			if err := a.Delete(context.Background(), sb.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
	if g2 := mustCreate(t, a, api.CreateSandboxRequest{MemoryMergeGroup: "g2"}); g2.MemoryMergeGroup != "g2" {
		t.Errorf("once g1's sandboxes are gone, g2's sandbox merges in %q", g2.MemoryMergeGroup)
	}
}

// A node told not to merge, or whose backends cannot, runs a group's
// sandboxes unmerged, and takes any group's.
func TestMemoryMergeOff(t *testing.T) {
	for name, mod := range map[string]func(*Config){
		"turned off": func(c *Config) {
			c.NoMemoryMerge = true
			for i, b := range c.Backends {
				c.Backends[i] = merger{b}
			}
		},
		"backend cannot": nil, // the fake is no MemoryMerger
	} {
		t.Run(name, func(t *testing.T) {
			ksm := t.TempDir() // nothing to turn on there
			a := newAgent(t, t.TempDir(), func(c *Config) {
				c.KSMDir = ksm
				if mod != nil {
					mod(c)
				}
			})
			for _, g := range []string{"g1", "g2"} {
				if sb := mustCreate(t, a, api.CreateSandboxRequest{MemoryMergeGroup: g}); sb.MemoryMergeGroup != "" {
					t.Errorf("sandbox of group %s merges in %q", g, sb.MemoryMergeGroup)
				}
			}
			if st := a.Status().MemoryMerge; !strings.HasPrefix(st.Mechanism, "off: ") || st.Group != "" {
				t.Errorf("status: %+v", st)
			}
		})
	}
}
