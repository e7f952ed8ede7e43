package store_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/errdefs"

	"github.com/warrenhq/warren/internal/store"
	"github.com/warrenhq/warren/internal/store/storetest"
)

func TestMemory(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return store.Memory() })
}

func TestMemoryCloseEndsWatches(t *testing.T) {
	s := store.Memory().(store.Watcher)
	ch, err := s.Watch(context.Background(), "/")
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				if _, err := s.Watch(context.Background(), "/"); !errors.Is(err, errdefs.ErrUnavailable) {
					t.Fatalf("Watch on a closed store: got %v, want ErrUnavailable", err)
				}
				return
			}
		case <-timeout:
			t.Fatalf("watch still open 5s after Close")
		}
	}
}

// A watcher that does not read holds up no writer: its events queue.
func TestMemorySlowWatcher(t *testing.T) {
	s := store.Memory().(store.Watcher)
	defer s.Close()
	ch, err := s.Watch(context.Background(), "/k/")
	if err != nil {
		t.Fatal(err)
	}
	const n = 10000
	for i := range n {
		if err := s.Put(context.Background(), fmt.Sprintf("/k/%d", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	got := 0
	for ev := range ch {
		if ev.Type == store.EventPut {
			if got++; got == n {
				return
			}
		}
	}
}
