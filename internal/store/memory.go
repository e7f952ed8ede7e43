package store

import (
	"context"
	"sort"
	"strings"
	"sync"

	"github.com/warrenhq/warren/internal/errdefs"
)

// Memory returns an in-process Store for tests. Versions behave like etcd
// mod revisions: one counter for the whole store, bumped by every write and
// by every delete of an existing key, so a key's Version never repeats even
// across a delete and re-create.
//
// It is also a Watcher: watches are fed synchronously with every write, and
// leases expire on timers.
func Memory() Store {
	return &memory{
		kv:       map[string]memEntry{},
		leases:   map[LeaseID]*memLease{},
		watchers: map[*memWatch]struct{}{},
	}
}

type memory struct {
	mu     sync.Mutex
	rev    int64
	kv     map[string]memEntry
	closed bool

	leases    map[LeaseID]*memLease
	lastLease LeaseID
	watchers  map[*memWatch]struct{}
}

type memEntry struct {
	value []byte
	rev   int64
	lease LeaseID // 0: none
}

var (
	_ Store   = (*memory)(nil)
	_ Watcher = (*memory)(nil)
)

// begin checks the arguments shared by every call and locks the store.
func (m *memory) begin(ctx context.Context, key string, isPrefix bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	check := checkKey
	if isPrefix {
		check = checkPrefix
	}
	if err := check(key); err != nil {
		return err
	}
	return m.lock(ctx)
}

// lock locks the store unless ctx is done or the store is closed.
func (m *memory) lock(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return errdefs.Unavailable("memory store is closed")
	}
	return nil
}

func (m *memory) Get(ctx context.Context, key string) (KV, error) {
	if err := m.begin(ctx, key, false); err != nil {
		return KV{}, err
	}
	defer m.mu.Unlock()
	e, ok := m.kv[key]
	if !ok {
		return KV{}, notFound(key)
	}
	return KV{Key: key, Value: clone(e.value), Version: e.rev}, nil
}

func (m *memory) List(ctx context.Context, prefix string) ([]KV, error) {
	if err := m.begin(ctx, prefix, true); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	out := []KV{}
	for k, e := range m.kv {
		if strings.HasPrefix(k, prefix) {
			out = append(out, KV{Key: k, Value: clone(e.value), Version: e.rev})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

func (m *memory) Put(ctx context.Context, key string, value []byte) error {
	if err := m.begin(ctx, key, false); err != nil {
		return err
	}
	defer m.mu.Unlock()
	m.set(key, value)
	return nil
}

func (m *memory) Create(ctx context.Context, key string, value []byte) error {
	return m.CompareAndPut(ctx, key, value, 0)
}

func (m *memory) CompareAndPut(ctx context.Context, key string, value []byte, version int64) error {
	if version < 0 {
		return errdefs.Invalid("store version %d is negative", version)
	}
	if err := m.begin(ctx, key, false); err != nil {
		return err
	}
	defer m.mu.Unlock()
	if m.kv[key].rev != version { // an absent key has rev 0
		return conflict(key)
	}
	m.set(key, value)
	return nil
}

func (m *memory) Delete(ctx context.Context, key string) error {
	if err := m.begin(ctx, key, false); err != nil {
		return err
	}
	defer m.mu.Unlock()
	m.remove(key)
	return nil
}

func (m *memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	for _, l := range m.leases {
		l.timer.Stop()
	}
	for w := range m.watchers {
		w.stop()
	}
	clear(m.watchers)
	return nil
}

// set stores a copy of value at a new revision, with no lease; m.mu is
// held.
func (m *memory) set(key string, value []byte) {
	m.setLeased(key, value, 0)
}

// setLeased stores a copy of value at a new revision, attached to lease (0:
// none), and tells the watchers; m.mu is held.
func (m *memory) setLeased(key string, value []byte, lease LeaseID) {
	m.detach(key)
	m.rev++
	m.kv[key] = memEntry{value: clone(value), rev: m.rev, lease: lease}
	if l := m.leases[lease]; l != nil {
		l.keys[key] = struct{}{}
	}
	m.notify(Event{Type: EventPut, KV: KV{Key: key, Value: value, Version: m.rev}})
}

// remove deletes key if present and tells the watchers; m.mu is held.
func (m *memory) remove(key string) {
	if _, ok := m.kv[key]; !ok {
		return
	}
	m.detach(key)
	m.rev++
	delete(m.kv, key)
	m.notify(Event{Type: EventDelete, KV: KV{Key: key, Value: []byte{}, Version: m.rev}})
}

// detach takes key off the lease it is attached to; m.mu is held.
func (m *memory) detach(key string) {
	if l := m.leases[m.kv[key].lease]; l != nil {
		delete(l.keys, key)
	}
}

// clone copies b so callers never share memory with the store; the result
// is non-nil so an empty value reads back as []byte{} like etcd's.
func clone(b []byte) []byte {
	return append([]byte{}, b...)
}
