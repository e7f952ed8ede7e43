package oci

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/testutil"
)

// TestImportDisk: a standalone qcow2 becomes an environment of one disk
// layer; one naming a backing file on the server, or not a qcow2 at all,
// is refused and nothing is created.
func TestImportDisk(t *testing.T) {
	testutil.RequireBinary(t, "qemu-img")
	ctx := context.Background()
	st := newFakeStore(t)
	im := &Importer{Store: st, WorkDir: t.TempDir()}
	dir := t.TempDir()
	mk := func(name string, args ...string) string {
		p := filepath.Join(dir, name)
		if out, err := exec.Command("qemu-img", append([]string{"create", "-q", "-f", "qcow2"}, append(args, p, "64M")...)...).CombinedOutput(); err != nil {
			t.Fatalf("qemu-img: %v: %s", err, out)
		}
		return p
	}
	good := mk("good.qcow2")
	env, err := importFile(ctx, im, good, "desktop")
	if err != nil {
		t.Fatalf("import a qcow2: %v", err)
	}
	if env.Ref != "desktop@1" || len(env.Layers) != 1 || env.Layers[0].Kind != api.LayerDisk {
		t.Errorf("imported: %+v", env)
	}
	evil := mk("evil.qcow2", "-F", "raw", "-b", "/etc/shadow")
	if _, err := importFile(ctx, im, evil, "evil"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("import of a qcow2 backed by /etc/shadow: %v, want ErrInvalid", err)
	}
	junk := filepath.Join(dir, "junk")
	os.WriteFile(junk, []byte("QFI\xfb not really"), 0o644)
	if _, err := importFile(ctx, im, junk, "junk"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("import of junk: %v, want ErrInvalid", err)
	}
	if _, err := importFile(ctx, im, good, "desktop"); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("import again: %v, want ErrConflict", err)
	}
	if len(st.envs) != 1 {
		t.Errorf("environments after refusals: %v", st.envs)
	}
}

func importFile(ctx context.Context, im *Importer, path, name string) (api.Environment, error) {
	f, err := os.Open(path)
	if err != nil {
		return api.Environment{}, err
	}
	defer f.Close()
	return im.Import(ctx, ImportRequest{Format: FormatQCOW2, Name: name}, f)
}
