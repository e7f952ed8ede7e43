package fake_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/backend/backendtest"
	"github.com/warrenhq/warren/internal/backend/fake"
	"github.com/warrenhq/warren/internal/errdefs"
)

func newFake(t *testing.T, base string, opts fake.Options) *fake.Backend {
	t.Helper()
	b, err := fake.New(base, opts)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestConformance(t *testing.T) {
	backendtest.Run(t, backendtest.Harness{
		New: func(t *testing.T) backend.Backend { return newFake(t, t.TempDir(), fake.Options{}) },
		Reopen: func(t *testing.T, old backend.Backend) backend.Backend {
			return newFake(t, old.(*fake.Backend).Base(), fake.Options{})
		},
		Spec: func(t *testing.T, id string) backend.Spec { return backend.Spec{ID: id} },
		Processes: func(t *testing.T, b backend.Backend, id string) int {
			return b.(*fake.Backend).Processes(id)
		},
	})
}

func TestCreateKnobs(t *testing.T) {
	ctx := context.Background()
	injected := errors.New("injected")
	var mu sync.Mutex
	var seen []string
	b := newFake(t, t.TempDir(), fake.Options{
		Name:        "container",
		CreateDelay: 300 * time.Millisecond,
		CreateHook: func(ctx context.Context, spec backend.Spec) error {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, spec.ID)
			if spec.ID == "fail" {
				return injected
			}
			return nil
		},
	})
	if b.Name() != "container" {
		t.Errorf("Name() = %q, want the override %q", b.Name(), "container")
	}

	// The delay holds the id: a concurrent Create of it conflicts.
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- b.Create(ctx, backend.Spec{ID: "slow"}) }()
	time.Sleep(50 * time.Millisecond)
	if err := b.Create(ctx, backend.Spec{ID: "slow"}); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Create during a slow Create of the same id: got %v, want ErrConflict", err)
	}
	if _, err := b.Inspect(ctx, "slow"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Inspect during Create: got %v, want ErrNotFound", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("slow Create: %v", err)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("Create took %v, want at least the 300ms delay", d)
	}

	if err := b.Create(ctx, backend.Spec{ID: "fail"}); !errors.Is(err, injected) {
		t.Errorf("Create with an injected error: got %v, want it", err)
	}
	if _, err := os.Stat(filepath.Join(b.Base(), "fail")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed Create left %s behind", filepath.Join(b.Base(), "fail"))
	}
	if len(seen) != 2 {
		t.Errorf("hook saw %q, want the 2 Creates that passed the delay", seen)
	}

	// ctx ends during the delay: nothing is created.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := b.Create(short, backend.Spec{ID: "cancelled"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Create whose ctx ends in the delay: got %v, want DeadlineExceeded", err)
	}
	if err := b.Create(ctx, backend.Spec{ID: "cancelled"}); err != nil {
		t.Errorf("Create after a cancelled one: %v", err)
	}
}

func TestAvailable(t *testing.T) {
	b := newFake(t, t.TempDir(), fake.Options{})
	if err := b.Available(context.Background()); err != nil {
		t.Errorf("Available() = %v, want nil", err)
	}
	down := errdefs.Unavailable("no kvm")
	b = newFake(t, t.TempDir(), fake.Options{Unavailable: down})
	if err := b.Available(context.Background()); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("Available() = %v, want the injected ErrUnavailable", err)
	}
}

// A restarted agent that destroys without recovering first still cleans
// up, and a leftover directory blocks Create of its id.
func TestLeftoversAfterRestart(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	b := newFake(t, base, fake.Options{})
	if err := b.Create(ctx, backend.Spec{ID: "old"}); err != nil {
		t.Fatal(err)
	}
	b2 := newFake(t, base, fake.Options{})
	if err := b2.Create(ctx, backend.Spec{ID: "old"}); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Create over a leftover sandbox: got %v, want ErrConflict", err)
	}
	if err := b2.Destroy(ctx, "old"); err != nil {
		t.Fatalf("Destroy of an unrecovered sandbox: %v", err)
	}
	if _, err := os.Stat(filepath.Join(base, "old")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Destroy left %s behind", filepath.Join(base, "old"))
	}
}

func TestRecoverRejectsUnknownVersion(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	b := newFake(t, base, fake.Options{})
	if err := b.Create(ctx, backend.Spec{ID: "v"}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(base, "v", "state.json"), []byte(`{"version":99}`), 0o600); err != nil {
		t.Fatal(err)
	}
	b2 := newFake(t, base, fake.Options{})
	if _, err := b2.Recover(ctx, backend.Spec{ID: "v"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Recover of a version 99 state: got %v, want ErrInvalid", err)
	}
}
