package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/warrenhq/warren/internal/apiserver"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/store"
)

// usageResync is how often what each project's sandboxes use is re-read
// from the node, which catches what the create path does not see (TTL and
// idle expiry, deletes).
const usageResync = time.Second

// iamParts is an apiserver's identity and admission wiring.
type iamParts struct {
	IAM         *iam.IAM
	Idempotency *iam.Idempotency
	// Usage is the usage source quota admission reads; the apiserver
	// counts its creates in it, and Usage.Follow (one in-process node) or
	// the fleet view's polls (Usage.Resync) correct it.
	Usage *apiserver.Usage
}

// startIAM builds projects, tokens, quota admission and idempotency
// records over st and registers adminSecret (the admin-token file's) as the
// root admin token, so the file keeps working across restarts. It sweeps
// expired idempotency keys until ctx ends.
func startIAM(ctx context.Context, st store.Store, adminSecret string, log *slog.Logger) (*iamParts, error) {
	usage := apiserver.NewUsage()
	// Usage counts a create when it returns and a delete when it is done:
	// no need to hold reservations after Commit, and a quota refusal may
	// ask for a retry after one resync.
	m := iam.New(st, iam.Options{Usage: usage, CommitHold: -1, QuotaRetryAfter: usageResync})
	if _, err := m.EnsureAdmin(ctx, adminSecret); err != nil {
		return nil, fmt.Errorf("bootstrap admin token: %w", err)
	}
	idem := iam.NewIdempotency(st, iam.IdempotencyOptions{})
	go func() {
		t := time.NewTicker(10 * time.Minute)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if _, err := idem.Sweep(ctx); err != nil && ctx.Err() == nil {
					log.Warn("sweep idempotency keys", "err", err)
				}
			}
		}
	}()
	return &iamParts{IAM: m, Idempotency: idem, Usage: usage}, nil
}
