package image

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/errdefs"
)

// Garbage collection of blobs by reference.
//
// Roots are every layer record's manifest, every environment's layer
// digests, the layers of live sandboxes (the caller asks the nodes), and
// pins: the manifest and chunk digests of layers being published. A
// manifest keeps its chunks, its parent and its prefetch trace. Blobs reachable from no root
// are deleted, unless younger than the grace period where the store can
// tell (a directory store can).
//
// A publish may find a chunk already present and not write it, while a
// collection that did not see its pin deletes that very chunk. Pins and a
// sweep marker close that race the way Dekker's algorithm does: a publish
// writes its pin and then reads the marker, a collection writes the marker
// and then reads the pins. etcd is linearizable, so at least one of them
// sees the other: the collection marks the pinned blobs, or the publish
// waits for the collection to end before it writes anything.
const (
	gcPinsPrefix = "/gc/pins/"
	gcSweepKey   = "/gc/sweep"
	// gcLease is how long a pin or the sweep marker lives unless renewed:
	// what a crashed publisher or collector blocks at most.
	gcLease = 10 * time.Minute
	// gcRenew is how often a live pin or marker is renewed.
	gcRenew = time.Minute
)

// DefaultGCGrace is how old an unreferenced blob must be before GC deletes
// it. Pins already protect publishes; the grace period is a second line
// for writers that do not pin.
const DefaultGCGrace = 15 * time.Minute

type gcLeaseRecord struct {
	ID        string    `json:"id"`
	ExpiresAt time.Time `json:"expires_at"`
	// Pins only: manifests are kept with everything they reference,
	// blobs just themselves.
	Manifests []string `json:"manifests,omitempty"`
	Blobs     []string `json:"blobs,omitempty"`
}

func randomID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// pin protects manifests (with their chunks and parents) and blobs from
// GC until the returned func is called, or gcLease after the process dies.
// It waits while a collection is sweeping; a caller that found the pinned
// things by reading records must check they still exist once pinned.
func (r *Registry) pin(ctx context.Context, manifests, blobs []string) (func(), error) {
	rec := gcLeaseRecord{ID: randomID(), Manifests: manifests, Blobs: blobs}
	key := gcPinsPrefix + rec.ID
	write := func(ctx context.Context) error {
		rec.ExpiresAt = time.Now().Add(gcLease).UTC()
		val, err := json.Marshal(rec)
		if err != nil {
			return err
		}
		return r.st.Put(ctx, key, val)
	}
	if err := write(ctx); err != nil {
		return nil, fmt.Errorf("pin blobs: %w", err)
	}
	unpin := func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := r.st.Delete(dctx, key); err != nil {
			r.log.Warn("unpin blobs", "pin", rec.ID, "err", err)
		}
	}
	if err := r.waitSweep(ctx); err != nil {
		unpin()
		return nil, err
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(gcRenew)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if err := write(context.WithoutCancel(ctx)); err != nil {
					r.log.Warn("renew blob pin", "pin", rec.ID, "err", err)
				}
			}
		}
	}()
	return func() {
		close(stop)
		<-done
		unpin()
	}, nil
}

// waitSweep returns once no live collection is sweeping.
func (r *Registry) waitSweep(ctx context.Context) error {
	wait := 50 * time.Millisecond
	for {
		kv, err := r.st.Get(ctx, gcSweepKey)
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("check for a running GC: %w", err)
		}
		var rec gcLeaseRecord
		if json.Unmarshal(kv.Value, &rec) != nil || time.Now().After(rec.ExpiresAt) {
			return nil // a dead collector's marker
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, time.Second)
	}
}

// GC deletes the blobs that no layer, environment, live sandbox or pin
// references and that are older than the grace period. live maps layer
// digests to the live sandboxes that use them (only the keys matter). One
// collection runs at a time across processes; a second one returns at
// once with Skipped set. It reads every record and manifest and lists the
// blob store: run it after deletes or every few minutes, not per request.
func (r *Registry) GC(ctx context.Context, live map[string][]string) (api.GCResult, error) {
	start := time.Now()
	var res api.GCResult
	// Forks' snapshots nothing uses go first, so that their blobs are
	// collected in the same pass.
	n, err := r.pruneEphemeral(ctx, live)
	if err != nil {
		return res, fmt.Errorf("gc: %w", err)
	}
	res.Snapshots = n
	marker := gcLeaseRecord{ID: randomID()}
	writeMarker := func(ctx context.Context, version int64) error {
		marker.ExpiresAt = time.Now().Add(gcLease).UTC()
		val, _ := json.Marshal(marker)
		return r.st.CompareAndPut(ctx, gcSweepKey, val, version)
	}
	// Take the marker: create it, or replace a dead collector's.
	var version int64
	if kv, err := r.st.Get(ctx, gcSweepKey); err == nil {
		var old gcLeaseRecord
		if json.Unmarshal(kv.Value, &old) == nil && time.Now().Before(old.ExpiresAt) {
			res.Skipped = true
			return res, nil
		}
		version = kv.Version
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return res, fmt.Errorf("gc: %w", err)
	}
	if err := writeMarker(ctx, version); errors.Is(err, errdefs.ErrConflict) {
		res.Skipped = true
		return res, nil
	} else if err != nil {
		return res, fmt.Errorf("gc: %w", err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := r.st.Delete(dctx, gcSweepKey); err != nil {
			r.log.Warn("gc: remove sweep marker", "err", err)
		}
	}()

	// List the blobs first: anything written after this is not a
	// candidate, whatever the marking below sees.
	blobs, err := r.bs.List(ctx)
	if err != nil {
		return res, fmt.Errorf("gc: %w", err)
	}
	res.Blobs = len(blobs)
	marked, err := r.mark(ctx, live)
	if err != nil {
		return res, fmt.Errorf("gc: %w", err)
	}
	// The trace blobs of the layers kept are kept; the records of the
	// others' go (traces.go).
	stale, err := r.markTraces(ctx, marked)
	if err != nil {
		return res, fmt.Errorf("gc: %w", err)
	}
	for _, key := range stale {
		if err := r.st.Delete(ctx, key); err != nil {
			return res, fmt.Errorf("gc: %w", err)
		}
	}
	lastRenew := time.Now()
	for _, d := range blobs {
		if marked[d] {
			res.Live++
			continue
		}
		if young, err := r.young(ctx, d); err != nil || young {
			res.Young++
			continue
		}
		if time.Since(lastRenew) > gcRenew {
			// Still sweeping: keep publishers waiting.
			kv, err := r.st.Get(ctx, gcSweepKey)
			if err != nil {
				return res, fmt.Errorf("gc: %w", err)
			}
			if err := writeMarker(ctx, kv.Version); err != nil {
				return res, fmt.Errorf("gc: renew sweep marker: %w", err)
			}
			lastRenew = time.Now()
		}
		size, _ := r.bs.Stat(ctx, d)
		if err := r.bs.Delete(ctx, d); err != nil {
			return res, fmt.Errorf("gc: %w", err)
		}
		res.Deleted++
		res.DeletedBytes += size
	}
	res.DurationMs = time.Since(start).Milliseconds()
	r.log.Info("gc done", "blobs", res.Blobs, "live", res.Live, "deleted", res.Deleted,
		"deleted_bytes", res.DeletedBytes, "young", res.Young, "duration", time.Since(start).Round(time.Millisecond))
	return res, nil
}

// mark returns every blob digest reachable from the roots.
func (r *Registry) mark(ctx context.Context, live map[string][]string) (map[string]bool, error) {
	marked := map[string]bool{}
	var manifests []string
	pins, err := r.st.List(ctx, gcPinsPrefix)
	if err != nil {
		return nil, err
	}
	for _, kv := range pins {
		var rec gcLeaseRecord
		if err := json.Unmarshal(kv.Value, &rec); err != nil {
			continue
		}
		// Even an expired pin is honoured: its publisher may only be
		// slow, and the blobs are collected next time if it is dead.
		for _, d := range rec.Blobs {
			marked[d] = true
		}
		manifests = append(manifests, rec.Manifests...)
	}
	for d := range live {
		manifests = append(manifests, d)
	}
	layers, err := r.st.List(ctx, layersPrefix)
	if err != nil {
		return nil, err
	}
	for _, kv := range layers {
		l, err := decodeLayer(kv)
		if err != nil {
			return nil, err // never guess: a skipped root would lose data
		}
		manifests = append(manifests, l.Digest)
	}
	envs, err := r.ListEnvs(ctx)
	if err != nil {
		return nil, err
	}
	for _, e := range envs {
		for _, l := range e.Layers {
			manifests = append(manifests, l.Digest)
		}
	}
	for len(manifests) > 0 {
		d := manifests[len(manifests)-1]
		manifests = manifests[:len(manifests)-1]
		if marked[d] {
			continue
		}
		marked[d] = true
		m, err := ReadManifest(ctx, r.bs, d)
		if errors.Is(err, errdefs.ErrNotFound) {
			continue // nothing left to keep
		}
		if err != nil {
			if errors.Is(err, errdefs.ErrInvalid) {
				continue // not a manifest: a legacy single-blob layer
			}
			return nil, err
		}
		for _, c := range m.Chunks {
			marked[c.Digest] = true
		}
		if m.Parent != "" {
			manifests = append(manifests, m.Parent)
		}
	}
	return marked, nil
}

// young reports whether the blob was written within the grace period.
// Stores that cannot tell a blob's age make every blob old.
func (r *Registry) young(ctx context.Context, digest string) (bool, error) {
	if r.grace <= 0 {
		return false, nil
	}
	t, ok, err := blobModTime(ctx, r.bs, digest)
	if err != nil || !ok {
		return false, err
	}
	return time.Since(t) < r.grace, nil
}

// blobModTime returns when a blob was written, for stores that can say:
// those with a ModTime method, and directory stores through the file.
func blobModTime(ctx context.Context, bs blob.Store, digest string) (time.Time, bool, error) {
	if m, ok := bs.(interface {
		ModTime(context.Context, string) (time.Time, error)
	}); ok {
		t, err := m.ModTime(ctx, digest)
		return t, err == nil, err
	}
	if p, ok := bs.(interface{ Path(string) (string, error) }); ok {
		path, err := p.Path(digest)
		if err != nil {
			return time.Time{}, false, err
		}
		fi, err := os.Stat(path)
		if err != nil {
			return time.Time{}, false, err
		}
		return fi.ModTime(), true, nil
	}
	return time.Time{}, false, nil
}
