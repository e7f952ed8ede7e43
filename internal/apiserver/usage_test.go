package apiserver_test

import (
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/apiserver"
	"github.com/warrenhq/warren/internal/iam"
)

func sbx(id, project string, cpu float64) api.Sandbox {
	return api.Sandbox{ID: id, Node: "n1", Project: project, State: api.StateRunning,
		Resources: api.Resources{CPU: cpu, Memory: 64 << 20}}
}

// A resync's list may predate creates and deletes that happen while it
// runs: they must survive it.
func TestUsageResyncKeepsConcurrentChanges(t *testing.T) {
	u := apiserver.NewUsage()
	u.Created(sbx("n1-a", "p/x", 1))
	u.Created(sbx("n1-b", "p/x", 1))
	if got := u.Usage("p"); got.Sandboxes != 2 || got.MilliCPU != 2000 {
		t.Fatalf("after two creates: %+v", got)
	}
	u.Created(sbx("n1-b", "p/x", 1)) // counted once
	if got := u.Usage("p/x"); got.Sandboxes != 2 {
		t.Fatalf("a sandbox counted twice: %+v", got)
	}

	// The node's list has a, b and an expired-elsewhere-but-lost c; while
	// it is taken, d is created and a deleted.
	err := u.Resync("n1", func() ([]api.Sandbox, error) {
		u.Created(sbx("n1-d", "q", 0.5))
		u.Deleted("n1", "n1-a")
		lost := sbx("n1-c", "p", 1)
		lost.State = api.StateLost
		return []api.Sandbox{sbx("n1-a", "p/x", 1), sbx("n1-b", "p/x", 1), lost}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := u.Usage(""); got != (iam.Resources{Sandboxes: 2, MilliCPU: 1500, Memory: 128 << 20}) {
		t.Errorf("after the resync: %+v, want b and d", got)
	}
	// The next resync sees only the node's word.
	u.Resync("n1", func() ([]api.Sandbox, error) { return []api.Sandbox{sbx("n1-b", "p/x", 1)}, nil })
	if got := u.Usage("q"); !got.IsZero() {
		t.Errorf("q after a resync without d: %+v", got)
	}
	u.RemoveNode("n1")
	if got := u.Usage(""); !got.IsZero() {
		t.Errorf("after RemoveNode: %+v", got)
	}
}
