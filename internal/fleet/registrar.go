package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/store"
)

// maxConflictWait is the least a Registrar waits for a conflicting
// registration to expire before it gives up.
const maxConflictWait = 3 * time.Second

// DefaultTTL is how long a registration outlives its node's last renewal.
const DefaultTTL = 10 * time.Second

// Leaser is what a Registrar needs of a store: a key under a lease it
// renews. store.Watcher implements it (an agent that reaches etcd); so does
// a client of an apiserver's registration endpoint (an agent that reaches
// only the apiserver).
type Leaser interface {
	PutWithLease(ctx context.Context, key string, value []byte, ttl time.Duration) (store.LeaseID, error)
	KeepAlive(ctx context.Context, id store.LeaseID) error
	Revoke(ctx context.Context, id store.LeaseID) error
	Delete(ctx context.Context, key string) error
}

var _ Leaser = store.Watcher(nil)

// RegistrarConfig builds a Registrar.
type RegistrarConfig struct {
	// Store keeps the registration. If it is also a store.Store, the node
	// is remembered there too (Remember) when it first registers.
	Store Leaser
	// Node is what the node registers: ID, Address, Pool (default
	// onprem), Labels, Backends and Capacity. Usage and health are not
	// registered: the fleet polls them.
	Node api.Node
	// Secret is the bearer token the node's API accepts (Registration).
	Secret string
	// TTL of the registration's lease (default DefaultTTL); it is renewed
	// every TTL/3.
	TTL time.Duration
	Log *slog.Logger
}

// Registration is what a node keeps under Key(id): the fields of api.Node
// a registration holds (id, address, pool, labels, backends, capacity) and
// the node API's secret.
type Registration struct {
	api.Node
	// Secret is the bearer token the node's API accepts, and the only one:
	// its agent draws a fresh one at every start, and apiservers present
	// it when they call the node. It lives in the store (etcd, which only
	// apiservers and agents reach); no API shows it.
	Secret string `json:"secret,omitempty"`
	// Owner is OwnerOf the registering agent's node key: only that agent
	// may replace, renew or remove the registration while it is alive
	// (Claim). Token is the id of the node token it registered with, and
	// Lease the registration's lease. Empty in registrations written
	// before node identity (they are nobody's to take over while alive).
	Owner string `json:"owner,omitempty"`
	Token string `json:"token,omitempty"`
	Lease int64  `json:"lease,omitempty"`
}

// Registrar keeps one node registered under Key(id) with a lease it renews,
// and registers again whenever the lease is lost (the store was unreachable
// for longer than the TTL, or someone revoked it).
type Registrar struct {
	cfg   RegistrarConfig
	value []byte
	log   *slog.Logger
	lease atomic.Int64
}

// NewRegistrar checks cfg; Run registers.
func NewRegistrar(cfg RegistrarConfig) (*Registrar, error) {
	if cfg.Store == nil {
		return nil, errdefs.Invalid("fleet: a registrar needs a store")
	}
	if !validID(cfg.Node.ID) {
		return nil, errdefs.Invalid("fleet: node id %q: want a non-empty id without '/' or '-'", cfg.Node.ID)
	}
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	n := cfg.Node
	if n.Pool == "" {
		n.Pool = api.PoolOnPrem
	}
	if n.Pool != api.PoolOnPrem && n.Pool != api.PoolCloud {
		return nil, errdefs.Invalid("fleet: node pool %q: want %s or %s", n.Pool, api.PoolOnPrem, api.PoolCloud)
	}
	reg := Registration{
		Node: api.Node{ID: n.ID, Name: n.Name, Address: n.Address, Pool: n.Pool, Labels: n.Labels,
			Backends: n.Backends, Capacity: n.Capacity},
		Secret: cfg.Secret,
	}
	value, err := json.Marshal(reg)
	if err != nil {
		return nil, err
	}
	return &Registrar{cfg: cfg, value: value, log: cfg.Log.With("component", "registrar", "node", n.ID)}, nil
}

// Run registers the node and keeps the registration alive until ctx is
// done, registering again after a lost lease; it returns nil then. It
// leaves the registration to expire rather than deleting it: an agent that
// restarts within the TTL keeps its sandboxes from being reported lost.
// Deregister removes it at once.
//
// A store that refuses the node's credentials (ErrUnauthenticated or
// ErrForbidden: a node token revoked, or never valid, or bound to another
// node name) ends Run with that error, since trying again cannot help; the
// registration then expires. So does ErrConflict (another live agent holds
// the node id or name, Claim) that lasts two TTLs.
func (r *Registrar) Run(ctx context.Context) error {
	every := r.cfg.TTL / 3
	backoff := every / 10
	remembered := false
	var conflictSince time.Time // another live agent holds the id or name
	for {
		if st, ok := r.cfg.Store.(store.Store); ok && !remembered {
			rctx, cancel := context.WithTimeout(ctx, every)
			remembered = Remember(rctx, st, r.cfg.Node.ID) == nil
			cancel()
		}
		rctx, cancel := context.WithTimeout(ctx, every)
		id, err := r.cfg.Store.PutWithLease(rctx, Key(r.cfg.Node.ID), r.value, r.cfg.TTL)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if refused(err) {
			r.log.Error("node registration refused", "err", err)
			return err
		}
		if errors.Is(err, errdefs.ErrConflict) {
			// Another agent's registration is alive. If that agent is
			// gone its lease runs out within its TTL; give it two of
			// ours (at least maxConflictWait) before giving up for good.
			if conflictSince.IsZero() {
				conflictSince = time.Now()
			}
			if time.Since(conflictSince) > max(2*r.cfg.TTL, maxConflictWait) {
				r.log.Error("node registration refused: another agent holds it", "err", err)
				return err
			}
		} else {
			conflictSince = time.Time{}
		}
		if err != nil {
			r.log.Warn("node registration failed; retrying", "err", err, "after", backoff)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, every)
			continue
		}
		backoff = every / 10
		r.lease.Store(int64(id))
		r.log.Debug("node registered", "lease", int64(id), "ttl", r.cfg.TTL)
		r.keepAlive(ctx, id, every)
		if ctx.Err() != nil {
			return nil
		}
	}
}

// keepAlive renews lease id every interval until ctx is done or the lease
// is lost.
func (r *Registrar) keepAlive(ctx context.Context, id store.LeaseID, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	lastOK := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		kctx, cancel := context.WithTimeout(ctx, every)
		err := r.cfg.Store.KeepAlive(kctx, id)
		cancel()
		switch {
		case err == nil:
			lastOK = time.Now()
		case ctx.Err() != nil:
			return
		case errors.Is(err, errdefs.ErrNotFound):
			r.log.Warn("node registration lease lost; registering again")
			return
		case refused(err):
			// Register again at once, which says whether it is for good.
			r.log.Warn("node registration renewal refused", "err", err)
			return
		case time.Since(lastOK) > r.cfg.TTL:
			// Not renewed for a whole TTL: the lease is gone, or soon will be.
			r.log.Warn("node registration not renewed for a TTL; registering again", "err", err)
			return
		default:
			r.log.Warn("node registration renewal failed", "err", err)
		}
	}
}

// refused reports an error that says the node's credentials are not
// accepted.
func refused(err error) bool {
	return errors.Is(err, errdefs.ErrUnauthenticated) || errors.Is(err, errdefs.ErrForbidden)
}

// Lease returns the lease of the current registration, 0 before the first.
func (r *Registrar) Lease() store.LeaseID { return store.LeaseID(r.lease.Load()) }

// Deregister removes the registration now, for a node leaving the fleet
// for good. Stop Run first, or it registers again.
func (r *Registrar) Deregister(ctx context.Context) error {
	id := store.LeaseID(r.lease.Swap(0))
	if id == 0 {
		return r.cfg.Store.Delete(ctx, Key(r.cfg.Node.ID))
	}
	return r.cfg.Store.Revoke(ctx, id)
}

// KnownPrefix is where nodes are remembered once they have registered: a
// registration vanishes with its lease, but a sandbox id that names a node
// seen before is lost, not unknown.
const KnownPrefix = "/nodes-known/"

// Remember records that node id has been part of the fleet. It is a
// create-only write: done once per node, it costs nothing after.
func Remember(ctx context.Context, st store.Store, id string) error {
	if !validID(id) {
		return errdefs.Invalid("fleet: node id %q", id)
	}
	v, _ := json.Marshal(struct {
		First time.Time `json:"first_registered"`
	}{time.Now().UTC()})
	err := st.Create(ctx, KnownPrefix+id, v)
	if errors.Is(err, errdefs.ErrConflict) {
		return nil
	}
	return err
}

// Known reports whether node id was ever remembered.
func Known(ctx context.Context, st store.Store, id string) (bool, error) {
	if !validID(id) {
		return false, nil
	}
	_, err := st.Get(ctx, KnownPrefix+id)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, errdefs.ErrNotFound):
		return false, nil
	}
	return false, err
}
