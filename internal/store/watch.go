package store

import (
	"context"
	"time"

	"github.com/warrenhq/warren/internal/errdefs"
)

// EventType says what an Event reports.
type EventType int

const (
	// EventPut: KV was written (created or changed).
	EventPut EventType = iota + 1
	// EventDelete: KV.Key was deleted, or expired with its lease. KV.Value
	// is empty and KV.Version is the revision of the deletion.
	EventDelete
	// EventSynced follows the snapshot a watch starts with: every key
	// that existed when it started has been sent as an EventPut. KV is
	// empty but for Version, the store revision of the snapshot.
	EventSynced
)

func (t EventType) String() string {
	switch t {
	case EventPut:
		return "put"
	case EventDelete:
		return "delete"
	case EventSynced:
		return "synced"
	}
	return "unknown"
}

// Event is one change under a watched prefix.
type Event struct {
	Type EventType
	KV   KV
}

// LeaseID names a lease granted by PutWithLease.
type LeaseID int64

// Watcher is an optional extension of Store, for state that must follow
// its writers: node registrations that vanish when a node stops renewing
// them, and views that follow changes without polling. Memory and Etcd
// implement it; discover it with a type assertion.
type Watcher interface {
	Store

	// Watch streams the keys under prefix ("" for all): first a snapshot
	// (an EventPut for every existing key, sorted by key) closed by one
	// EventSynced, then every later change in order, with no gap between
	// the two. The channel is closed when ctx is done, when the store is
	// closed, or when the store can no longer follow changes (etcd
	// compacted the revision the watch was at, or lost its leader): the
	// caller then watches again and replaces its state with the new
	// snapshot. The caller must keep reading or cancel ctx.
	// Errors: ErrInvalid (bad prefix), ErrUnavailable.
	Watch(ctx context.Context, prefix string) (<-chan Event, error)

	// PutWithLease writes key attached to a new lease of the given TTL
	// (etcd rounds it up to whole seconds, and to its minimum TTL): unless
	// KeepAlive renews the lease within each TTL, the key is deleted. A
	// later Put, or PutWithLease, of the key moves it off this lease.
	// Errors: ErrInvalid (bad key, ttl <= 0), ErrUnavailable.
	PutWithLease(ctx context.Context, key string, value []byte, ttl time.Duration) (LeaseID, error)

	// KeepAlive renews the lease once, for another full TTL. It returns
	// ErrNotFound once the lease has expired or been revoked: its keys are
	// gone and must be written again under a new lease. With etcd down it
	// waits until ctx is done, so give ctx a deadline.
	KeepAlive(ctx context.Context, id LeaseID) error

	// Revoke ends the lease now and deletes its keys. Revoking an expired
	// or unknown lease is not an error.
	Revoke(ctx context.Context, id LeaseID) error
}

func leaseNotFound(id LeaseID) error {
	return errdefs.New(errdefs.ErrNotFound, "lease_not_found", "store lease %x expired or revoked", int64(id))
}

func checkTTL(ttl time.Duration) error {
	if ttl <= 0 {
		return errdefs.Invalid("store lease TTL %v must be positive", ttl)
	}
	return nil
}
