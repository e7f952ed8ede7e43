package node

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sort"
	"sync/atomic"

	"github.com/warrenhq/warren/api"
)

// Changes is what a node's list looks like now, told relative to an
// earlier Changes: the sandboxes added or changed since then, and the ids
// deleted since then. Full means Sandboxes is the whole list (the earlier
// point is unknown here or too old): replace, do not merge.
//
// An apiserver that keeps every node's sandboxes (for quota usage and for
// reporting a vanished node's sandboxes lost) re-reads each node every few
// seconds; with Changes that costs what changed, not what exists.
type Changes struct {
	// Epoch names this agent process: revisions of another one mean
	// nothing here.
	Epoch string `json:"epoch"`
	// Rev is the point this answer brings the caller to; pass it (with
	// Epoch) to the next call.
	Rev       uint64        `json:"rev"`
	Full      bool          `json:"full,omitempty"`
	Sandboxes []api.Sandbox `json:"sandboxes"`
	Deleted   []string      `json:"deleted,omitempty"`
}

// changeLog numbers every change a list would show. Every sandbox carries
// the revision of its last change; deleted ones leave a tombstone.
type changeLog struct {
	epoch string
	rev   atomic.Uint64
	// Guarded by Agent.mu, in revision order.
	tombs []tombstone
	// floor: tombstones of revisions up to floor may have been dropped, so
	// changes since an earlier revision cannot be told.
	floor uint64
}

type tombstone struct {
	id  string
	rev uint64
}

// maxTombstones bounds the deletes remembered; a caller further behind
// than that gets a full list.
const maxTombstones = 1 << 16

func newChangeLog() changeLog {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return changeLog{epoch: hex.EncodeToString(b[:])}
}

// next returns a new revision. The change it numbers must be visible
// (under the lock a reader takes) by the time next is called: a reader
// that has read the counter past it then sees the change.
func (l *changeLog) next() uint64 { return l.rev.Add(1) }

// buried records a deleted sandbox; Agent.mu is held.
func (l *changeLog) buried(id string) {
	l.tombs = append(l.tombs, tombstone{id: id, rev: l.next()})
	if len(l.tombs) > maxTombstones {
		drop := len(l.tombs) / 2
		l.floor = l.tombs[drop-1].rev
		l.tombs = append(l.tombs[:0], l.tombs[drop:]...)
	}
}

// changed numbers a change of s's view; s.mu is held, and the view has
// changed already.
func (s *sandbox) changed() { s.rev = s.log.next() }

// Changes returns the node's sandboxes changed or deleted since revision
// since of epoch, or all of them (Full) when since is 0, epoch is not this
// agent's, or since is too old. Cost: a walk over the sandboxes and a copy
// of each changed one.
func (a *Agent) Changes(ctx context.Context, epoch string, since uint64) (Changes, error) {
	l := &a.changes
	ch := Changes{Epoch: l.epoch, Rev: l.rev.Load(), Sandboxes: []api.Sandbox{}}
	a.mu.Lock()
	ch.Full = epoch != l.epoch || since == 0 || since < l.floor || since > ch.Rev
	all := make([]*sandbox, 0, len(a.sandboxes))
	for _, s := range a.sandboxes {
		all = append(all, s)
	}
	if !ch.Full {
		i := sort.Search(len(l.tombs), func(i int) bool { return l.tombs[i].rev > since })
		for _, t := range l.tombs[i:] {
			ch.Deleted = append(ch.Deleted, t.id)
		}
	}
	a.mu.Unlock()
	for _, s := range all {
		s.mu.Lock()
		fresh := ch.Full || s.rev > since
		s.mu.Unlock()
		if fresh {
			ch.Sandboxes = append(ch.Sandboxes, s.snapshot())
		}
	}
	sort.Slice(ch.Sandboxes, func(i, j int) bool {
		a, b := ch.Sandboxes[i], ch.Sandboxes[j]
		if !a.CreatedAt.Equal(b.CreatedAt) {
			return a.CreatedAt.Before(b.CreatedAt)
		}
		return a.ID < b.ID
	})
	return ch, nil
}
