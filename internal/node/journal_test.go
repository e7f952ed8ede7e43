package node

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
)

// The journal records each call on a sandbox in order, with how it ended
// and the ends of an exec's output; it survives a restart, is bounded,
// and goes with the sandbox.
func TestJournal(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a := newAgent(t, dir, nil)
	sb := mustCreate(t, a, api.CreateSandboxRequest{})
	big := strings.Repeat("a", 3000) + "THE-END"
	if _, err := a.Exec(ctx, sb.ID, api.ExecRequest{Argv: []string{"sh", "-c", "printf %s " + big + "; echo oops >&2; exit 3"}}, nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := a.WriteFile(ctx, sb.ID, "/f", 0o644, strings.NewReader("hello")); err != nil {
		t.Fatal(err)
	}
	if err := a.ReadFile(ctx, sb.ID, "/nope", &bytes.Buffer{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("ReadFile of a missing file: %v", err)
	}
	if _, err := a.Pause(ctx, sb.ID, PausedByCaller); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "true"}, nil, nil); err != nil { // resumes it
		t.Fatal(err)
	}

	check := func(a *Agent) {
		t.Helper()
		j, err := a.Journal(ctx, sb.ID, 0)
		if err != nil {
			t.Fatal(err)
		}
		var verbs []string
		for _, e := range j.Entries {
			verbs = append(verbs, e.Verb)
		}
		if got := strings.Join(verbs, ","); got != "exec,write_file,read_file,pause,resume,exec" {
			t.Fatalf("journal verbs: %s", got)
		}
		e := j.Entries[0]
		if e.Seq != 1 || e.ExitCode == nil || *e.ExitCode != 3 || e.StdoutBytes != int64(len(big)) ||
			len(e.StdoutHead) != api.JournalOutputBytes || !strings.HasSuffix(e.StdoutTail, "THE-END") || e.StderrHead != "oops\n" || e.Argv[0] != "sh" {
			t.Errorf("the exec's entry: %+v", e)
		}
		if w := j.Entries[1]; w.Path != "/f" || w.Bytes != 5 || w.Error != nil {
			t.Errorf("the write's entry: %+v", w)
		}
		if r := j.Entries[2]; r.Error == nil || r.Error.Code != api.CodeFileNotFound {
			t.Errorf("the failed read's entry: %+v", r)
		}
		if r := j.Entries[4]; r.By != "exec" {
			t.Errorf("the resume's entry: %+v", r)
		}
		if after, _ := a.Journal(ctx, sb.ID, 4); len(after.Entries) != 2 || after.Entries[0].Seq != 5 {
			t.Errorf("journal since 4: %+v", after.Entries)
		}
	}
	check(a)
	a.Close()
	a = newAgent(t, dir, nil)
	check(a) // across a restart
	if _, err := a.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "true"}, nil, nil); err != nil {
		t.Fatal(err)
	}
	if j, _ := a.Journal(ctx, sb.ID, 6); len(j.Entries) != 1 || j.Entries[0].Seq != 7 {
		t.Errorf("after a restart the sequence goes on: %+v", j.Entries)
	}

	// Bounded: the newest MaxJournalEntries, the rest counted.
	jr := a.journalFor(sb.ID)
	for i := 0; i < 2*api.MaxJournalEntries; i++ {
		if err := jr.add(api.JournalEntry{Verb: "stat", Path: "/x"}); err != nil {
			t.Fatal(err)
		}
	}
	j, err := a.Journal(ctx, sb.ID, 0)
	if err != nil || len(j.Entries) > 2*api.MaxJournalEntries || len(j.Entries) < api.MaxJournalEntries || j.Dropped == 0 ||
		j.Entries[len(j.Entries)-1].Seq != int64(7+2*api.MaxJournalEntries) || j.Entries[0].Seq != j.Dropped+1 {
		t.Errorf("a long journal: %d entries, dropped %d, %v", len(j.Entries), j.Dropped, err)
	}

	// Gone with the sandbox.
	path := jr.path
	if err := a.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("the journal of a deleted sandbox: %v", err)
	}
	if _, err := a.Journal(ctx, sb.ID, 0); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Journal of a deleted sandbox: %v", err)
	}
}
