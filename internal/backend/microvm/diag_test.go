package microvm

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/qemu"
)

// diagnose logs what QEMU says of sandbox id's machine: run state,
// chardevs, where its CPU is (twice, to see whether it moves).
func (h *harness) diagnose(t *testing.T, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	q, err := qemu.DialQMP(ctx, filepath.Join(h.m.sandboxDir(id), qmpSock))
	if err != nil {
		t.Logf("diagnose: %v", err)
		return
	}
	defer q.Close()
	st, err := q.Status(ctx)
	t.Logf("diagnose: run state %q %v", st, err)
	for _, cmd := range []string{"info chardev", "info registers", "info registers"} {
		var out string
		q.Execute(ctx, "human-monitor-command", map[string]any{"command-line": cmd}, &out)
		if len(out) > 400 {
			out = out[:400]
		}
		t.Logf("diagnose: %s:\n%s", cmd, out)
		time.Sleep(time.Second)
	}
}
