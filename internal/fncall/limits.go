package fncall

import (
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
)

// limits are a run's resolved limits: every field set.
type limits struct {
	cpu, wall time.Duration
	memory    int64
	pids      int64
	output    int64
	fileSize  int64
}

// DefaultLimits apply to a call's cases where it sets none.
var DefaultLimits = api.FnLimits{
	CPUTime:  api.Duration(2 * time.Second),
	Memory:   256 << 20,
	PIDs:     64,
	Output:   1 << 20,
	FileSize: 16 << 20,
}

// DefaultCompileLimits apply to a runtime's compile step where its config
// sets none: compilers need more than the programs they build.
var DefaultCompileLimits = api.FnLimits{
	CPUTime:  api.Duration(10 * time.Second),
	WallTime: api.Duration(30 * time.Second),
	Memory:   1 << 30,
	PIDs:     64,
	Output:   1 << 20,
	FileSize: 256 << 20,
}

// MaxLimits are the largest a call may ask for; more is a 400.
var MaxLimits = api.FnLimits{
	CPUTime:  api.Duration(60 * time.Second),
	WallTime: api.Duration(180 * time.Second),
	Memory:   8 << 30,
	PIDs:     4096,
	Output:   64 << 20,
	FileSize: 1 << 30,
}

// resolve fills l's zero fields from def and checks them against max.
func resolve(l, def, max api.FnLimits) (limits, error) {
	pick := func(v, d int64) int64 {
		if v == 0 {
			return d
		}
		return v
	}
	r := limits{
		cpu:      time.Duration(pick(int64(l.CPUTime), int64(def.CPUTime))),
		wall:     time.Duration(pick(int64(l.WallTime), int64(def.WallTime))),
		memory:   pick(int64(l.Memory), int64(def.Memory)),
		pids:     pick(l.PIDs, def.PIDs),
		output:   pick(int64(l.Output), int64(def.Output)),
		fileSize: pick(int64(l.FileSize), int64(def.FileSize)),
	}
	if r.wall == 0 {
		r.wall = 2*r.cpu + time.Second
	}
	for _, c := range []struct {
		name   string
		v, max int64
	}{
		{"cpu_time", int64(r.cpu), int64(max.CPUTime)},
		{"wall_time", int64(r.wall), int64(max.WallTime)},
		{"memory", r.memory, int64(max.Memory)},
		{"pids", r.pids, max.PIDs},
		{"output", r.output, int64(max.Output)},
		{"file_size", r.fileSize, int64(max.FileSize)},
	} {
		if c.v < 0 {
			return r, errdefs.Invalid("limits.%s must not be negative", c.name)
		}
		if c.v > c.max {
			return r, errdefs.Invalid("limits.%s is above this node's maximum", c.name)
		}
	}
	if r.memory < 4<<20 {
		return r, errdefs.Invalid("limits.memory must be at least 4Mi")
	}
	if r.pids < 1 {
		return r, errdefs.Invalid("limits.pids must be at least 1")
	}
	return r, nil
}
