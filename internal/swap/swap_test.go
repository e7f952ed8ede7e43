package swap

import (
	"strings"
	"testing"

	"github.com/warrenhq/warren/internal/testutil"
)

func TestParseSpec(t *testing.T) {
	for in, want := range map[string]int64{"zram:4Gi": 4 << 30, "zram:512Mi": 512 << 20, "zram:4096": 4096} {
		if got, err := ParseSpec(in); err != nil || got != want {
			t.Errorf("ParseSpec(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "4G", "zram:", "zram:-1G", "zram:lots", "disk:4G"} {
		if _, err := ParseSpec(in); err == nil {
			t.Errorf("ParseSpec(%q): no error", in)
		}
	}
}

// Zram makes a swap area the kernel lists, and Off takes it away again.
func TestZram(t *testing.T) {
	testutil.RequireRoot(t)
	dev, err := Zram(64 << 20)
	if err == ErrNoDevice && !testutil.Strict() {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer Off(dev)
	devs, err := Devices()
	found := false
	for _, d := range devs {
		found = found || d.Name == dev && d.Size > 60<<20
	}
	if err != nil || !found {
		t.Fatalf("after Zram: %s not among %+v (%v)", dev, devs, err)
	}
	if d := Describe(); !strings.Contains(d, "anonymous memory to swap") {
		t.Errorf("Describe with swap: %q", d)
	}
	if err := Off(dev); err != nil {
		t.Fatal(err)
	}
	devs, _ = Devices()
	for _, d := range devs {
		if d.Name == dev {
			t.Errorf("after Off: %s still listed", dev)
		}
	}
}
