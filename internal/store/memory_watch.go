package store

import (
	"context"
	"sort"
	"strings"
	"sync"
	"time"
)

// memWatch is one watch on a memory store. Writers append to its queue
// under the store lock and never block on a slow reader; its goroutine
// forwards the queue to the caller's channel.
type memWatch struct {
	prefix string
	wake   chan struct{} // capacity 1: "the queue changed"

	mu      sync.Mutex
	queue   []Event
	stopped bool // the store was closed
}

type memLease struct {
	ttl      time.Duration
	deadline time.Time
	timer    *time.Timer
	keys     map[string]struct{}
}

func (m *memory) Watch(ctx context.Context, prefix string) (<-chan Event, error) {
	if err := m.begin(ctx, prefix, true); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	w := &memWatch{prefix: prefix, wake: make(chan struct{}, 1)}
	keys := make([]string, 0)
	for k := range m.kv {
		if strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		e := m.kv[k]
		w.queue = append(w.queue, Event{Type: EventPut, KV: KV{Key: k, Value: clone(e.value), Version: e.rev}})
	}
	w.queue = append(w.queue, Event{Type: EventSynced, KV: KV{Version: m.rev}})
	m.watchers[w] = struct{}{}
	out := make(chan Event)
	go func() {
		w.forward(ctx, out)
		m.mu.Lock()
		delete(m.watchers, w)
		m.mu.Unlock()
	}()
	return out, nil
}

// forward sends the queue to out in order until ctx is done or the store
// is closed, then closes out.
func (w *memWatch) forward(ctx context.Context, out chan<- Event) {
	defer close(out)
	for {
		w.mu.Lock()
		q, stopped := w.queue, w.stopped
		w.queue = nil
		w.mu.Unlock()
		if stopped {
			return
		}
		for _, ev := range q {
			select {
			case out <- ev:
			case <-ctx.Done():
				return
			}
		}
		if len(q) > 0 {
			continue
		}
		select {
		case <-w.wake:
		case <-ctx.Done():
			return
		}
	}
}

func (w *memWatch) push(ev Event) {
	ev.KV.Value = clone(ev.KV.Value) // each reader owns its copy
	w.mu.Lock()
	w.queue = append(w.queue, ev)
	w.mu.Unlock()
	w.signal()
}

func (w *memWatch) stop() {
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
	w.signal()
}

func (w *memWatch) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// notify queues ev for every watch whose prefix covers its key; m.mu is
// held.
func (m *memory) notify(ev Event) {
	for w := range m.watchers {
		if strings.HasPrefix(ev.KV.Key, w.prefix) {
			w.push(ev)
		}
	}
}

func (m *memory) PutWithLease(ctx context.Context, key string, value []byte, ttl time.Duration) (LeaseID, error) {
	if err := checkTTL(ttl); err != nil {
		return 0, err
	}
	if err := m.begin(ctx, key, false); err != nil {
		return 0, err
	}
	defer m.mu.Unlock()
	m.lastLease++
	id := m.lastLease
	l := &memLease{ttl: ttl, deadline: time.Now().Add(ttl), keys: map[string]struct{}{}}
	l.timer = time.AfterFunc(ttl, func() { m.expire(id) })
	m.leases[id] = l
	m.setLeased(key, value, id)
	return id, nil
}

func (m *memory) KeepAlive(ctx context.Context, id LeaseID) error {
	if err := m.lock(ctx); err != nil {
		return err
	}
	defer m.mu.Unlock()
	l := m.leases[id]
	if l == nil {
		return leaseNotFound(id)
	}
	l.deadline = time.Now().Add(l.ttl)
	l.timer.Reset(l.ttl)
	return nil
}

func (m *memory) Revoke(ctx context.Context, id LeaseID) error {
	if err := m.lock(ctx); err != nil {
		return err
	}
	defer m.mu.Unlock()
	if l := m.leases[id]; l != nil {
		m.revoke(id, l)
	}
	return nil
}

// expire revokes lease id if it is past its deadline. A timer that fired
// while KeepAlive was resetting it finds a later deadline and re-arms.
func (m *memory) expire(id LeaseID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.leases[id]
	if l == nil || m.closed {
		return
	}
	if left := time.Until(l.deadline); left > 0 {
		l.timer.Reset(left)
		return
	}
	m.revoke(id, l)
}

// revoke ends a lease and deletes its keys; m.mu is held.
func (m *memory) revoke(id LeaseID, l *memLease) {
	l.timer.Stop()
	delete(m.leases, id)
	keys := make([]string, 0, len(l.keys))
	for k := range l.keys {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		m.remove(k)
	}
}
