package fake

import (
	"context"

	"github.com/warrenhq/warren/internal/backend"
)

var _ backend.Statser = (*Backend)(nil)

// Stats counts the live processes of the sandbox's execs; the fake has no
// cgroups, so CPU and memory are zero.
func (b *Backend) Stats(ctx context.Context, id string) (backend.Stats, error) {
	if _, err := b.Inspect(ctx, id); err != nil {
		return backend.Stats{}, err
	}
	return backend.Stats{PIDs: int64(b.Processes(id))}, nil
}
