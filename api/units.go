package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Quantity is a byte count. On the wire it is a number of bytes or a string
// with a binary ("Ki", "Mi", "Gi", "Ti") or decimal ("k", "M", "G", "T")
// suffix, as in Kubernetes: "256Mi", "1G", "1048576".
type Quantity int64

var quantitySuffixes = []struct {
	suffix string
	mult   int64
}{
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40},
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"k", 1e3}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12},
	{"B", 1},
}

// ParseQuantity parses "256Mi", "1.5Gi", "1G" or a plain byte count.
func ParseQuantity(s string) (Quantity, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, fmt.Errorf("empty size")
	}
	mult := int64(1)
	// Longest suffix first so "MiB" is not read as "B".
	best := ""
	for _, q := range quantitySuffixes {
		if strings.HasSuffix(t, q.suffix) && len(q.suffix) > len(best) {
			best, mult = q.suffix, q.mult
		}
	}
	num := strings.TrimSpace(strings.TrimSuffix(t, best))
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("bad size %q: want a byte count like 256Mi, 1G or 1048576", s)
	}
	if f < 0 {
		return 0, fmt.Errorf("bad size %q: negative", s)
	}
	v := f * float64(mult)
	if v > math.MaxInt64/2 {
		return 0, fmt.Errorf("bad size %q: too large", s)
	}
	return Quantity(v), nil
}

// String formats q with the largest exact binary suffix.
func (q Quantity) String() string {
	for _, u := range []struct {
		s string
		m int64
	}{{"Ti", 1 << 40}, {"Gi", 1 << 30}, {"Mi", 1 << 20}, {"Ki", 1 << 10}} {
		if q != 0 && int64(q)%u.m == 0 {
			return strconv.FormatInt(int64(q)/u.m, 10) + u.s
		}
	}
	return strconv.FormatInt(int64(q), 10)
}

// MarshalJSON writes q as a string such as "256Mi".
func (q Quantity) MarshalJSON() ([]byte, error) { return json.Marshal(q.String()) }

// UnmarshalJSON accepts a number of bytes or a size string.
func (q *Quantity) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		*q = 0
		return nil
	}
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		v, err := ParseQuantity(s)
		if err != nil {
			return err
		}
		*q = v
		return nil
	}
	var f float64
	if err := json.Unmarshal(b, &f); err != nil {
		return fmt.Errorf("bad size %s: want a number or a string like \"256Mi\"", b)
	}
	if f < 0 || f > math.MaxInt64/2 || f != math.Trunc(f) {
		return fmt.Errorf("bad size %s: want a whole, non-negative byte count", b)
	}
	*q = Quantity(f)
	return nil
}

// Duration is a time.Duration that travels as a Go duration string ("30m",
// "2s") or a number of seconds.
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// String formats d like time.Duration.
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalJSON writes d as a duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON accepts "30m", "1h30m", "2s" or a number of seconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		*d = 0
		return nil
	}
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("bad duration %q: want e.g. \"30m\" or \"2s\"", s)
		}
		if v < 0 {
			return fmt.Errorf("bad duration %q: negative", s)
		}
		*d = Duration(v)
		return nil
	}
	var f float64
	if err := json.Unmarshal(b, &f); err != nil {
		return fmt.Errorf("bad duration %s: want a string like \"30m\" or seconds", b)
	}
	if f < 0 || f > float64(math.MaxInt64)/float64(time.Second) {
		return fmt.Errorf("bad duration %s: out of range", b)
	}
	*d = Duration(f * float64(time.Second))
	return nil
}
