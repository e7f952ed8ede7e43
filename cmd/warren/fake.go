//go:build warrenfake

package main

import (
	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/backend/fake"
)

// A test build's `warren agent --backend fake`: the fake backend standing
// in as "container", so that placement treats the node as any other.
func init() {
	simulatedBackend = func(dir string) (backend.Backend, error) {
		return fake.New(dir, fake.Options{Name: api.BackendContainer})
	}
}
