package daemon

import (
	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/backend/fake"
)

// simulated is the fake backend standing in as "container", for agents
// that simulate nodes in these tests.
func simulated(dir string) (backend.Backend, error) {
	return fake.New(dir, fake.Options{Name: api.BackendContainer})
}
