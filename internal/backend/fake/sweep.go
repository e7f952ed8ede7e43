package fake

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
)

// Sweep removes the sandboxes under the base directory that orphan claims
// (the agent has no record of them), killing what their execs left
// running, and says what it removed. Sandboxes this Backend knows (created
// or recovered) are never touched.
func (b *Backend) Sweep(ctx context.Context, orphan func(id string) bool) ([]string, error) {
	entries, err := os.ReadDir(b.base)
	if err != nil {
		return nil, fmt.Errorf("fake: sweep: %w", err)
	}
	var removed []string
	for _, e := range entries {
		id := e.Name()
		if !e.IsDir() || validID(id) != nil || !orphan(id) {
			continue
		}
		b.mu.Lock()
		_, known := b.boxes[id]
		b.mu.Unlock()
		if known {
			continue
		}
		dir := filepath.Join(b.base, id)
		root := filepath.Join(dir, "root")
		if n := len(tagged(root)); n > 0 {
			killAll(ctx, root, 0)
			removed = append(removed, fmt.Sprintf("%d processes of sandbox %s", n, id))
		}
		if err := removeAll(dir); err != nil {
			return removed, fmt.Errorf("fake: sweep %s: %w", id, err)
		}
		removed = append(removed, "directory "+dir)
	}
	return removed, nil
}
