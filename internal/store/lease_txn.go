package store

import (
	"context"
	"math"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/warrenhq/warren/internal/errdefs"
)

// LeaseTxn is an optional extension of Watcher for claims that must not
// overwrite someone else's: node registrations, which an agent may only
// replace while it is the one that holds them. Memory and Etcd implement
// it; discover it with a type assertion.
type LeaseTxn interface {
	Watcher
	// Grant makes a lease of ttl with no keys yet (it expires unless
	// renewed, like any). Errors: ErrInvalid (ttl <= 0), ErrUnavailable.
	Grant(ctx context.Context, ttl time.Duration) (LeaseID, error)
	// PutAllLeased writes every kv under lease, all or none, and only if
	// each kv.Key is still at kv.Version (0: absent): one transaction.
	// ErrConflict when one is not (nothing written); ErrNotFound when the
	// lease is gone.
	PutAllLeased(ctx context.Context, lease LeaseID, kvs []KV) error
}

var (
	_ LeaseTxn = (*Etcd)(nil)
	_ LeaseTxn = (*memory)(nil)
)

func (s *Etcd) Grant(ctx context.Context, ttl time.Duration) (LeaseID, error) {
	if err := checkTTL(ttl); err != nil {
		return 0, err
	}
	grant, err := s.cli.Grant(ctx, int64(math.Ceil(ttl.Seconds())))
	if err != nil {
		return 0, classify("grant lease", "", err)
	}
	return LeaseID(grant.ID), nil
}

func (s *Etcd) PutAllLeased(ctx context.Context, lease LeaseID, kvs []KV) error {
	cmps := make([]clientv3.Cmp, 0, len(kvs))
	ops := make([]clientv3.Op, 0, len(kvs))
	for _, kv := range kvs {
		if err := checkKey(kv.Key); err != nil {
			return err
		}
		if kv.Version < 0 {
			return errdefs.Invalid("store version %d is negative", kv.Version)
		}
		k := s.prefix + kv.Key
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", kv.Version))
		ops = append(ops, clientv3.OpPut(k, string(kv.Value), clientv3.WithLease(clientv3.LeaseID(lease))))
	}
	resp, err := s.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		if isLeaseNotFound(err) {
			return leaseNotFound(lease)
		}
		return classify("leased put of", firstKey(kvs), err)
	}
	if !resp.Succeeded {
		return conflict(firstKey(kvs))
	}
	return nil
}

func firstKey(kvs []KV) string {
	if len(kvs) == 0 {
		return ""
	}
	return kvs[0].Key
}

func (m *memory) Grant(ctx context.Context, ttl time.Duration) (LeaseID, error) {
	if err := checkTTL(ttl); err != nil {
		return 0, err
	}
	if err := m.lock(ctx); err != nil {
		return 0, err
	}
	defer m.mu.Unlock()
	m.lastLease++
	id := m.lastLease
	l := &memLease{ttl: ttl, deadline: time.Now().Add(ttl), keys: map[string]struct{}{}}
	l.timer = time.AfterFunc(ttl, func() { m.expire(id) })
	m.leases[id] = l
	return id, nil
}

func (m *memory) PutAllLeased(ctx context.Context, lease LeaseID, kvs []KV) error {
	for _, kv := range kvs {
		if err := checkKey(kv.Key); err != nil {
			return err
		}
		if kv.Version < 0 {
			return errdefs.Invalid("store version %d is negative", kv.Version)
		}
	}
	if err := m.lock(ctx); err != nil {
		return err
	}
	defer m.mu.Unlock()
	if m.leases[lease] == nil {
		return leaseNotFound(lease)
	}
	for _, kv := range kvs {
		if m.kv[kv.Key].rev != kv.Version {
			return conflict(kv.Key)
		}
	}
	for _, kv := range kvs {
		m.setLeased(kv.Key, kv.Value, lease)
	}
	return nil
}
