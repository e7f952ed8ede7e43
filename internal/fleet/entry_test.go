package fleet

import (
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
)

// A poll that started before a create was committed may answer without
// the new sandbox: the commit must outlive it, and only it.
func TestCommitOutlivesEarlierPoll(t *testing.T) {
	var tb table
	tb.init(3)
	e := &entry{id: "a", reg: api.Node{ID: "a", Capacity: api.Capacity{CPU: 4, Sandboxes: 10}}}
	tb.entries["a"] = e
	tb.publish()
	one := api.Capacity{CPU: 1, Sandboxes: 1}

	e.seq++ // poll 1 starts
	first := e.seq
	if err := tb.Reserve("a", one); err != nil {
		t.Fatal(err)
	}
	tb.Commit("a", one)
	e.answered(api.Node{ID: "a", Capacity: e.reg.Capacity}, first, time.Now()) // without the sandbox
	if got := e.pending(); got != one {
		t.Fatalf("after a poll that started before the commit: pending %+v, want %+v", got, one)
	}
	e.seq++ // poll 2 starts after the commit
	e.answered(api.Node{ID: "a", Capacity: e.reg.Capacity, Usage: one}, e.seq, time.Now())
	if got := e.pending(); got != (api.Capacity{}) {
		t.Fatalf("after a poll that started after the commit: pending %+v, want none", got)
	}
	if got := e.used(); got != one {
		t.Fatalf("used: got %+v, want %+v", got, one)
	}
}
