// Package store keeps warren's durable, low-rate objects (images, tokens,
// node registrations, later projects and quotas) in etcd behind a small
// key-value interface. Per-sandbox lifecycle state never goes here: the node
// that runs a sandbox is the authority on it. Open starts an embedded etcd
// member for `warren up`; Memory is an in-process store for tests.
package store

import "context"

// KV is one stored key with its value and the revision it was last changed.
type KV struct {
	Key     string
	Value   []byte
	Version int64 // etcd mod revision; 0 for "must not exist" in CompareAndPut
}

// Store is the persistence contract. Keys are slash-separated paths such as
// "/images/busybox". Errors: errdefs.ErrNotFound, errdefs.ErrConflict.
type Store interface {
	// Get returns key's value; ErrNotFound if absent.
	Get(ctx context.Context, key string) (KV, error)
	// List returns every key under prefix, sorted by key.
	List(ctx context.Context, prefix string) ([]KV, error)
	// Put writes key unconditionally.
	Put(ctx context.Context, key string, value []byte) error
	// Create writes key only if it does not exist; ErrConflict otherwise.
	Create(ctx context.Context, key string, value []byte) error
	// CompareAndPut writes key only if its current version is version
	// (0: only if absent); ErrConflict otherwise.
	CompareAndPut(ctx context.Context, key string, value []byte, version int64) error
	// Delete removes key; deleting an absent key is not an error.
	Delete(ctx context.Context, key string) error
	Close() error
}
