package s3test

import (
	"os"
	"strings"
	"testing"
)

// TestPinnedVersion: scripts/build-weed builds the weed this package
// expects to find.
func TestPinnedVersion(t *testing.T) {
	b, err := os.ReadFile("../../../scripts/build-weed")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "\nversion="+WeedVersion+"\n") {
		t.Fatalf("scripts/build-weed does not pin version=%s", WeedVersion)
	}
}
