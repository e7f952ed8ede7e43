package iam

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode"

	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/store"
)

const (
	idemPrefix = "/iam/idempotency/"
	idemFormat = 1
	maxKeyLen  = 255
)

// Idempotency record states.
const (
	IdemPending   = "pending"   // a request holds the key and is creating
	IdemDone      = "done"      // Result holds the answer to replay
	IdemAbandoned = "abandoned" // the holder gave up: the next replay claims it
)

// Record is one idempotency key's state in the store.
type Record struct {
	V           int    `json:"v"`
	Project     string `json:"project"`
	Key         string `json:"key"`
	Fingerprint string `json:"fingerprint,omitempty"` // of the request that claimed it
	State       string `json:"state"`
	// Owner identifies the claim; Complete and Abandon check it.
	Owner string `json:"owner"`
	// Result is the caller's answer (e.g. the created sandbox as JSON),
	// set by Complete.
	Result    json.RawMessage `json:"result,omitempty"`
	CreatedAt time.Time       `json:"created_at"`
	// ExpiresAt: for a pending claim, when it is considered lost and may
	// be taken over; for a done record, when the key is forgotten.
	ExpiresAt time.Time `json:"expires_at"`
}

// IdempotencyOptions tune an Idempotency. Zero values take the defaults.
type IdempotencyOptions struct {
	// TTL is how long a completed key replays its result. Default 24h.
	TTL time.Duration
	// ClaimTimeout is how long a claim may stay pending before a replay
	// takes it over. The claimer must finish (Complete or Abandon) within
	// it: bound the create by a shorter deadline. Default 2m.
	ClaimTimeout time.Duration
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
}

// Idempotency makes creates idempotent per (project, key): concurrent and
// later replays of one key get the first request's result, never a second
// creation. Records live in the store under /iam/idempotency/, so this holds
// across apiserver replicas. Safe for concurrent use.
type Idempotency struct {
	st   store.Store
	opts IdempotencyOptions
}

// NewIdempotency returns an Idempotency over st.
func NewIdempotency(st store.Store, opts IdempotencyOptions) *Idempotency {
	if opts.TTL <= 0 {
		opts.TTL = 24 * time.Hour
	}
	if opts.ClaimTimeout <= 0 {
		opts.ClaimTimeout = 2 * time.Minute
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Idempotency{st: st, opts: opts}
}

func idemKey(project, key string) string {
	h := sha256.Sum256([]byte(project + "\x00" + key))
	return idemPrefix + hex.EncodeToString(h[:16])
}

// Claim takes key in project for one create, or returns the result of the
// create that took it:
//
//   - claimed: the caller holds the key and must create, then Complete
//     (with the result) or Abandon (on failure) the returned record;
//   - not claimed: rec is done and rec.Result is the first create's answer,
//     as it was then: what it named may have changed or gone since (the
//     apiserver answers a replay with the sandbox as it is now, or
//     sandbox_gone).
//
// While another request holds the key, Claim waits (polling the store)
// until it completes, abandons, or its claim times out (then this caller
// takes it over), or ctx ends. fingerprint, if not empty, identifies the
// request body: a replay with a different one is ErrConflict
// (CodeIdempotencyReused). ErrInvalid for an empty or oversized key.
func (m *Idempotency) Claim(ctx context.Context, project, key, fingerprint string) (rec *Record, claimed bool, err error) {
	project, err = CleanPath(project)
	if err != nil {
		return nil, false, err
	}
	if err := checkIdemKey(key); err != nil {
		return nil, false, err
	}
	k := idemKey(project, key)
	wait := 5 * time.Millisecond
	for {
		now := m.opts.Now().UTC()
		mine := &Record{
			V: idemFormat, Project: project, Key: key, Fingerprint: fingerprint,
			State: IdemPending, Owner: newID(12), CreatedAt: now, ExpiresAt: now.Add(m.opts.ClaimTimeout),
		}
		val, err := json.Marshal(mine)
		if err != nil {
			return nil, false, err
		}
		err = m.st.Create(ctx, k, val)
		if err == nil {
			return mine, true, nil
		}
		if !errors.Is(err, errdefs.ErrConflict) {
			return nil, false, fmt.Errorf("iam: claim idempotency key: %w", err)
		}
		cur, ver, err := m.get(ctx, k)
		if errors.Is(err, errdefs.ErrNotFound) {
			continue // swept meanwhile
		}
		if err != nil {
			return nil, false, err
		}
		live := cur.State != IdemAbandoned && now.Before(cur.ExpiresAt)
		if live && fingerprint != "" && cur.Fingerprint != "" && cur.Fingerprint != fingerprint {
			return nil, false, errdefs.New(errdefs.ErrConflict, CodeIdempotencyReused,
				"idempotency key %q was used for a different request", key)
		}
		switch {
		case live && cur.State == IdemDone:
			return cur, false, nil
		case !live:
			// Abandoned, expired, or its holder vanished: take it over.
			err := m.st.CompareAndPut(ctx, k, val, ver)
			if err == nil {
				return mine, true, nil
			}
			if !errors.Is(err, errdefs.ErrConflict) {
				return nil, false, fmt.Errorf("iam: claim idempotency key: %w", err)
			}
			continue
		}
		if err := sleepCtx(ctx, wait); err != nil {
			return nil, false, err
		}
		wait = min(2*wait, 250*time.Millisecond)
	}
}

func checkIdemKey(key string) error {
	if key == "" || len(key) > maxKeyLen {
		return errdefs.Invalid("idempotency key must be 1 to %d bytes", maxKeyLen)
	}
	for _, c := range key {
		if !unicode.IsPrint(c) {
			return errdefs.Invalid("idempotency key must be printable")
		}
	}
	return nil
}

func (m *Idempotency) get(ctx context.Context, k string) (*Record, int64, error) {
	kv, err := m.st.Get(ctx, k)
	if err != nil {
		return nil, 0, err
	}
	var r Record
	if err := json.Unmarshal(kv.Value, &r); err != nil {
		return nil, 0, fmt.Errorf("iam: decode idempotency record: %w", err)
	}
	if r.V > idemFormat {
		return nil, 0, fmt.Errorf("iam: idempotency record in format %d, newer than this binary's %d", r.V, idemFormat)
	}
	return &r, kv.Version, nil
}

// Complete stores result for the claim rec and returns the done record;
// replays of the key get result from now on, for TTL. ErrConflict
// (CodeIdempotencyLost) if the claim timed out and another request took the
// key over: that request creates too, so the caller must undo its own
// creation (delete the sandbox) and may answer with an error.
func (m *Idempotency) Complete(ctx context.Context, rec *Record, result json.RawMessage) (*Record, error) {
	return m.finish(ctx, rec, func(r *Record) {
		r.State, r.Result, r.ExpiresAt = IdemDone, result, m.opts.Now().UTC().Add(m.opts.TTL)
	})
}

// Abandon gives the claim rec up (the create failed): the next replay
// claims the key and creates. ErrConflict (CodeIdempotencyLost) as Complete.
func (m *Idempotency) Abandon(ctx context.Context, rec *Record) error {
	_, err := m.finish(ctx, rec, func(r *Record) {
		r.State, r.Result, r.ExpiresAt = IdemAbandoned, nil, m.opts.Now().UTC()
	})
	return err
}

func (m *Idempotency) finish(ctx context.Context, rec *Record, change func(*Record)) (*Record, error) {
	k := idemKey(rec.Project, rec.Key)
	for {
		cur, ver, err := m.get(ctx, k)
		if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return nil, err
		}
		if err != nil || cur.Owner != rec.Owner || cur.State != IdemPending {
			return nil, errdefs.New(errdefs.ErrConflict, CodeIdempotencyLost,
				"idempotency key %q: this request's claim timed out and was taken over", rec.Key)
		}
		change(cur)
		val, err := json.Marshal(cur)
		if err != nil {
			return nil, err
		}
		err = m.st.CompareAndPut(ctx, k, val, ver)
		if err == nil {
			return cur, nil
		}
		if !errors.Is(err, errdefs.ErrConflict) {
			return nil, fmt.Errorf("iam: idempotency key %q: %w", rec.Key, err)
		}
	}
}

// Sweep deletes records that expired more than a minute ago (done keys
// past their TTL, abandoned and lost claims) and returns how many. Run it
// periodically on any one or on every replica; it is idempotent.
func (m *Idempotency) Sweep(ctx context.Context) (int, error) {
	kvs, err := m.st.List(ctx, idemPrefix)
	if err != nil {
		return 0, fmt.Errorf("iam: sweep idempotency keys: %w", err)
	}
	cutoff := m.opts.Now().Add(-time.Minute)
	n := 0
	for _, kv := range kvs {
		var r Record
		if json.Unmarshal(kv.Value, &r) != nil || !r.ExpiresAt.Before(cutoff) {
			continue
		}
		if err := m.st.Delete(ctx, kv.Key); err != nil {
			return n, fmt.Errorf("iam: sweep idempotency keys: %w", err)
		}
		n++
	}
	return n, nil
}
