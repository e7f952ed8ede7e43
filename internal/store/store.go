// Package store keeps warren's durable, low-rate objects (images, tokens,
// node registrations, later projects and quotas) in etcd behind a small
// key-value interface. Per-sandbox lifecycle state never goes here: the node
// that runs a sandbox is the authority on it.
//
// Implementations: NewEtcd over an etcd cluster (external, or the embedded
// member StartEmbedded runs for `warren up`) and Memory, an in-process store
// for tests. All of them pass the conformance suite in storetest.
package store

import (
	"context"
	"strings"

	"github.com/warrenhq/warren/internal/errdefs"
)

// KV is one stored key with its value and the revision it was last changed.
type KV struct {
	Key     string
	Value   []byte
	Version int64 // etcd mod revision; 0 for "must not exist" in CompareAndPut
}

// Store is the persistence contract. Keys are slash-separated paths such as
// "/images/busybox". Errors: errdefs.ErrNotFound, errdefs.ErrConflict,
// errdefs.ErrInvalid (a key that does not start with "/"),
// errdefs.ErrUnavailable (the backing cluster cannot be reached).
type Store interface {
	// Get returns key's value; ErrNotFound if absent.
	Get(ctx context.Context, key string) (KV, error)
	// List returns every key that starts with prefix ("" for all), sorted
	// by key. End prefix with "/" to list one directory: "/images/".
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

// checkKey rejects keys outside the "/a/b" shape, so that a prefixed etcd
// key can never alias another namespace.
func checkKey(key string) error {
	if !strings.HasPrefix(key, "/") {
		return errdefs.Invalid("store key %q must start with /", key)
	}
	return nil
}

// checkPrefix accepts "" (everything) or a key-shaped prefix.
func checkPrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	return checkKey(prefix)
}

func conflict(key string) error {
	return errdefs.New(errdefs.ErrConflict, "store_conflict", "store key %q changed concurrently or already exists", key)
}

func notFound(key string) error {
	return errdefs.New(errdefs.ErrNotFound, "store_not_found", "store key %q not found", key)
}
