package apiserver

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/fleet"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/node/nodeapi"
	"github.com/warrenhq/warren/internal/store"
)

// Node registration through the apiserver, for agents started with
// --apiserver that have no access to etcd. They call it with a node token
// (an IAM token of role node), and register the secret their node API
// accepts (fleet.Registration), which goes to etcd and nowhere else.
//
// Node identity: an agent sends its node key (fleet.NodeKeyHeader) with
// every call, and only the agent holding the key of a live registration
// may replace, renew or remove it (fleet.Claim); an agent that sends none
// is identified by its token instead. A token bound to a node name
// registers that name only.
//
//	PUT    /v1/nodes/{id}/lease              LeaseRequest -> LeaseAnswer
//	POST   /v1/node-leases/{lease}/keepalive 204, or 404 once the lease is gone
//	DELETE /v1/node-leases/{lease}           204: revoke, deleting the registration
//	DELETE /v1/nodes/{id}/lease              204: delete the registration

// maxRegistrationTTL bounds a lease an agent asks for: a node that dies
// must drop out of the fleet within it.
const maxRegistrationTTL = time.Minute

func (s *Server) nodeRoutes() {
	h := s.nodeAuthenticated
	s.mux.Handle("PUT /v1/nodes/{id}/lease", h(s.registerNode))
	s.mux.Handle("POST /v1/node-leases/{lease}/keepalive", h(s.keepAliveNode))
	s.mux.Handle("DELETE /v1/node-leases/{lease}", h(s.revokeNode))
	s.mux.Handle("DELETE /v1/nodes/{id}/lease", h(s.deregisterNode))
}

// nodeAuthenticated lets through the callers that may register nodes.
func (s *Server) nodeAuthenticated(h handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r, err := s.checkNodeAuth(r)
		if err == nil && s.cfg.Registrations == nil {
			err = errdefs.Unavailable("this apiserver registers no nodes")
		}
		if err == nil {
			err = h(w, r)
		}
		if err != nil {
			s.writeError(w, r, err)
		}
	})
}

// nodeCaller is the node token's principal and the agent's identity.
type nodeCaller struct {
	p     iam.Principal
	owner string // fleet.Registration.Owner of the calling agent
	keyed bool   // owner is the agent's node key, not its token
}

type nodeCallerKey struct{}

func (s *Server) checkNodeAuth(r *http.Request) (*http.Request, error) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || tok == "" {
		return r, errdefs.New(errdefs.ErrUnauthenticated, api.CodeUnauthenticated, "missing bearer token")
	}
	if s.cfg.Tokens == nil {
		return r, errdefs.New(errdefs.ErrUnauthenticated, api.CodeUnauthenticated, "invalid node token")
	}
	p, err := s.cfg.Tokens.Authenticate(r.Context(), tok)
	if err != nil {
		return r, err
	}
	if err := iam.Authorize(p, iam.ActionNode, ""); err != nil {
		return r, err
	}
	c := nodeCaller{p: p, owner: fleet.OwnerOf("token:" + p.TokenID)}
	if k := r.Header.Get(fleet.NodeKeyHeader); k != "" {
		if len(k) < 16 || len(k) > 256 {
			return r, errdefs.Invalid("%s: want 16 to 256 characters", fleet.NodeKeyHeader)
		}
		c.owner, c.keyed = fleet.OwnerOf(k), true
	}
	return r.WithContext(context.WithValue(r.Context(), nodeCallerKey{}, c)), nil
}

func callerOf(r *http.Request) nodeCaller {
	c, _ := r.Context().Value(nodeCallerKey{}).(nodeCaller)
	return c
}

func (s *Server) leaseTxn() (store.LeaseTxn, error) {
	st, ok := s.cfg.Registrations.(store.LeaseTxn)
	if !ok {
		return nil, errdefs.Unavailable("this apiserver's registration store cannot claim node registrations")
	}
	return st, nil
}

func (s *Server) registerNode(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	var req nodeapi.LeaseRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	n := req.Node
	if n.ID != id {
		return errdefs.Invalid("registration of node %q at /v1/nodes/%s", n.ID, id)
	}
	if n.Address == "" {
		return errdefs.Invalid("registration of node %s: no address", id)
	}
	if req.Secret == "" {
		return errdefs.Invalid("registration of node %s: no node secret", id)
	}
	ttl := req.TTL.D()
	if ttl <= 0 || ttl > maxRegistrationTTL {
		return errdefs.Invalid("registration ttl %v: want 1s..%v", ttl, maxRegistrationTTL)
	}
	c := callerOf(r)
	name, err := iam.BoundNodeName(c.p, n.Name)
	if err != nil {
		return err
	}
	// Only what a registration holds: usage and health come from polls.
	reg := api.Node{ID: id, Name: name, Address: n.Address, Pool: n.Pool, Labels: n.Labels, Backends: n.Backends, Capacity: n.Capacity}
	if reg.Pool == "" {
		reg.Pool = api.PoolOnPrem
	}
	if reg.Pool != api.PoolOnPrem && reg.Pool != api.PoolCloud {
		return errdefs.Invalid("node pool %q: want %s or %s", reg.Pool, api.PoolOnPrem, api.PoolCloud)
	}
	if err := api.CheckLabels("labels", reg.Labels, api.MaxLabels); err != nil {
		return errdefs.Request(fmt.Errorf("registration of node %s: %w", id, err))
	}
	st, err := s.leaseTxn()
	if err != nil {
		return err
	}
	if err := fleet.Remember(r.Context(), s.cfg.Registrations, id); err != nil {
		return err
	}
	lease, err := fleet.Claim(r.Context(), st, fleet.Registration{Node: reg, Secret: req.Secret, Owner: c.owner, Token: c.p.TokenID}, ttl, c.keyed)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, nodeapi.LeaseAnswer{Lease: int64(lease)})
}

func leaseParam(r *http.Request) (store.LeaseID, error) {
	n, err := strconv.ParseInt(r.PathValue("lease"), 10, 64)
	if err != nil || n <= 0 {
		return 0, errdefs.Invalid("lease %q: want a positive integer", r.PathValue("lease"))
	}
	return store.LeaseID(n), nil
}

func (s *Server) keepAliveNode(w http.ResponseWriter, r *http.Request) error {
	lease, err := leaseParam(r)
	if err != nil {
		return err
	}
	// Bounded: with etcd down, KeepAlive waits for its context.
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	if err := fleet.CheckLease(ctx, s.cfg.Registrations, lease, callerOf(r).owner); err != nil {
		return err
	}
	if err := s.cfg.Registrations.KeepAlive(ctx, lease); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) revokeNode(w http.ResponseWriter, r *http.Request) error {
	lease, err := leaseParam(r)
	if err != nil {
		return err
	}
	if err := fleet.CheckLease(r.Context(), s.cfg.Registrations, lease, callerOf(r).owner); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			w.WriteHeader(http.StatusNoContent) // revoking a lease that is gone is no error
			return nil
		}
		return err
	}
	if err := s.cfg.Registrations.Revoke(r.Context(), lease); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) deregisterNode(w http.ResponseWriter, r *http.Request) error {
	if err := fleet.Release(r.Context(), s.cfg.Registrations, r.PathValue("id"), callerOf(r).owner); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
