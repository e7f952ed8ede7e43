package container

import (
	"errors"
	"testing"

	"github.com/warrenhq/warren/internal/errdefs"
)

// Ranges go round: a freed range is the last handed out again (a process
// that outlived its sandbox never shares ids with the next one), only its
// owner frees it, and a full node says so.
func TestIDAllocator(t *testing.T) {
	a := &idAllocator{used: map[int]string{}}
	r1, _ := a.alloc("a")
	r2, _ := a.alloc("b")
	if r1.base != idBase || r2.base != idBase+idSize {
		t.Fatalf("first ranges %d, %d", r1.base, r2.base)
	}
	a.free("a", r1)
	if r3, _ := a.alloc("c"); r3.base != idBase+2*idSize {
		t.Errorf("after a free: %d, want the next unused range", r3.base)
	}
	a.free("not-b", r2)
	if a.used[r2.slot()] != "b" {
		t.Error("a range freed by another sandbox's id")
	}
	a.mark("old", idRange{base: idBase + 3*idSize}) // found on disk
	if r, _ := a.alloc("d"); r.base == idBase+3*idSize {
		t.Error("a range found on disk handed out again")
	}
	for i := len(a.used); i < idSlots; i++ {
		if _, err := a.alloc("x"); err != nil {
			t.Fatalf("alloc %d: %v", i, err)
		}
	}
	if _, err := a.alloc("y"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("a full node: %v, want ErrUnavailable", err)
	}
}

func TestReadIDs(t *testing.T) {
	dir := t.TempDir()
	if _, ok, err := readIDs(dir); ok || err != nil {
		t.Errorf("no file: %v %v", ok, err)
	}
	if err := writeIDs(dir, idRange{base: idBase + 5*idSize}); err != nil {
		t.Fatal(err)
	}
	if r, ok, err := readIDs(dir); !ok || err != nil || r.base != idBase+5*idSize {
		t.Errorf("round trip: %+v %v %v", r, ok, err)
	}
}
