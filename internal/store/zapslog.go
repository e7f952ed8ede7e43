package store

import (
	"context"
	"log/slog"
	"sort"
	"strings"
	"sync/atomic"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// slogCore is a zapcore.Core that forwards etcd's zap log entries at or
// above a level to a slog.Handler, so warren has one logger, not two.
type slogCore struct {
	h       slog.Handler
	level   zapcore.Level
	closing *atomic.Bool // shared by every core derived with With
}

func newSlogCore(h slog.Handler, level zapcore.Level, closing *atomic.Bool) zapcore.Core {
	return &slogCore{
		h:       h.WithAttrs([]slog.Attr{slog.String("component", "etcd")}),
		level:   level,
		closing: closing,
	}
}

// noise are warnings etcd logs on every start of a loopback-only,
// single-member, auth-less cluster: true, and of no use to a warren user.
var noise = map[string]bool{
	"Running http and grpc server on single port. This is not recommended for production.": true,
	"simple token is not cryptographically signed":                                         true,
}

// transient are messages etcd logs, with this error, when a freshly
// elected member checks its storage version before its first term reached
// the database; the periodic re-check a few seconds later succeeds.
var transient = map[string]string{
	"Failed to detect schema version":  "missing term information",
	"failed to update storage version": "missing term information",
}

func (c *slogCore) Enabled(l zapcore.Level) bool { return l >= c.level }

func (c *slogCore) With(fields []zapcore.Field) zapcore.Core {
	return &slogCore{h: c.h.WithAttrs(slogAttrs(fields)), level: c.level, closing: c.closing}
}

func (c *slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	// A graceful stop makes etcd log every listener it closes as an error.
	if c.Enabled(e.Level) && !noise[e.Message] && !c.closing.Load() {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *slogCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	if isTransient(e.Message, fields) {
		return nil
	}
	r := slog.NewRecord(e.Time, slogLevel(e.Level), e.Message, 0)
	r.AddAttrs(slogAttrs(fields)...)
	return c.h.Handle(context.Background(), r)
}

func (c *slogCore) Sync() error { return nil }

func isTransient(msg string, fields []zapcore.Field) bool {
	want, ok := transient[msg]
	if !ok {
		return false
	}
	for _, f := range fields {
		if err, isErr := f.Interface.(error); isErr && f.Key == "error" && strings.Contains(err.Error(), want) {
			return true
		}
	}
	return false
}

func slogLevel(l zapcore.Level) slog.Level {
	switch {
	case l < zapcore.InfoLevel:
		return slog.LevelDebug
	case l == zapcore.InfoLevel:
		return slog.LevelInfo
	case l == zapcore.WarnLevel:
		return slog.LevelWarn
	default:
		return slog.LevelError
	}
}

// slogAttrs renders zap fields through zap's own map encoder, which knows
// every field type, and returns them sorted for stable output.
func slogAttrs(fields []zapcore.Field) []slog.Attr {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range fields {
		f.AddTo(enc)
	}
	attrs := make([]slog.Attr, 0, len(enc.Fields))
	for k, v := range enc.Fields {
		attrs = append(attrs, slog.Any(k, v))
	}
	sort.Slice(attrs, func(i, j int) bool { return attrs[i].Key < attrs[j].Key })
	return attrs
}

// nopLogger is the client logger when the caller gave none: the etcd
// client otherwise logs its retries at info level to stderr.
func nopLogger() *zap.Logger { return zap.NewNop() }
