package api

import (
	"encoding/json"
	"testing"
	"time"
)

func TestQuantityJSON(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Quantity
		wantErr bool
	}{
		{`"256Mi"`, 256 << 20, false},
		{`"1Gi"`, 1 << 30, false},
		{`"1.5Gi"`, 3 << 29, false},
		{`"1G"`, 1e9, false},
		{`"512k"`, 512e3, false},
		{`"64MiB"`, 64 << 20, false},
		{`1048576`, 1 << 20, false},
		{`"1048576"`, 1 << 20, false},
		{`null`, 0, false},
		{`"lots"`, 0, true},
		{`"-1Mi"`, 0, true},
		{`-5`, 0, true},
		{`1.5`, 0, true},
		{`"1e30Ti"`, 0, true},
		{`"NaN"`, 0, true},
		{`""`, 0, true},
		{`true`, 0, true},
	} {
		var q Quantity
		err := json.Unmarshal([]byte(tc.in), &q)
		if (err != nil) != tc.wantErr {
			t.Errorf("Unmarshal(%s): err = %v, want error %v", tc.in, err, tc.wantErr)
			continue
		}
		if err == nil && q != tc.want {
			t.Errorf("Unmarshal(%s) = %d, want %d", tc.in, q, tc.want)
		}
	}
}

func TestQuantityRoundTrip(t *testing.T) {
	for _, q := range []Quantity{0, 1, 1023, 1024, 256 << 20, 3 << 30, 5 << 40, 1e9} {
		b, err := json.Marshal(q)
		if err != nil {
			t.Fatal(err)
		}
		var got Quantity
		if err := json.Unmarshal(b, &got); err != nil || got != q {
			t.Errorf("round trip %d via %s = %d, %v", q, b, got, err)
		}
	}
}

func TestDurationJSON(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    time.Duration
		wantErr bool
	}{
		{`"30m"`, 30 * time.Minute, false},
		{`"1h30m"`, 90 * time.Minute, false},
		{`2`, 2 * time.Second, false},
		{`0.5`, 500 * time.Millisecond, false},
		{`"-1s"`, 0, true},
		{`-1`, 0, true},
		{`"soon"`, 0, true},
		{`1e300`, 0, true},
		{`{}`, 0, true},
	} {
		var d Duration
		err := json.Unmarshal([]byte(tc.in), &d)
		if (err != nil) != tc.wantErr {
			t.Errorf("Unmarshal(%s): err = %v, want error %v", tc.in, err, tc.wantErr)
			continue
		}
		if err == nil && d.D() != tc.want {
			t.Errorf("Unmarshal(%s) = %v, want %v", tc.in, d.D(), tc.want)
		}
	}
}

func FuzzQuantity(f *testing.F) {
	for _, s := range []string{"256Mi", "1G", "1.5Gi", "0", "-1", "1e30Ti", "NaN", "Inf"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		q, err := ParseQuantity(s)
		if err == nil && q < 0 {
			t.Fatalf("ParseQuantity(%q) = %d, negative", s, q)
		}
	})
}

func TestValidEnvName(t *testing.T) {
	for k, want := range map[string]bool{"PATH": true, "_x1": true, "a": true, "": false, "1A": false, "A=B": false, "A-B": false, "É": false} {
		if got := ValidEnvName(k); got != want {
			t.Errorf("ValidEnvName(%q) = %v, want %v", k, got, want)
		}
	}
}
