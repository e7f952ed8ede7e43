package store

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

var _ Watcher = (*Etcd)(nil)

// full returns the etcd key range for a Store prefix.
func (s *Etcd) full(prefix string) string {
	if prefix == "" {
		// Never a sibling such as "/warren2" when asked for "/warren".
		return s.prefix + "/"
	}
	return s.prefix + prefix
}

// Watch reads the snapshot and starts the etcd watch at the revision right
// after it, so no change falls between the two. The watch requires a
// leader: a member cut off from its cluster ends the watch instead of
// silently delivering nothing.
func (s *Etcd) Watch(ctx context.Context, prefix string) (<-chan Event, error) {
	if err := checkPrefix(prefix); err != nil {
		return nil, err
	}
	full := s.full(prefix)
	resp, err := s.cli.Get(ctx, full, clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, classify("watch", prefix, err)
	}
	rev := resp.Header.Revision
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	wch := s.cli.Watch(wctx, full, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	out := make(chan Event)
	go func() {
		defer close(out)
		defer cancel()
		send := func(ev Event) bool {
			select {
			case out <- ev:
				return true
			case <-ctx.Done():
				return false
			}
		}
		for _, kv := range resp.Kvs {
			if !send(Event{Type: EventPut, KV: s.kv(kv)}) {
				return
			}
		}
		if !send(Event{Type: EventSynced, KV: KV{Version: rev}}) {
			return
		}
		for wresp := range wch {
			if wresp.Err() != nil {
				return // compacted, canceled, or no leader: the caller watches again
			}
			for _, ev := range wresp.Events {
				e := Event{Type: EventPut, KV: s.kv(ev.Kv)}
				if ev.Type == mvccpb.DELETE {
					e.Type = EventDelete
					e.KV.Value = []byte{}
				}
				if !send(e) {
					return
				}
			}
		}
	}()
	return out, nil
}

func (s *Etcd) kv(kv *mvccpb.KeyValue) KV {
	v := kv.Value
	if v == nil {
		v = []byte{}
	}
	return KV{Key: strings.TrimPrefix(string(kv.Key), s.prefix), Value: v, Version: kv.ModRevision}
}

func (s *Etcd) PutWithLease(ctx context.Context, key string, value []byte, ttl time.Duration) (LeaseID, error) {
	if err := checkKey(key); err != nil {
		return 0, err
	}
	if err := checkTTL(ttl); err != nil {
		return 0, err
	}
	grant, err := s.cli.Grant(ctx, int64(math.Ceil(ttl.Seconds())))
	if err != nil {
		return 0, classify("grant lease for", key, err)
	}
	if _, err := s.cli.Put(ctx, s.prefix+key, string(value), clientv3.WithLease(grant.ID)); err != nil {
		// Best effort: an unused lease expires on its own anyway.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		s.cli.Revoke(rctx, grant.ID)
		cancel()
		return 0, classify("put", key, err)
	}
	return LeaseID(grant.ID), nil
}

func (s *Etcd) KeepAlive(ctx context.Context, id LeaseID) error {
	if _, err := s.cli.KeepAliveOnce(ctx, clientv3.LeaseID(id)); err != nil {
		if isLeaseNotFound(err) {
			return leaseNotFound(id)
		}
		return classify("keep alive lease", fmt.Sprintf("%x", int64(id)), err)
	}
	return nil
}

func (s *Etcd) Revoke(ctx context.Context, id LeaseID) error {
	if _, err := s.cli.Revoke(ctx, clientv3.LeaseID(id)); err != nil && !isLeaseNotFound(err) {
		return classify("revoke lease", fmt.Sprintf("%x", int64(id)), err)
	}
	return nil
}

func isLeaseNotFound(err error) bool {
	return errors.Is(err, rpctypes.ErrLeaseNotFound) || errors.Is(err, rpctypes.ErrGRPCLeaseNotFound)
}
