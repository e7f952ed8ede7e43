package iam

import (
	"fmt"
	"math"
	"strconv"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
)

// Resources counts what sandboxes use or ask for. In a Quota, a zero field
// means "no limit of this project's own" (it is still bounded by its
// ancestors' limits).
type Resources struct {
	Sandboxes int64 `json:"sandboxes,omitempty"`
	MilliCPU  int64 `json:"milli_cpu,omitempty"` // 1000 = one vCPU
	Memory    int64 `json:"memory,omitempty"`    // bytes
	Disk      int64 `json:"disk,omitempty"`      // bytes
}

// MilliCPU converts cores (as api.Resources.CPU carries them) to millicores,
// rounding up so a request is never under-counted.
func MilliCPU(cores float64) int64 {
	if cores <= 0 || math.IsNaN(cores) {
		return 0
	}
	return int64(math.Ceil(cores*1000 - 1e-9))
}

// Add returns r + o.
func (r Resources) Add(o Resources) Resources { return fromVec(r.vec().add(o.vec())) }

// Sub returns r - o.
func (r Resources) Sub(o Resources) Resources { return fromVec(r.vec().sub(o.vec())) }

// Mul returns r scaled by n (a gang of n identical sandboxes).
func (r Resources) Mul(n int64) Resources {
	v := r.vec()
	for d := range v {
		v[d] *= n
	}
	return fromVec(v)
}

// IsZero reports whether every field is zero.
func (r Resources) IsZero() bool { return r == Resources{} }

func (r Resources) validate(what string) error {
	for d, x := range r.vec() {
		if x < 0 {
			return errdefs.Invalid("%s: %s is negative (%d)", what, dimNames[d], x)
		}
	}
	return nil
}

// Quota is what a project may use: its whole subtree's usage stays within
// the Resources limits, its creates per second within CreatesPerSec and its
// FnCalls per second within FnCallsPerSec. Zero fields impose no limit of
// the project's own.
type Quota struct {
	Resources
	// CreatesPerSec limits sandbox creations per second (fractions allowed).
	CreatesPerSec float64 `json:"creates_per_sec,omitempty"`
	// CreatesBurst is the bucket size for CreatesPerSec; 0 means one
	// second's worth (at least 1).
	CreatesBurst int64 `json:"creates_burst,omitempty"`
	// FnCallsPerSec limits FnCalls (each call of a batch counts) per
	// second; FnCallsBurst is its bucket, like CreatesBurst.
	FnCallsPerSec float64 `json:"fn_calls_per_sec,omitempty"`
	FnCallsBurst  int64   `json:"fn_calls_burst,omitempty"`
}

func (q Quota) validate() error {
	if err := q.Resources.validate("quota"); err != nil {
		return err
	}
	for _, r := range []struct {
		name  string
		rate  float64
		burst int64
	}{{"creates", q.CreatesPerSec, q.CreatesBurst}, {"fn_calls", q.FnCallsPerSec, q.FnCallsBurst}} {
		if math.IsNaN(r.rate) || math.IsInf(r.rate, 0) || r.rate < 0 || r.rate > 1e9 {
			return errdefs.Invalid("quota: %s_per_sec %v must be between 0 and 1e9", r.name, r.rate)
		}
		if r.burst < 0 {
			return errdefs.Invalid("quota: %s_burst is negative (%d)", r.name, r.burst)
		}
	}
	return nil
}

// limits returns the quota as one vector: the four resources, then the
// creation and FnCall rates in thousandths per second (integers, so
// delegated rates add up exactly).
func (q Quota) limits() [nLimits]int64 {
	var l [nLimits]int64
	copy(l[:], q.Resources.vec().slice())
	l[dimRate] = int64(math.Round(q.CreatesPerSec * 1000))
	l[dimFnRate] = int64(math.Round(q.FnCallsPerSec * 1000))
	return l
}

// Dimensions. The first nRes are Resources fields; the rates are only
// limits.
const (
	dimSandboxes = iota
	dimCPU
	dimMemory
	dimDisk
	nRes
	dimRate   = nRes
	dimFnRate = nRes + 1
	nLimits   = nRes + 2
)

var dimNames = [nLimits]string{"sandboxes", "cpu", "memory", "disk", "creates/s", "fn calls/s"}

type vec [nRes]int64

func (r Resources) vec() vec { return vec{r.Sandboxes, r.MilliCPU, r.Memory, r.Disk} }

func fromVec(v vec) Resources {
	return Resources{Sandboxes: v[dimSandboxes], MilliCPU: v[dimCPU], Memory: v[dimMemory], Disk: v[dimDisk]}
}

func (v vec) slice() []int64 { return v[:] }

func (v vec) add(o vec) vec {
	for d := range v {
		v[d] += o[d]
	}
	return v
}

func (v vec) sub(o vec) vec {
	for d := range v {
		v[d] -= o[d]
	}
	return v
}

// fmtDim formats an amount of dimension d for messages.
func fmtDim(d int, x int64) string {
	switch d {
	case dimCPU:
		return strconv.FormatFloat(float64(x)/1000, 'f', -1, 64) + " vCPU"
	case dimMemory, dimDisk:
		return api.Quantity(x).String()
	case dimRate, dimFnRate:
		return strconv.FormatFloat(float64(x)/1000, 'f', -1, 64) + "/s"
	}
	return fmt.Sprint(x)
}
