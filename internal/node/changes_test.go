package node

import (
	"context"
	"slices"
	"sort"
	"testing"

	"github.com/warrenhq/warren/api"
)

// sortedIDs returns the ids of sbs, sorted.
func sortedIDs(sbs []api.Sandbox) []string {
	out := ids(sbs)
	sort.Strings(out)
	return out
}

func sorted(s ...string) []string {
	s = slices.Clone(s)
	sort.Strings(s)
	return s
}

func TestChanges(t *testing.T) {
	ctx := context.Background()
	a := newAgent(t, t.TempDir(), nil)
	first := mustCreate(t, a, api.CreateSandboxRequest{})
	second := mustCreate(t, a, api.CreateSandboxRequest{})

	full, err := a.Changes(ctx, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if !full.Full || full.Epoch == "" || full.Rev == 0 || len(full.Deleted) != 0 {
		t.Fatalf("first call: full %v epoch %q rev %d deleted %v; want a full list", full.Full, full.Epoch, full.Rev, full.Deleted)
	}
	if got, want := sortedIDs(full.Sandboxes), sorted(first.ID, second.ID); !slices.Equal(got, want) {
		t.Fatalf("full list %v, want %v", got, want)
	}

	// Nothing happened: nothing to tell.
	same, _ := a.Changes(ctx, full.Epoch, full.Rev)
	if same.Full || len(same.Sandboxes) != 0 || len(same.Deleted) != 0 || same.Rev != full.Rev {
		t.Fatalf("no change: got %+v", same)
	}

	// A create, a delete and an exec (which touches its sandbox).
	third := mustCreate(t, a, api.CreateSandboxRequest{})
	if err := a.Delete(ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Exec(ctx, second.ID, api.ExecRequest{Argv: []string{"true"}}, nil, nil); err != nil {
		t.Fatal(err)
	}
	delta, _ := a.Changes(ctx, full.Epoch, full.Rev)
	if delta.Full {
		t.Fatal("delta answered as a full list")
	}
	if got, want := sortedIDs(delta.Sandboxes), sorted(second.ID, third.ID); !slices.Equal(got, want) {
		t.Errorf("changed %v, want %v", got, want)
	}
	if !slices.Equal(delta.Deleted, []string{first.ID}) {
		t.Errorf("deleted %v, want [%s]", delta.Deleted, first.ID)
	}
	if delta.Rev <= full.Rev {
		t.Errorf("rev went from %d to %d", full.Rev, delta.Rev)
	}

	// Another process's revisions mean nothing here.
	other, _ := a.Changes(ctx, "someone-else", delta.Rev)
	if !other.Full || !slices.Equal(sortedIDs(other.Sandboxes), sorted(second.ID, third.ID)) {
		t.Errorf("foreign epoch: full %v, %v", other.Full, sortedIDs(other.Sandboxes))
	}
}

func TestChangesAfterTombstonesDropped(t *testing.T) {
	ctx := context.Background()
	a := newAgent(t, t.TempDir(), nil)
	kept := mustCreate(t, a, api.CreateSandboxRequest{})
	start, _ := a.Changes(ctx, "", 0)

	// More deletes than are remembered: an old cursor gets a full list.
	a.mu.Lock()
	for i := 0; i <= maxTombstones; i++ {
		a.changes.buried("gone")
	}
	a.mu.Unlock()
	ch, _ := a.Changes(ctx, start.Epoch, start.Rev)
	if !ch.Full || !slices.Equal(sortedIDs(ch.Sandboxes), []string{kept.ID}) || len(ch.Deleted) != 0 {
		t.Fatalf("behind the tombstones: full %v, sandboxes %v, %d deleted; want a full list", ch.Full, sortedIDs(ch.Sandboxes), len(ch.Deleted))
	}
	// A recent cursor still gets a delta.
	recent, _ := a.Changes(ctx, ch.Epoch, ch.Rev)
	if recent.Full || len(recent.Sandboxes) != 0 || len(recent.Deleted) != 0 {
		t.Fatalf("recent cursor: %+v", recent)
	}
}

func TestChangesSurviveRestart(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a := newAgent(t, dir, nil)
	sb := mustCreate(t, a, api.CreateSandboxRequest{})
	before, _ := a.Changes(ctx, "", 0)
	a.Close()

	// A new agent process re-adopts the sandbox under a new epoch: an old
	// cursor gets the whole list, not a delta of another numbering.
	b := newAgent(t, dir, nil)
	after, _ := b.Changes(ctx, before.Epoch, before.Rev)
	if after.Epoch == before.Epoch || !after.Full || !slices.Equal(sortedIDs(after.Sandboxes), []string{sb.ID}) {
		t.Fatalf("after restart: epoch %q (was %q), full %v, %v", after.Epoch, before.Epoch, after.Full, sortedIDs(after.Sandboxes))
	}
}

// Folding every delta into the first full list gives the node's list, also
// while creates and deletes race with the calls.
func TestChangesFoldToList(t *testing.T) {
	ctx := context.Background()
	a := newAgent(t, t.TempDir(), nil)
	view := map[string]api.Sandbox{}
	var cur Changes
	fold := func() {
		ch, err := a.Changes(ctx, cur.Epoch, cur.Rev)
		if err != nil {
			t.Error(err)
			return
		}
		if ch.Full {
			clear(view)
		}
		for _, sb := range ch.Sandboxes {
			view[sb.ID] = sb
		}
		for _, id := range ch.Deleted {
			delete(view, id)
		}
		cur = ch
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var prev string
		for range 100 {
			sb, err := a.Create(ctx, api.CreateSandboxRequest{Image: "busybox", Resources: api.Resources{CPU: 0.01, Memory: 16 << 20}})
			if err != nil {
				t.Error(err)
				return
			}
			if prev != "" {
				a.Delete(ctx, prev)
			}
			prev = sb.ID
		}
	}()
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
			fold()
		}
	}
	fold()
	list, _ := a.List(ctx, Filter{})
	if got, want := sortedIDs(mapValues(view)), sortedIDs(list); !slices.Equal(got, want) {
		t.Fatalf("folded changes hold %v, the list %v", got, want)
	}
	for _, sb := range list {
		if view[sb.ID].State != sb.State {
			t.Errorf("%s: folded state %q, listed %q", sb.ID, view[sb.ID].State, sb.State)
		}
	}
}

func mapValues(m map[string]api.Sandbox) []api.Sandbox {
	var out []api.Sandbox
	for _, v := range m {
		out = append(out, v)
	}
	return out
}
