package apiserver

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/fleet"
)

type statusOf api.Node

func (s statusOf) Status(context.Context, fleet.Registration) (api.Node, error) {
	return api.Node(s), nil
}

// TestRecordTraces: the traces a node lists in its status are handed to
// the recorder once each, however often the node is polled; one that
// failed for a passing reason is tried again, an invalid one is not.
func TestRecordTraces(t *testing.T) {
	var mu sync.Mutex
	calls := map[string]int{}
	fail := map[string]error{"sha256:down": errors.New("etcd down")}
	rec := func(ctx context.Context, layer, trace, node string) (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		calls[trace]++
		if node != "n1" {
			t.Errorf("recorded for node %q, want n1", node)
		}
		err := fail[trace]
		delete(fail, trace) // down once only
		if trace == "sha256:bad" {
			err = errdefs.Invalid("not a trace")
		}
		return err == nil, err
	}
	n := api.Node{ID: "n1", PrefetchTraces: []api.LayerTrace{
		{Layer: "sha256:l1", Trace: "sha256:good"}, {Layer: "sha256:l2", Trace: "sha256:down"}, {Layer: "sha256:l3", Trace: "sha256:bad"},
	}}
	src := RecordTraces(statusOf(n), rec, nil)
	for range 5 {
		st, err := src.Status(context.Background(), fleet.Registration{Node: api.Node{ID: "n1"}})
		if err != nil || len(st.PrefetchTraces) != 3 {
			t.Fatalf("status through the recorder: %+v, %v", st, err)
		}
		time.Sleep(50 * time.Millisecond) // the records run in the background
	}
	mu.Lock()
	defer mu.Unlock()
	want := map[string]int{"sha256:good": 1, "sha256:down": 2, "sha256:bad": 1}
	for k, v := range want {
		if calls[k] != v {
			t.Errorf("%s recorded %d times, want %d (all: %v)", k, calls[k], v, calls)
		}
	}
}
