package apiserver

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/fleet"
)

// TraceRecorder keeps a prefetch trace a node reported as its layer's,
// unless the layer has one (image.Registry.RecordTrace); ErrInvalid for
// a trace that is not one of that layer.
type TraceRecorder func(ctx context.Context, layer, trace, node string) (bool, error)

// RecordTraces returns src with the prefetch traces that nodes list in
// their status (api.Node.PrefetchTraces) handed to rec: each one once
// per process, in the background, so that a poll never waits for the
// store. A trace rec fails to record for a reason other than its being
// invalid or missing is tried again at a later poll (nodes list a trace
// for minutes).
func RecordTraces(src fleet.StatusSource, rec TraceRecorder, log *slog.Logger) fleet.StatusSource {
	if log == nil {
		log = slog.Default()
	}
	return &traceSource{StatusSource: src, rec: rec, log: log, seen: map[string]bool{}, slots: make(chan struct{}, traceRecords)}
}

// traceRecords bounds the records in flight; maxSeenTraces bounds what
// a process remembers having recorded (then it starts over: a trace
// recorded already costs one store read to find so).
const (
	traceRecords  = 4
	maxSeenTraces = 8192
)

type traceSource struct {
	fleet.StatusSource
	rec   TraceRecorder
	log   *slog.Logger
	slots chan struct{}

	mu   sync.Mutex
	seen map[string]bool // layer + " " + trace: recorded, being recorded, or invalid
}

func (s *traceSource) Status(ctx context.Context, n fleet.Registration) (api.Node, error) {
	st, err := s.StatusSource.Status(ctx, n)
	if err == nil {
		for _, t := range st.PrefetchTraces {
			s.offer(n.ID, t)
		}
	}
	return st, err
}

func (s *traceSource) offer(node string, t api.LayerTrace) {
	key := t.Layer + " " + t.Trace
	s.mu.Lock()
	if s.seen[key] {
		s.mu.Unlock()
		return
	}
	select {
	case s.slots <- struct{}{}:
	default:
		s.mu.Unlock()
		return // busy: the next poll offers it again
	}
	if len(s.seen) >= maxSeenTraces {
		clear(s.seen)
	}
	s.seen[key] = true
	s.mu.Unlock()
	go func() {
		defer func() { <-s.slots }()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := s.rec(ctx, t.Layer, t.Trace, node)
		switch {
		case err == nil:
		case errors.Is(err, errdefs.ErrInvalid) || errors.Is(err, errdefs.ErrNotFound):
			s.log.Warn("a node reported a prefetch trace that is not one of a layer in the blob store; ignored", "node", node, "layer", t.Layer, "trace", t.Trace, "err", err)
		default:
			s.log.Warn("prefetch trace not recorded; trying again at a later poll", "node", node, "layer", t.Layer, "trace", t.Trace, "err", err)
			s.mu.Lock()
			delete(s.seen, key)
			s.mu.Unlock()
		}
	}()
}
