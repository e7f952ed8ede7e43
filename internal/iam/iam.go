package iam

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warrenhq/warren/internal/store"
)

// Stable error codes iam attaches (see also api.Code*).
const (
	CodeInvalidProject     = "invalid_project"
	CodeProjectNotFound    = "project_not_found"
	CodeProjectExists      = "project_exists"
	CodeProjectHasChildren = "project_has_children"
	CodeProjectInUse       = "project_in_use"
	CodeTooManyProjects    = "too_many_projects"
	// CodeQuotaExceedsParent: the delegated quotas under a project would
	// add up to more than its own.
	CodeQuotaExceedsParent = "quota_exceeds_parent"
	// CodeQuotaBelowChildren: a project's quota would drop below what it
	// has delegated to its sub-projects.
	CodeQuotaBelowChildren = "quota_below_children"
	CodeQuotaExceeded      = "quota_exceeded" // 429 with Retry-After
	CodeRequestTooLarge    = "request_exceeds_quota"
	CodeRateLimited        = "rate_limited" // 429 with Retry-After
	CodeTokenNotFound      = "token_not_found"
	CodeIdempotencyReused  = "idempotency_key_reused"
	CodeIdempotencyLost    = "idempotency_claim_lost"
)

// UsageSource is the fleet view as admission reads it. It must be cheap
// and safe for concurrent use: Reserve calls it with a lock held, once per
// project it looks at.
type UsageSource interface {
	// Usage returns what the live sandboxes of project and of all its
	// sub-projects use (the whole subtree, "" for everything). Tally
	// implements it.
	Usage(project string) Resources
}

// Options tune an IAM. Zero values take the defaults.
type Options struct {
	// Usage is the fleet view; nil counts only in-flight reservations.
	Usage UsageSource
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
	// AuthCacheTTL bounds how long a token check is cached, and so how
	// long a token revoked through another apiserver keeps working here.
	// Default 5s.
	AuthCacheTTL time.Duration
	// AuthCacheSize bounds the entries cached (positive and negative).
	// Default 10000.
	AuthCacheSize int
	// TreeRefresh bounds how stale this replica's copy of the project tree
	// (quotas) may be when another replica changed it. Default 2s.
	TreeRefresh time.Duration
	// ReservationTimeout frees a reservation neither committed nor
	// released (a caller that died). It must exceed the longest create.
	// Default 2m.
	ReservationTimeout time.Duration
	// CommitHold keeps a committed reservation counted this long, to cover
	// the usage source's lag in seeing the new sandbox (the fleet view's
	// poll interval). A negative value drops it at once (for a usage source
	// updated synchronously on create). Default 5s.
	CommitHold time.Duration
	// QuotaRetryAfter is the Retry-After hint of a quota refusal. Default 5s.
	QuotaRetryAfter time.Duration
	// MaxProjects caps the tree (it is one etcd value, see package doc).
	// Default 4096.
	MaxProjects int
}

func (o *Options) defaults() {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.AuthCacheTTL <= 0 {
		o.AuthCacheTTL = 5 * time.Second
	}
	if o.AuthCacheSize <= 0 {
		o.AuthCacheSize = 10000
	}
	if o.TreeRefresh <= 0 {
		o.TreeRefresh = 2 * time.Second
	}
	if o.ReservationTimeout <= 0 {
		o.ReservationTimeout = 2 * time.Minute
	}
	if o.CommitHold == 0 {
		o.CommitHold = 5 * time.Second
	}
	if o.QuotaRetryAfter <= 0 {
		o.QuotaRetryAfter = 5 * time.Second
	}
	if o.MaxProjects <= 0 {
		o.MaxProjects = 4096
	}
}

// IAM holds projects, tokens and admission over one store. Safe for
// concurrent use; several apiserver replicas may share a store (see the
// package doc for what each guarantee becomes then).
type IAM struct {
	st   store.Store
	opts Options
	now  func() time.Time

	tree       atomic.Pointer[tree]
	reloadMu   sync.Mutex
	lastReload atomic.Int64 // unix nanos of the last forced reload

	auth authCache
	adm  admission
}

// New returns an IAM over st. It reads nothing yet: the first call loads
// the project tree.
func New(st store.Store, opts Options) *IAM {
	opts.defaults()
	i := &IAM{st: st, opts: opts, now: opts.Now}
	i.auth.init(opts.AuthCacheSize)
	i.adm.init()
	return i
}

// currentTree returns the cached project tree, reloading it when older than
// TreeRefresh. One caller reloads while the others go on with the old copy,
// so a slow store never stalls admission; only the very first load waits.
func (i *IAM) currentTree(ctx context.Context) (*tree, error) {
	t := i.tree.Load()
	if t != nil && i.now().Sub(t.loaded) < i.opts.TreeRefresh {
		return t, nil
	}
	if t != nil {
		if !i.reloadMu.TryLock() {
			return t, nil
		}
	} else {
		i.reloadMu.Lock()
		if t = i.tree.Load(); t != nil && i.now().Sub(t.loaded) < i.opts.TreeRefresh {
			i.reloadMu.Unlock()
			return t, nil
		}
	}
	defer i.reloadMu.Unlock()
	nt, err := i.loadTree(ctx)
	if err != nil {
		if t != nil {
			return t, nil // serve the last good copy while the store is away
		}
		return nil, err
	}
	return nt, nil
}

// treeWith returns a tree that holds project if the store has it: a miss
// in the cached copy (a project just created through another replica)
// forces one reload, at most every 250ms.
func (i *IAM) treeWith(ctx context.Context, project string) (*tree, error) {
	t, err := i.currentTree(ctx)
	if err != nil {
		return nil, err
	}
	if t.nodes[project] != nil {
		return t, nil
	}
	now := i.now().UnixNano()
	last := i.lastReload.Load()
	if now-last < int64(250*time.Millisecond) || !i.lastReload.CompareAndSwap(last, now) {
		return t, nil
	}
	if nt, err := i.loadTree(ctx); err == nil {
		return nt, nil
	}
	return t, nil
}

// loadTree reads the tree from the store and installs it unless a newer
// one is already cached.
func (i *IAM) loadTree(ctx context.Context) (*tree, error) {
	doc, rev, err := i.loadDoc(ctx)
	if err != nil {
		return nil, err
	}
	return i.install(buildTree(doc, rev, i.now())), nil
}

func (i *IAM) install(t *tree) *tree {
	for {
		old := i.tree.Load()
		if old != nil && old.rev > t.rev {
			return old
		}
		if i.tree.CompareAndSwap(old, t) {
			return t
		}
	}
}

func newID(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return hex.EncodeToString(b)
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
