package store

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"go.uber.org/zap"
)

func TestSlogCore(t *testing.T) {
	var buf bytes.Buffer
	closing := new(atomic.Bool)
	lg := zap.New(newSlogCore(slog.NewTextHandler(&buf, nil), zap.WarnLevel, closing))

	lg.Info("chatty")
	lg.With(zap.String("member", "m1")).Warn("slow fsync", zap.Int("ms", 1200), zap.Error(errors.New("disk")))
	lg.Warn("simple token is not cryptographically signed")
	lg.Error("failed to update storage version", zap.Error(errors.New("cannot detect storage schema version: missing term information")))
	lg.Error("failed to update storage version", zap.Error(errors.New("disk on fire")))
	closing.Store(true)
	lg.Error("setting up serving from embedded etcd failed.")

	got := buf.String()
	if n := strings.Count(got, "\n"); n != 2 {
		t.Fatalf("got %d lines, want the slow fsync warning and the real storage error:\n%s", n, got)
	}
	for _, want := range []string{"level=WARN", `msg="slow fsync"`, "component=etcd", "member=m1", "ms=1200", "error=disk"} {
		if !strings.Contains(got, want) {
			t.Errorf("log line %q lacks %s", got, want)
		}
	}
}
