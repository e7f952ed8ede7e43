package main

import (
	"strings"
	"testing"

	"github.com/warrenhq/warren/internal/qemu"
)

func TestExitMarker(t *testing.T) {
	if ExitMarker != qemu.ExitMarker {
		t.Fatalf("guest prints %q, the host looks for %q", ExitMarker, qemu.ExitMarker)
	}
}

func TestParse(t *testing.T) {
	c, err := parse("console=ttyS0 quiet cgroup_no_v1=all warren.overlay=1 warren.root=/dev/vdb warren.rootfstype=ext4 " +
		"warren.share=src:/src:ro warren.share=work:/work warren.exec=/work/run.sh warren.status=/work/status\n")
	if err != nil {
		t.Fatal(err)
	}
	if !c.overlay || c.root != "/dev/vdb" || c.rootType != "ext4" || c.exec != "/work/run.sh" || c.status != "/work/status" || c.hostname != "warren-guest" {
		t.Errorf("parsed %+v", c)
	}
	if len(c.shares) != 2 || c.shares[0] != (share{"src", "/src", true}) || c.shares[1] != (share{"work", "/work", false}) {
		t.Errorf("shares %+v", c.shares)
	}
	d, err := parse("console=ttyS0")
	if err != nil || d.root != "/dev/vda" || d.rootType != "erofs" || d.overlay || d.exec != "/bin/sh" {
		t.Errorf("defaults: %+v, %v", d, err)
	}
	for _, bad := range []string{"warren.share=x", "warren.share=:/x", "warren.share=t:rel", "warren.share=t:/x:rw", "warren.share=t:/x:ro:y"} {
		if _, err := parse(bad); err == nil || !strings.Contains(err.Error(), "bad warren.share") {
			t.Errorf("%s: got %v, want an error", bad, err)
		}
	}
}
