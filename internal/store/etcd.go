package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/warrenhq/warren/internal/errdefs"
)

// DefaultPrefix namespaces warren's keys in a shared etcd cluster.
const DefaultPrefix = "/warren"

// Etcd is a Store over an etcd cluster. Every key is stored under a prefix
// (DefaultPrefix unless told otherwise), so several warren installations,
// or warren and other tenants, can share one cluster. Conditional writes are
// single etcd transactions comparing the key's mod revision.
type Etcd struct {
	cli    *clientv3.Client
	prefix string
	owned  bool // Close closes cli
}

var _ Store = (*Etcd)(nil)

// NewEtcd returns a Store over cli with keys under prefix (e.g. "/warren";
// "" means DefaultPrefix). The caller keeps ownership of cli: Close does not
// close it.
func NewEtcd(cli *clientv3.Client, prefix string) *Etcd {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return &Etcd{cli: cli, prefix: strings.TrimSuffix(prefix, "/")}
}

// DialEtcd connects to an external etcd cluster and returns a Store with
// keys under prefix that closes its client on Close. It does not wait for
// the cluster: the first call fails with ErrUnavailable if it is down.
func DialEtcd(endpoints []string, prefix string) (*Etcd, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      nopLogger(),
	})
	if err != nil {
		return nil, fmt.Errorf("store: dial etcd %v: %w: %w", endpoints, errdefs.ErrUnavailable, err)
	}
	s := NewEtcd(cli, prefix)
	s.owned = true
	return s, nil
}

// Client returns the underlying etcd client, for the few callers that need
// more than the Store contract (watches, leases).
func (s *Etcd) Client() *clientv3.Client { return s.cli }

// Prefix returns the namespace every key is stored under.
func (s *Etcd) Prefix() string { return s.prefix }

func (s *Etcd) Get(ctx context.Context, key string) (KV, error) {
	if err := checkKey(key); err != nil {
		return KV{}, err
	}
	resp, err := s.cli.Get(ctx, s.prefix+key)
	if err != nil {
		return KV{}, classify("get", key, err)
	}
	if len(resp.Kvs) == 0 {
		return KV{}, notFound(key)
	}
	kv := resp.Kvs[0]
	return KV{Key: key, Value: kv.Value, Version: kv.ModRevision}, nil
}

func (s *Etcd) List(ctx context.Context, prefix string) ([]KV, error) {
	if err := checkPrefix(prefix); err != nil {
		return nil, err
	}
	full := s.prefix + prefix
	if prefix == "" {
		// Keys are stored as s.prefix+"/...": never list a sibling such as
		// "/warren2" when asked for everything under "/warren".
		full = s.prefix + "/"
	}
	resp, err := s.cli.Get(ctx, full, clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, classify("list", prefix, err)
	}
	out := make([]KV, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out = append(out, KV{
			Key:     strings.TrimPrefix(string(kv.Key), s.prefix),
			Value:   kv.Value,
			Version: kv.ModRevision,
		})
	}
	return out, nil
}

func (s *Etcd) Put(ctx context.Context, key string, value []byte) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if _, err := s.cli.Put(ctx, s.prefix+key, string(value)); err != nil {
		return classify("put", key, err)
	}
	return nil
}

func (s *Etcd) Create(ctx context.Context, key string, value []byte) error {
	return s.CompareAndPut(ctx, key, value, 0)
}

func (s *Etcd) CompareAndPut(ctx context.Context, key string, value []byte, version int64) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if version < 0 {
		return errdefs.Invalid("store version %d is negative", version)
	}
	k := s.prefix + key
	// An absent key has mod revision 0, so one compare covers both "must
	// not exist" (version 0) and "must still be at version".
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(k), "=", version)).
		Then(clientv3.OpPut(k, string(value))).
		Commit()
	if err != nil {
		return classify("compare-and-put", key, err)
	}
	if !resp.Succeeded {
		return conflict(key)
	}
	return nil
}

func (s *Etcd) Delete(ctx context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if _, err := s.cli.Delete(ctx, s.prefix+key); err != nil {
		return classify("delete", key, err)
	}
	return nil
}

// Close closes the client if DialEtcd created it.
func (s *Etcd) Close() error {
	if !s.owned {
		return nil
	}
	return s.cli.Close()
}

// classify wraps an etcd client error with the errdefs kind callers can act
// on: the caller's own cancellation stays as is, a request etcd refuses as
// too large is ErrInvalid, anything else (no leader, connection refused,
// timeouts) is ErrUnavailable.
func classify(op, key string, err error) error {
	switch {
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("store: %s %q: %w", op, key, err)
	case errors.Is(err, rpctypes.ErrRequestTooLarge), errors.Is(err, rpctypes.ErrGRPCRequestTooLarge),
		errors.Is(err, rpctypes.ErrTooManyOps), errors.Is(err, rpctypes.ErrGRPCTooManyOps):
		return fmt.Errorf("store: %s %q: %w: %w", op, key, errdefs.ErrInvalid, err)
	}
	if st, ok := status.FromError(err); ok && st.Code() == codes.InvalidArgument {
		return fmt.Errorf("store: %s %q: %w: %w", op, key, errdefs.ErrInvalid, err)
	}
	return fmt.Errorf("store: %s %q: %w: %w", op, key, errdefs.ErrUnavailable, err)
}
