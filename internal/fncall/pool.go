package fncall

import (
	"context"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
)

// PoolConfig sizes one runtime's pool of pre-created containers.
type PoolConfig struct {
	// Min containers are kept ready at all times once the runtime is
	// available (default 2; negative: none); under demand the pool grows to cover the calls in flight
	// over the last DemandWindow, up to Max containers in all (ready, busy
	// and being made). Ready containers beyond that target and idle for
	// IdleTimeout are destroyed.
	Min          int          `json:"min"`
	Max          int          `json:"max"`
	IdleTimeout  api.Duration `json:"idle_timeout,omitempty"`
	DemandWindow api.Duration `json:"demand_window,omitempty"`
	// QueueWait is how long a call waits for a container when the pool is
	// at Max before it is refused with 429; QueueMax calls may wait at
	// once, more are refused at once.
	QueueWait api.Duration `json:"queue_wait,omitempty"`
	QueueMax  int          `json:"queue_max,omitempty"`
}

func (c PoolConfig) withDefaults() PoolConfig {
	if c.Max <= 0 {
		c.Max = 64
	}
	if c.Min == 0 {
		c.Min = 2
	}
	c.Min = min(max(c.Min, 0), c.Max) // a negative Min keeps none ready
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = api.Duration(60 * time.Second)
	}
	if c.DemandWindow <= 0 {
		c.DemandWindow = api.Duration(10 * time.Second)
	}
	if c.QueueWait <= 0 {
		c.QueueWait = api.Duration(5 * time.Second)
	}
	if c.QueueMax <= 0 {
		c.QueueMax = 4 * c.Max
	}
	return c
}

// makers is how many containers a pool makes at once: starting one costs a
// few milliseconds of CPU, so a couple per pool keep up without starving
// the calls themselves.
const makers = 2

// pool keeps a runtime's pre-created containers. get hands each container
// to exactly one call; the call destroys it afterwards (put does, in the
// background) and the pool makes new ones to stay at its target.
type pool struct {
	cfg  PoolConfig
	spec func() (boxSpec, error) // nil error once the runtime is available
	log  func(msg string, args ...any)

	mu        sync.Mutex
	ready     []*box
	making    int
	busy      int
	waiting   int
	peak      int       // most calls in flight within the window
	peakSince time.Time // start of the window peak belongs to
	lastUse   time.Time
	avail     chan struct{} // closed (and replaced) when a container gets ready
	kick      chan struct{}
	closed    bool
	wg        sync.WaitGroup // the maker and the containers it is making
	destroys  sync.WaitGroup // containers being destroyed after their call
}

func newPool(cfg PoolConfig, spec func() (boxSpec, error), log func(string, ...any)) *pool {
	return &pool{
		cfg: cfg.withDefaults(), spec: spec, log: log,
		avail: make(chan struct{}), kick: make(chan struct{}, 1),
		peakSince: time.Now(), lastUse: time.Now(),
	}
}

// start runs the pool's maker until ctx ends.
func (p *pool) start(ctx context.Context) {
	p.wg.Add(1)
	go p.maintain(ctx)
}

// get claims a ready container, or makes one if the pool has room, or waits
// QueueWait for one; past that, or with QueueMax calls already waiting, it
// is refused with 429.
func (p *pool) get(ctx context.Context) (*box, error) {
	p.mu.Lock()
	p.lastUse = time.Now()
	if b := p.popLocked(); b != nil {
		p.mu.Unlock()
		p.wake()
		return b, nil
	}
	if p.total() < p.cfg.Max {
		p.making++
		p.mu.Unlock()
		p.wake() // make more for those who come next
		spec, err := p.spec()
		var b *box
		if err == nil {
			b, err = newBox(ctx, spec)
		}
		p.mu.Lock()
		p.making--
		if err == nil {
			p.claimLocked()
		}
		p.mu.Unlock()
		return b, err
	}
	if p.waiting >= p.cfg.QueueMax {
		p.mu.Unlock()
		return nil, overloaded()
	}
	p.waiting++
	defer func() { p.mu.Lock(); p.waiting--; p.mu.Unlock() }()
	t := time.NewTimer(p.cfg.QueueWait.D())
	defer t.Stop()
	for {
		avail := p.avail
		p.mu.Unlock()
		p.wake()
		select {
		case <-avail:
		case <-t.C:
			return nil, overloaded()
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		p.mu.Lock()
		if b := p.popLocked(); b != nil {
			p.mu.Unlock()
			p.wake()
			return b, nil
		}
	}
}

// popLocked claims the newest live ready container, or returns nil.
func (p *pool) popLocked() *box {
	for len(p.ready) > 0 {
		b := p.ready[len(p.ready)-1]
		p.ready = p.ready[:len(p.ready)-1]
		if !b.alive() { // died while waiting: drop it, try the next
			go b.destroy()
			continue
		}
		p.claimLocked()
		return b
	}
	return nil
}

func overloaded() error {
	return errdefs.Exhausted(api.CodeFnOverloaded, time.Second, "every container of this runtime is busy; retry later")
}

func (p *pool) total() int { return len(p.ready) + p.making + p.busy }

func (p *pool) claimLocked() {
	p.busy++
	now := time.Now()
	if now.Sub(p.peakSince) > p.cfg.DemandWindow.D() {
		p.peak, p.peakSince = 0, now
	}
	p.peak = max(p.peak, p.busy)
}

// put ends a call's use of its container: it is destroyed, never reused.
func (p *pool) put(b *box) {
	p.mu.Lock()
	p.busy--
	p.mu.Unlock()
	p.destroys.Add(1)
	go func() {
		defer p.destroys.Done()
		if err := b.destroy(); err != nil {
			p.log("fncall: destroy container", "box", b.id, "err", err)
		}
		p.wake()
	}()
}

func (p *pool) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// target is how many ready containers the pool wants now.
func (p *pool) targetLocked() int {
	want := max(p.cfg.Min, p.peak-p.busy+p.waiting, p.waiting)
	if time.Since(p.peakSince) > p.cfg.DemandWindow.D() {
		want = max(p.cfg.Min, p.waiting)
	}
	return min(want, p.cfg.Max-p.busy)
}

// maintain makes containers up to the target and trims idle ones.
func (p *pool) maintain(ctx context.Context) {
	defer p.wg.Done()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	sem := make(chan struct{}, makers)
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		case <-tick.C:
			p.trim()
		}
		for {
			p.mu.Lock()
			need := p.targetLocked() - len(p.ready) - p.making
			if need <= 0 || p.total() >= p.cfg.Max || p.closed {
				p.mu.Unlock()
				break
			}
			p.making++
			p.mu.Unlock()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				p.mu.Lock()
				p.making--
				p.mu.Unlock()
				return
			}
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				defer func() { <-sem }()
				p.make(ctx)
			}()
		}
	}
}

// make creates one container and adds it to the ready list.
func (p *pool) make(ctx context.Context) {
	spec, err := p.spec()
	if err != nil { // the runtime is unavailable: Runtimes says why
		p.mu.Lock()
		p.making--
		p.mu.Unlock()
		return
	}
	b, err := newBox(ctx, spec)
	p.mu.Lock()
	p.making--
	p.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			p.log("fncall: make container", "err", err)
		}
		time.Sleep(100 * time.Millisecond) // don't spin on a broken runtime
		return
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		b.destroy()
		return
	}
	p.ready = append(p.ready, b)
	close(p.avail) // wake the waiting calls; one of them takes it
	p.avail = make(chan struct{})
	p.mu.Unlock()
	p.wake()
}

// trim destroys ready containers beyond the target that have waited longer
// than IdleTimeout: the oldest first.
func (p *pool) trim() {
	p.mu.Lock()
	var drop []*box
	if time.Since(p.lastUse) > p.cfg.IdleTimeout.D() {
		keep := max(p.targetLocked(), 0)
		for len(p.ready) > keep && time.Since(p.ready[0].created) > p.cfg.IdleTimeout.D() {
			drop = append(drop, p.ready[0])
			p.ready = p.ready[1:]
		}
	}
	p.mu.Unlock()
	for _, b := range drop {
		b.destroy()
	}
}

// stats reports ready and busy containers.
func (p *pool) stats() (ready, busy int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ready), p.busy
}

// close stops making containers and destroys the ready ones; busy ones are
// destroyed by their calls.
func (p *pool) close() {
	p.mu.Lock()
	p.closed = true
	ready := p.ready
	p.ready = nil
	p.mu.Unlock()
	p.wg.Wait()
	for _, b := range ready {
		b.destroy()
	}
	p.destroys.Wait()
}

// slots bound the calls running at once on a node: a call waits for one up
// to wait, with at most queue calls waiting, and is refused with 429
// otherwise.
type slots struct {
	free  chan struct{}
	queue chan struct{}
	wait  time.Duration
}

func newSlots(n, queue int, wait time.Duration) *slots {
	return &slots{free: make(chan struct{}, n), queue: make(chan struct{}, queue), wait: wait}
}

func (s *slots) acquire(ctx context.Context) (release func(), err error) {
	release = func() { <-s.free }
	select {
	case s.free <- struct{}{}:
		return release, nil
	default:
	}
	select {
	case s.queue <- struct{}{}:
	default:
		return nil, overloaded()
	}
	defer func() { <-s.queue }()
	t := time.NewTimer(s.wait)
	defer t.Stop()
	select {
	case s.free <- struct{}{}:
		return release, nil
	case <-t.C:
		return nil, overloaded()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
