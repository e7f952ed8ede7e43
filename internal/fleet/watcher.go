package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/store"
)

// StatusSource asks a node for its status; the apiserver implements it
// over the node HTTP API, presenting the registration's secret. Status
// must return when ctx is done: the watcher gives each poll a deadline and
// a fixed number of workers.
type StatusSource interface {
	Status(ctx context.Context, node Registration) (api.Node, error)
}

// Config builds a Watcher. Zero fields take the defaults.
type Config struct {
	Store  store.Watcher
	Source StatusSource
	// PollInterval is how often each node is asked for its status
	// (default 1 s).
	PollInterval time.Duration
	// PollTimeout bounds one poll, so a slow node holds one worker for at
	// most that long (default PollInterval).
	PollTimeout time.Duration
	// MaxMissed polls failed in a row make a node unreachable (default 3):
	// with the defaults, a dead node is noticed within about 3 s.
	MaxMissed int
	// Workers poll concurrently (default 64). A round over n nodes of
	// which d do not answer takes about ceil(d/Workers) * PollTimeout on
	// top of the answering ones: size it for the failures to ride out.
	Workers int
	Log     *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.PollInterval <= 0 {
		c.PollInterval = time.Second
	}
	if c.PollTimeout <= 0 {
		c.PollTimeout = c.PollInterval
	}
	if c.MaxMissed <= 0 {
		c.MaxMissed = 3
	}
	if c.Workers <= 0 {
		c.Workers = 64
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	return c
}

// Watcher keeps the view of the fleet: registrations from a store watch,
// status from polls. It is safe for concurrent use.
type Watcher struct {
	table
	cfg Config
	log *slog.Logger

	jobs      chan *entry
	kick      chan struct{} // capacity 1: a node registered, poll it now
	synced    atomic.Bool   // the registrations have been read at least once
	ready     chan struct{}
	readyOnce sync.Once
	running   atomic.Bool
}

// New returns a Watcher; Run makes it work.
func New(cfg Config) (*Watcher, error) {
	if cfg.Store == nil || cfg.Source == nil {
		return nil, errdefs.Invalid("fleet: a watcher needs a store and a status source")
	}
	cfg = cfg.withDefaults()
	w := &Watcher{
		cfg:   cfg,
		log:   cfg.Log.With("component", "fleet"),
		jobs:  make(chan *entry),
		kick:  make(chan struct{}, 1),
		ready: make(chan struct{}),
	}
	w.init(cfg.MaxMissed)
	return w, nil
}

// Run follows registrations and polls nodes until ctx is done; then it
// returns nil once its goroutines (Workers + 2) have stopped. A Watcher
// runs once.
func (w *Watcher) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return errdefs.New(errdefs.ErrConflict, "", "fleet: watcher already ran")
	}
	var wg sync.WaitGroup
	for range w.cfg.Workers {
		wg.Go(func() { w.work(ctx) })
	}
	wg.Go(func() { w.follow(ctx) })
	w.dispatch(ctx)
	wg.Wait()
	return nil
}

// Ready is closed once the view is complete: the registrations have been
// read and every node registered then has been polled once, answered or
// not. An apiserver that places before that would see nodes without usage.
func (w *Watcher) Ready() <-chan struct{} { return w.ready }

// Lost reports whether sandboxes on node id should be reported lost: the
// node is unreachable, or no longer registered. Before the registrations
// have been read, nothing is lost.
func (w *Watcher) Lost(id string) bool {
	if !w.synced.Load() {
		return false
	}
	v, ok := w.Node(id)
	return !ok || v.Unreachable
}

// follow keeps the entries in step with the registrations, watching again
// whenever a watch ends.
func (w *Watcher) follow(ctx context.Context) {
	const minBackoff, maxBackoff = 100 * time.Millisecond, 5 * time.Second
	backoff := minBackoff
	for {
		ch, err := w.cfg.Store.Watch(ctx, Prefix)
		if err == nil {
			if w.consume(ch) {
				backoff = minBackoff
			}
		}
		if ctx.Err() != nil {
			return
		}
		w.log.Warn("node registrations: watch ended; watching again", "err", err, "after", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// consume applies one watch until it ends; it reports whether the watch got
// as far as its snapshot.
func (w *Watcher) consume(ch <-chan store.Event) (synced bool) {
	fresh := map[string]Registration{}
	for ev := range ch {
		switch ev.Type {
		case store.EventSynced:
			w.replace(fresh)
			fresh, synced = nil, true
		case store.EventPut:
			n, ok := w.decode(ev.KV)
			switch {
			case !ok:
			case synced:
				w.upsert(n)
			default:
				fresh[n.ID] = n
			}
		case store.EventDelete:
			if id := strings.TrimPrefix(ev.KV.Key, Prefix); synced {
				w.remove(id)
			}
		}
	}
	return synced
}

// decode reads a registration. The key names the node, whatever the value
// says; usage and health come from polls only.
func (w *Watcher) decode(kv store.KV) (Registration, bool) {
	id := strings.TrimPrefix(kv.Key, Prefix)
	var n Registration
	if err := json.Unmarshal(kv.Value, &n); err != nil || !validID(id) {
		w.log.Warn("node registrations: ignoring a malformed one", "key", kv.Key, "err", err)
		return Registration{}, false
	}
	n.ID = id
	n.Usage, n.Healthy = api.Capacity{}, false
	return n, true
}

// replace makes the entries exactly the registrations of a new snapshot,
// keeping the poll state of nodes that stay.
func (w *Watcher) replace(regs map[string]Registration) {
	w.mu.Lock()
	for id := range w.entries {
		if _, ok := regs[id]; !ok {
			delete(w.entries, id)
			w.log.Info("node deregistered", "node", id)
		}
	}
	for _, n := range regs {
		w.upsertLocked(n)
	}
	w.publishLocked()
	w.mu.Unlock()
	w.synced.Store(true)
	w.signal()
	w.checkReady()
}

func (w *Watcher) upsert(n Registration) {
	w.mu.Lock()
	w.upsertLocked(n)
	w.publishLocked()
	w.mu.Unlock()
	w.signal()
}

func (w *Watcher) upsertLocked(n Registration) {
	e := w.entries[n.ID]
	if e == nil {
		w.entries[n.ID] = &entry{id: n.ID, reg: n.Node, secret: n.Secret}
		w.log.Info("node registered", "node", n.ID, "address", n.Address, "pool", n.Pool)
		return
	}
	e.mu.Lock()
	e.reg, e.secret = n.Node, n.Secret
	e.mu.Unlock()
}

func (w *Watcher) remove(id string) {
	w.mu.Lock()
	if _, ok := w.entries[id]; ok {
		delete(w.entries, id)
		w.publishLocked()
		w.log.Info("node deregistered", "node", id)
	}
	w.mu.Unlock()
}

func (w *Watcher) signal() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// dispatch hands due nodes to the workers, and publishes usage changes,
// every tick until ctx is done.
func (w *Watcher) dispatch(ctx context.Context) {
	tick := min(max(w.cfg.PollInterval/10, 5*time.Millisecond), 100*time.Millisecond)
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		for _, e := range w.due(time.Now()) {
			select {
			case w.jobs <- e:
			case <-ctx.Done():
				return
			}
		}
		if w.dirty.Load() {
			w.publish()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-w.kick:
		}
	}
}

// due marks the nodes whose poll is due as polling and returns them.
func (w *Watcher) due(now time.Time) []*entry {
	w.mu.Lock()
	defer w.mu.Unlock()
	var due []*entry
	for _, e := range w.entries {
		e.mu.Lock()
		if !e.polling && !e.due.After(now) {
			e.polling = true
			due = append(due, e)
		}
		e.mu.Unlock()
	}
	return due
}

func (w *Watcher) work(ctx context.Context) {
	for {
		select {
		case e := <-w.jobs:
			w.poll(ctx, e)
		case <-ctx.Done():
			return
		}
	}
}

// poll asks one node for its status and records the answer or the miss.
func (w *Watcher) poll(ctx context.Context, e *entry) {
	e.mu.Lock()
	e.seq++
	seq, reg := e.seq, Registration{Node: e.reg, Secret: e.secret}
	e.mu.Unlock()

	start := time.Now()
	pctx, cancel := context.WithTimeout(ctx, w.cfg.PollTimeout)
	st, err := w.cfg.Source.Status(pctx, reg)
	cancel()
	if ctx.Err() != nil {
		e.mu.Lock()
		e.polling = false
		e.mu.Unlock()
		return // shutting down: not the node's fault
	}
	if err == nil && st.ID != reg.ID {
		err = fmt.Errorf("%s answered as node %q", reg.Address, st.ID)
	}

	e.mu.Lock()
	before := e.view(w.maxMissed)
	e.polling = false
	e.attempts++
	e.due = start.Add(w.cfg.PollInterval)
	if err == nil {
		e.answered(st, seq, time.Now())
	} else {
		e.missed++
	}
	after := e.view(w.maxMissed)
	e.mu.Unlock()

	switch {
	case after.Unreachable && !before.Unreachable:
		w.log.Warn("node unreachable", "node", e.id, "missed", after.Missed, "err", err)
	case before.Unreachable && !after.Unreachable:
		w.log.Info("node reachable again", "node", e.id)
	case err != nil && !errors.Is(err, context.DeadlineExceeded):
		w.log.Debug("node poll failed", "node", e.id, "missed", after.Missed, "err", err)
	}
	if shapeChanged(before, after) {
		w.publish() // placement must see health and capacity changes at once
	} else {
		w.dirty.Store(true)
	}
	w.checkReady()
}

// shapeChanged reports a change placement filters on.
func shapeChanged(a, b NodeView) bool {
	return a.Healthy != b.Healthy || a.Unreachable != b.Unreachable || a.Polled != b.Polled ||
		a.Capacity != b.Capacity || !slices.Equal(a.Backends, b.Backends) || !slices.Equal(a.Problems, b.Problems) ||
		a.DiskQuota != b.DiskQuota || a.Network != b.Network || !slices.Equal(a.Runtimes, b.Runtimes)
}

// checkReady closes Ready once every registered node has had a poll.
func (w *Watcher) checkReady() {
	if !w.synced.Load() {
		return
	}
	select {
	case <-w.ready:
		return
	default:
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, e := range w.entries {
		e.mu.Lock()
		polled := e.attempts > 0
		e.mu.Unlock()
		if !polled {
			return
		}
	}
	w.readyOnce.Do(func() {
		// A poll counts its attempt before it publishes its answer: publish
		// now, so that whoever waited for Ready sees every answer counted.
		w.publishLocked()
		close(w.ready)
	})
}
