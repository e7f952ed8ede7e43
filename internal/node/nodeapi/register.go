package nodeapi

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/fleet"
	"github.com/warrenhq/warren/internal/store"
)

// LeaseRequest is the body of PUT /v1/nodes/{id}/lease on an apiserver:
// an agent that reaches only the apiserver registers through it.
type LeaseRequest struct {
	Node api.Node `json:"node"`
	// Secret is the node API's secret (fleet.Registration.Secret).
	Secret string       `json:"secret"`
	TTL    api.Duration `json:"ttl"`
}

// LeaseAnswer is the answer to a LeaseRequest.
type LeaseAnswer struct {
	Lease int64 `json:"lease"`
}

// Registrations is the apiservers' node registration endpoint as an agent
// calls it: a fleet.Leaser for a Registrar on an agent that has no access
// to etcd. Keys are fleet.Key(id). Each call goes to the first apiserver
// that answers, in order: any replica serves it, since they share etcd.
type Registrations struct {
	cs []*Client // their id is "apiserver", their base an apiserver's
}

var _ fleet.Leaser = (*Registrations)(nil)

// NewRegistrations returns the registration endpoint of the apiservers at
// addrs (URLs, or host:port), called with token: an IAM token of role
// node. A token the apiservers refuse makes every call ErrUnauthenticated
// (or ErrForbidden for a token of another role).
func NewRegistrations(addrs []string, token string, hc *http.Client) *Registrations {
	r := &Registrations{}
	for _, a := range addrs {
		c := NewClient("apiserver", a, token, hc)
		c.apiserver = true
		r.cs = append(r.cs, c)
	}
	return r
}

// doJSON is Client.doJSON on the first apiserver that answers.
func (r *Registrations) doJSON(ctx context.Context, method, path string, in, out any) error {
	err := errdefs.Unavailable("no apiserver to register with")
	for _, c := range r.cs {
		err = c.doJSON(ctx, method, path, nil, in, out)
		if errdefs.Code(err) != api.CodeNodeUnreachable || ctx.Err() != nil {
			return err
		}
	}
	return err
}

func nodeOfKey(key string) (string, error) {
	id, ok := strings.CutPrefix(key, fleet.Prefix)
	if !ok || id == "" || strings.Contains(id, "/") {
		return "", errdefs.Invalid("registration key %q: want %s<node id>", key, fleet.Prefix)
	}
	return id, nil
}

func nodePath(id, suffix string) string { return "/v1/nodes/" + id + suffix }

// PutWithLease registers the node whose registration (a
// fleet.Registration) is value.
func (r *Registrations) PutWithLease(ctx context.Context, key string, value []byte, ttl time.Duration) (store.LeaseID, error) {
	id, err := nodeOfKey(key)
	if err != nil {
		return 0, err
	}
	var n fleet.Registration
	if err := json.Unmarshal(value, &n); err != nil {
		return 0, errdefs.Invalid("registration of %s: %v", id, err)
	}
	req := LeaseRequest{Node: n.Node, Secret: n.Secret, TTL: api.Duration(ttl)}
	var ans LeaseAnswer
	if err := r.doJSON(ctx, http.MethodPut, nodePath(id, "/lease"), req, &ans); err != nil {
		return 0, err
	}
	return store.LeaseID(ans.Lease), nil
}

// KeepAlive renews a registration's lease; ErrNotFound once it is gone.
func (r *Registrations) KeepAlive(ctx context.Context, lease store.LeaseID) error {
	return r.doJSON(ctx, http.MethodPost, leasePath(lease)+"/keepalive", nil, nil)
}

// Revoke ends a registration's lease, deleting the registration.
func (r *Registrations) Revoke(ctx context.Context, lease store.LeaseID) error {
	return r.doJSON(ctx, http.MethodDelete, leasePath(lease), nil, nil)
}

// Delete removes a registration.
func (r *Registrations) Delete(ctx context.Context, key string) error {
	id, err := nodeOfKey(key)
	if err != nil {
		return err
	}
	return r.doJSON(ctx, http.MethodDelete, nodePath(id, "/lease"), nil, nil)
}

func leasePath(lease store.LeaseID) string {
	return "/v1/node-leases/" + strconv.FormatInt(int64(lease), 10)
}
