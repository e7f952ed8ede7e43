package iam_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/store"
)

func TestIdempotencyConcurrentReplays(t *testing.T) {
	testIdempotencyConcurrentReplays(t, store.Memory())
}

// testIdempotencyConcurrentReplays: 50 concurrent replays of one key,
// spread over two Idempotency instances (two apiservers), create exactly
// once and all answer with that one result.
func testIdempotencyConcurrentReplays(t *testing.T, st store.Store) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	replicas := []*iam.Idempotency{iam.NewIdempotency(st, iam.IdempotencyOptions{}), iam.NewIdempotency(st, iam.IdempotencyOptions{})}
	var creations atomic.Int64
	results := make([]string, 50)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			m := replicas[i%2]
			rec, claimed, err := m.Claim(ctx, "research", "rollout-42", "fp")
			if err != nil {
				t.Errorf("Claim %d: %v", i, err)
				return
			}
			if claimed {
				n := creations.Add(1)
				time.Sleep(20 * time.Millisecond) // the create
				res, _ := json.Marshal(fmt.Sprintf("sandbox-%d", n))
				if rec, err = m.Complete(ctx, rec, res); err != nil {
					t.Errorf("Complete: %v", err)
					return
				}
			}
			var id string
			json.Unmarshal(rec.Result, &id)
			results[i] = id
		}()
	}
	close(start)
	wg.Wait()
	if n := creations.Load(); n != 1 {
		t.Fatalf("got %d creations for one key, want 1", n)
	}
	for i, r := range results {
		if r != "sandbox-1" {
			t.Fatalf("replay %d: got %q, want sandbox-1", i, r)
		}
	}
}

func TestIdempotencyAbandonAndTakeover(t *testing.T) {
	ctx := context.Background()
	c := newClock()
	st := store.Memory()
	defer st.Close()
	m := iam.NewIdempotency(st, iam.IdempotencyOptions{Now: c.Now, ClaimTimeout: time.Minute, TTL: time.Hour})

	// A failed create gives the key back.
	rec, claimed, err := m.Claim(ctx, "p", "k", "")
	if err != nil || !claimed {
		t.Fatalf("first Claim: %v %v", claimed, err)
	}
	wantErr(t, "Abandon", m.Abandon(ctx, rec), nil, "")
	rec, claimed, err = m.Claim(ctx, "p", "k", "")
	if err != nil || !claimed {
		t.Fatalf("Claim after Abandon: %v %v", claimed, err)
	}

	// A holder that vanished is taken over after ClaimTimeout, and its late
	// Complete is refused so it can undo its duplicate.
	waitCtx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, _, err = m.Claim(waitCtx, "p", "k", "")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Claim while held: got %v, want to wait until ctx ends", err)
	}
	c.Advance(time.Minute)
	rec2, claimed, err := m.Claim(ctx, "p", "k", "")
	if err != nil || !claimed {
		t.Fatalf("Claim after ClaimTimeout: %v %v", claimed, err)
	}
	_, err = m.Complete(ctx, rec, json.RawMessage(`"late"`))
	wantErr(t, "late Complete", err, errdefs.ErrConflict, iam.CodeIdempotencyLost)
	done, err := m.Complete(ctx, rec2, json.RawMessage(`"sb"`))
	wantErr(t, "Complete", err, nil, "")
	if done.State != iam.IdemDone || string(done.Result) != `"sb"` {
		t.Fatalf("done record: %+v", done)
	}
	wantErr(t, "Abandon after Complete", m.Abandon(ctx, rec2), errdefs.ErrConflict, iam.CodeIdempotencyLost)

	// Replays get the result; another request body is refused.
	got, claimed, err := m.Claim(ctx, "p", "k", "")
	if err != nil || claimed || string(got.Result) != `"sb"` {
		t.Fatalf("replay: %+v %v %v", got, claimed, err)
	}
	// Same key, other project: independent.
	if _, claimed, _ := m.Claim(ctx, "q", "k", ""); !claimed {
		t.Fatal("same key in another project: not claimed")
	}

	// After TTL the key is forgotten and swept.
	c.Advance(time.Hour + 2*time.Minute)
	n, err := m.Sweep(ctx)
	if err != nil || n != 2 {
		t.Fatalf("Sweep: got %d, %v; want the 2 expired records", n, err)
	}
	if _, claimed, _ := m.Claim(ctx, "p", "k", ""); !claimed {
		t.Fatal("key after TTL: not claimed")
	}
}

func TestIdempotencyFingerprint(t *testing.T) {
	ctx := context.Background()
	m := iam.NewIdempotency(store.Memory(), iam.IdempotencyOptions{})
	rec, _, _ := m.Claim(ctx, "p", "k", "body-1")
	_, _, err := m.Claim(ctx, "p", "k", "body-2")
	wantErr(t, "other body while pending", err, errdefs.ErrConflict, iam.CodeIdempotencyReused)
	m.Complete(ctx, rec, json.RawMessage(`{}`))
	_, _, err = m.Claim(ctx, "p", "k", "body-2")
	wantErr(t, "other body when done", err, errdefs.ErrConflict, iam.CodeIdempotencyReused)
	if _, claimed, err := m.Claim(ctx, "p", "k", "body-1"); err != nil || claimed {
		t.Fatalf("same body: %v %v", claimed, err)
	}
	for _, bad := range []string{"", string(make([]byte, 256)), "tab\there"} {
		_, _, err := m.Claim(ctx, "p", bad, "")
		wantErr(t, fmt.Sprintf("key %q", bad), err, errdefs.ErrInvalid, "")
	}
}
