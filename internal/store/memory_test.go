package store_test

import (
	"testing"

	"github.com/warrenhq/warren/internal/store"
	"github.com/warrenhq/warren/internal/store/storetest"
)

func TestMemory(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return store.Memory() })
}
