package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/store"
)

// Node identity. An agent keeps a node key in its data dir across restarts;
// its registration records the key's hash (Registration.Owner), and only
// the holder of that key may replace, renew through an apiserver, or remove
// a registration that is alive. So a restarted agent takes its own
// registration back at once, while no other agent, whatever its token, can
// take over a live node id or node name and reroute that node's calls.
// Claim writes the registration, the name's claim and the lease's record
// in one transaction under one lease: they live and expire together.

// Key prefixes of the claims a registration makes next to Key(id). Neither
// is under Prefix: the fleet watcher sees registrations only.
const (
	NamePrefix  = "/node-names/"  // name -> the node id and owner holding it
	LeasePrefix = "/node-leases/" // lease -> the node id and owner it renews
	// OwnerPrefix binds a node id to the first owner that registered it,
	// for good: the node key lives in the data dir next to the node id,
	// so a legitimate agent never needs another's id, and a node that
	// died cannot have its sandboxes' calls rerouted by a newcomer either.
	OwnerPrefix = "/node-owners/"
)

// NodeKeyHeader carries an agent's node key on its calls to an
// apiserver's registration endpoint.
const NodeKeyHeader = "X-Warren-Node-Key"

// NameKey is where a node name's claim lives.
func NameKey(name string) string { return NamePrefix + name }

// LeaseKey is where a registration lease's record lives.
func LeaseKey(lease store.LeaseID) string { return LeasePrefix + strconv.FormatInt(int64(lease), 10) }

// Claimed is what a name's and a lease's records hold.
type Claimed struct {
	ID    string `json:"id"`
	Owner string `json:"owner"`
	Token string `json:"token,omitempty"` // the node token's id
}

// OwnerOf is the Registration.Owner of an agent holding node key key.
func OwnerOf(key string) string {
	h := sha256.Sum256([]byte("warren-node-key\x00" + key))
	return hex.EncodeToString(h[:])
}

// Claim registers reg (its Owner set) under a new lease of ttl, unless
// another owner's registration of reg.ID, or claim of reg.Name, is alive:
// ErrConflict with code api.CodeNodeRegistered or api.CodeNodeNameTaken.
// A registration of the same owner is replaced (the agent restarted). With
// bind (the owner is a node key, not a stand-in for an agent that sends
// none), reg.ID is also bound to its owner for good (OwnerPrefix): another
// owner is ErrForbidden (api.CodeNodeNotOwner) even once the node is gone.
func Claim(ctx context.Context, st store.LeaseTxn, reg Registration, ttl time.Duration, bind bool) (store.LeaseID, error) {
	if !validID(reg.ID) {
		return 0, errdefs.Invalid("fleet: node id %q", reg.ID)
	}
	if reg.Owner == "" {
		return 0, errdefs.Invalid("fleet: registration of %s has no owner", reg.ID)
	}
	for attempt := 0; ; attempt++ {
		lease, err := claimOnce(ctx, st, reg, ttl, bind)
		if errors.Is(err, errRaced) && attempt < 3 {
			continue
		}
		if errors.Is(err, errRaced) {
			err = errdefs.New(errdefs.ErrConflict, api.CodeNodeRegistered, "node %s: registration changed concurrently", reg.ID)
		}
		return lease, err
	}
}

var errRaced = errors.New("fleet: claim raced")

func claimOnce(ctx context.Context, st store.LeaseTxn, reg Registration, ttl time.Duration, bind bool) (store.LeaseID, error) {
	idVer, err := ownedVersion(ctx, st, Key(reg.ID), reg.Owner, func(v []byte) (string, error) {
		var cur Registration
		err := json.Unmarshal(v, &cur)
		return cur.Owner, err
	})
	if err != nil {
		return 0, errdefs.New(errdefs.ErrConflict, api.CodeNodeRegistered,
			"node %s is registered by another agent that is alive (its data dir holds another node key); stop it, or wait for its registration to expire", reg.ID)
	}
	if bind {
		if err := bindOwner(ctx, st, reg.ID, reg.Owner); err != nil {
			return 0, err
		}
	}
	kvs := []store.KV{{Key: Key(reg.ID), Version: idVer}}
	if reg.Name != "" {
		nameVer, err := ownedVersion(ctx, st, NameKey(reg.Name), reg.Owner, func(v []byte) (string, error) {
			var c Claimed
			err := json.Unmarshal(v, &c)
			return c.Owner, err
		})
		if err != nil {
			return 0, errdefs.New(errdefs.ErrConflict, api.CodeNodeNameTaken,
				"node name %q is registered by another agent that is alive; one agent per name", reg.Name)
		}
		c, _ := json.Marshal(Claimed{ID: reg.ID, Owner: reg.Owner, Token: reg.Token})
		kvs = append(kvs, store.KV{Key: NameKey(reg.Name), Value: c, Version: nameVer})
	}
	lease, err := st.Grant(ctx, ttl)
	if err != nil {
		return 0, err
	}
	reg.Lease = int64(lease)
	v, err := json.Marshal(reg)
	if err != nil {
		return 0, err
	}
	kvs[0].Value = v
	c, _ := json.Marshal(Claimed{ID: reg.ID, Owner: reg.Owner, Token: reg.Token})
	kvs = append(kvs, store.KV{Key: LeaseKey(lease), Value: c})
	err = st.PutAllLeased(ctx, lease, kvs)
	if err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		st.Revoke(rctx, lease) // best effort: it expires anyway
		cancel()
		if errors.Is(err, errdefs.ErrConflict) {
			return 0, errRaced
		}
		return 0, err
	}
	return lease, nil
}

// bindOwner binds node id to owner if it is bound to nobody yet;
// ErrForbidden (api.CodeNodeNotOwner) if another owner has it.
func bindOwner(ctx context.Context, st store.Store, id, owner string) error {
	v, _ := json.Marshal(Claimed{ID: id, Owner: owner})
	err := st.Create(ctx, OwnerPrefix+id, v)
	if err == nil || !errors.Is(err, errdefs.ErrConflict) {
		return err
	}
	kv, err := st.Get(ctx, OwnerPrefix+id)
	if err != nil {
		return err
	}
	var c Claimed
	if json.Unmarshal(kv.Value, &c) == nil && c.Owner == owner {
		return nil
	}
	return errdefs.New(errdefs.ErrForbidden, api.CodeNodeNotOwner,
		"node id %s belongs to the agent that first registered it (another data dir); a new agent draws a new node id", id)
}

// errOwned: the key is alive and another owner's.
var errOwned = errors.New("fleet: owned by another")

// ownedVersion returns key's version if it is absent (0) or owner's;
// errOwned if another owner holds it. A value that does not decode is
// nobody's.
func ownedVersion(ctx context.Context, st store.Store, key, owner string, ownerOf func([]byte) (string, error)) (int64, error) {
	kv, err := st.Get(ctx, key)
	if errors.Is(err, errdefs.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if o, derr := ownerOf(kv.Value); derr == nil && o != owner {
		return 0, errOwned
	}
	return kv.Version, nil
}

// CheckLease says whether owner may renew or revoke lease: nil if the
// lease's record names owner; ErrNotFound (the lease is gone) or
// ErrForbidden (code api.CodeNodeNotOwner) otherwise.
func CheckLease(ctx context.Context, st store.Store, lease store.LeaseID, owner string) error {
	kv, err := st.Get(ctx, LeaseKey(lease))
	if errors.Is(err, errdefs.ErrNotFound) {
		return errdefs.New(errdefs.ErrNotFound, "lease_not_found", "registration lease %d expired or revoked", int64(lease))
	}
	if err != nil {
		return err
	}
	var c Claimed
	if err := json.Unmarshal(kv.Value, &c); err != nil {
		return fmt.Errorf("fleet: lease record %d: %w", int64(lease), err)
	}
	if c.Owner != owner {
		return errdefs.New(errdefs.ErrForbidden, api.CodeNodeNotOwner, "registration lease %d belongs to another agent", int64(lease))
	}
	return nil
}

// Release removes node id's registration if owner holds it (revoking its
// lease, and so its claims): ErrForbidden (api.CodeNodeNotOwner) if
// another owner does; nil if there is none.
func Release(ctx context.Context, st store.Watcher, id, owner string) error {
	kv, err := st.Get(ctx, Key(id))
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	var cur Registration
	if err := json.Unmarshal(kv.Value, &cur); err == nil && cur.Owner != owner {
		return errdefs.New(errdefs.ErrForbidden, api.CodeNodeNotOwner, "node %s is registered by another agent", id)
	}
	if cur.Lease != 0 {
		return st.Revoke(ctx, store.LeaseID(cur.Lease))
	}
	return st.Delete(ctx, Key(id)) // written by an older binary, without its lease
}
