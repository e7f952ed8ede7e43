package node

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/httperr"
)

// The journal. The node records every call on a sandbox (what was asked,
// when, how long it took, how it ended, the head and tail of an exec's
// output) in a file of its own next to the sandbox's record, outside
// anything the sandbox can reach. A trainer that comes back after being
// preempted reads it (GET /v1/sandboxes/{id}/journal) to rebuild what
// happened in each rollout. It survives agent restarts, is bounded (the
// newest api.MaxJournalEntries), and goes with the sandbox.

// journal is one sandbox's journal file. Appends are one write each
// (O_APPEND); past twice the bound the file is rewritten with the newest
// api.MaxJournalEntries.
type journal struct {
	mu      sync.Mutex
	path    string
	seq     int64 // the last entry's
	lines   int   // in the file
	dropped int64 // entries no longer kept
}

// journalFor opens (or, after a restart, reads the end of) sandbox id's
// journal.
func (a *Agent) journalFor(id string) *journal {
	a.mu.Lock()
	defer a.mu.Unlock()
	if j, ok := a.journals[id]; ok {
		return j
	}
	j := &journal{path: a.recordPath(id) + ".journal"}
	j.load()
	a.journals[id] = j
	return j
}

// load finds the last sequence number and the line count of an existing
// file.
func (j *journal) load() {
	f, err := os.Open(j.path)
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var e struct {
			Seq int64 `json:"seq"`
		}
		if json.Unmarshal(sc.Bytes(), &e) == nil {
			if j.lines == 0 {
				j.dropped = e.Seq - 1
			}
			j.seq = e.Seq
			j.lines++
		}
	}
}

// add appends e with the next sequence number. A journal that cannot be
// written is logged, never an error of the call.
func (j *journal) add(e api.JournalEntry) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.seq++
	e.Seq = j.seq
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(j.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(append(b, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	j.lines++
	if j.lines > 2*api.MaxJournalEntries {
		return j.compact()
	}
	return nil
}

// compact rewrites the file with its newest api.MaxJournalEntries lines.
func (j *journal) compact() error {
	b, err := os.ReadFile(j.path)
	if err != nil {
		return err
	}
	lines := bytes.SplitAfter(b, []byte("\n"))
	if n := len(lines); n > 0 && len(lines[n-1]) == 0 {
		lines = lines[:n-1]
	}
	drop := len(lines) - api.MaxJournalEntries
	if drop <= 0 {
		return nil
	}
	tmp := j.path + ".tmp"
	if err := os.WriteFile(tmp, bytes.Join(lines[drop:], nil), 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, j.path); err != nil {
		return err
	}
	j.lines -= drop
	j.dropped += int64(drop)
	return nil
}

// read returns the entries after since.
func (j *journal) read(since int64) (api.Journal, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	out := api.Journal{Entries: []api.JournalEntry{}, Dropped: j.dropped}
	f, err := os.Open(j.path)
	if errors.Is(err, os.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return out, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var e api.JournalEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Seq <= since {
			continue
		}
		out.Entries = append(out.Entries, e)
	}
	return out, sc.Err()
}

// Journal returns sandbox id's journal after entry since.
func (a *Agent) Journal(ctx context.Context, id string, since int64) (api.Journal, error) {
	if _, err := a.lookup(id); err != nil {
		return api.Journal{}, err
	}
	j, err := a.journalFor(id).read(since)
	j.Sandbox = id
	return j, err
}

// record adds a call to sandbox id's journal: e with its duration from
// start and, for a failed call, its error.
func (a *Agent) record(id string, start time.Time, e api.JournalEntry, err error) {
	e.Time = start.UTC()
	e.DurationMS = float64(time.Since(start).Microseconds()) / 1000
	if err != nil {
		_, ae := httperr.ToAPI(err)
		e.Error = &ae
	}
	a.mu.Lock()
	_, live := a.sandboxes[id]
	a.mu.Unlock()
	if !live {
		return // ended meanwhile: its journal went with it
	}
	if werr := a.journalFor(id).add(e); werr != nil {
		a.log.Warn("journal", "sandbox", id, "err", werr)
	}
}

// forgetJournal removes a sandbox's journal with the sandbox.
func (a *Agent) forgetJournal(id string) {
	a.mu.Lock()
	j := a.journals[id]
	delete(a.journals, id)
	a.mu.Unlock()
	path := a.recordPath(id) + ".journal"
	if j != nil {
		j.mu.Lock()
		defer j.mu.Unlock()
	}
	os.Remove(path)
}

// headTail keeps the first and last n bytes written through it.
type headTail struct {
	n          int
	head, tail []byte
	total      int64
}

func (h *headTail) Write(p []byte) (int, error) {
	n := len(p)
	h.total += int64(n)
	if room := h.n - len(h.head); room > 0 {
		k := min(room, len(p))
		h.head = append(h.head, p[:k]...)
		p = p[k:]
	}
	if len(p) > 0 {
		h.tail = append(h.tail, p...)
		if len(h.tail) > h.n {
			h.tail = append(h.tail[:0:0], h.tail[len(h.tail)-h.n:]...)
		}
	}
	return n, nil
}

// strings returns the head and tail as valid UTF-8 (bytes that are not
// are replaced).
func (h *headTail) strings() (string, string) {
	return strings.ToValidUTF8(string(h.head), string(utf8.RuneError)), strings.ToValidUTF8(string(h.tail), string(utf8.RuneError))
}
