package main

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Output formats for -o.
const (
	outDefault = ""
	outJSON    = "json"
	outID      = "id"
)

func checkOutput(o string, allowed ...string) error {
	for _, a := range allowed {
		if o == a {
			return nil
		}
	}
	return usagef("unknown output format %q (want one of %s)", o, strings.Join(allowed[1:], ", "))
}

func writeJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

func newTable(w io.Writer, header ...string) *tabwriter.Writer {
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	return tw
}

func row(tw *tabwriter.Writer, cols ...string) { fmt.Fprintln(tw, strings.Join(cols, "\t")) }

// age renders how long ago t was, like `docker ps`: 45s, 12m, 3h, 5d.
func age(t time.Time, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// kvList renders a map as sorted k=v pairs joined by sep; "-" when empty.
func kvList(m map[string]string, sep string) string {
	if len(m) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + m[k]
	}
	return strings.Join(parts, sep)
}

// parseKVs turns repeated KEY=VALUE flags into a map. A bare KEY takes its
// value from getenv when passthrough is set (like `docker run -e KEY`).
func parseKVs(flag string, vals []string, getenv func(string) string, passthrough bool) (map[string]string, error) {
	if len(vals) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(vals))
	for _, v := range vals {
		k, val, ok := strings.Cut(v, "=")
		if k == "" || (!ok && !passthrough) {
			return nil, usagef("bad --%s %q: want KEY=VALUE", flag, v)
		}
		if !ok {
			val = getenv(k)
		}
		m[k] = val
	}
	return m, nil
}

func fmtCPU(c float64) string {
	if c == 0 {
		return "-"
	}
	return strconv.FormatFloat(c, 'f', -1, 64)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func fmtBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
