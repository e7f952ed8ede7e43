package image_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/store"
)

func newBlobs(t *testing.T) *blob.Dir {
	t.Helper()
	d, err := blob.NewDir(t.TempDir())
	must(t, err)
	return d
}

func putBlob(t *testing.T, bs blob.Store, content string) string {
	t.Helper()
	d, _, err := bs.Put(context.Background(), strings.NewReader(content))
	must(t, err)
	return d
}

func TestValidateName(t *testing.T) {
	good := []string{"busybox", "debian:12", "team/env@v2", "a", "py3.12-slim", "x/y/z", strings.Repeat("a", 255)}
	bad := []string{"", "Busybox", "-x", ".x", "/x", "x/", "a//b", "a/../b", "a/./b", "a b", "a\x00", "é", strings.Repeat("a", 256)}
	for _, n := range good {
		if err := image.ValidateName(n); err != nil {
			t.Errorf("ValidateName(%q): %v, want ok", n, err)
		}
	}
	for _, n := range bad {
		if err := image.ValidateName(n); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("ValidateName(%q): got %v, want ErrInvalid", n, err)
		}
	}
}

func TestRegistry(t *testing.T) {
	ctx := context.Background()
	bs := newBlobs(t)
	r := image.NewRegistry(store.Memory(), bs)
	l1, l2 := putBlob(t, bs, "base layer"), putBlob(t, bs, "tools")

	_, err := r.Get(ctx, "env")
	if !errors.Is(err, errdefs.ErrNotFound) || errdefs.Code(err) != "image_not_found" {
		t.Fatalf("Get missing: got %v, want ErrNotFound image_not_found", err)
	}
	must(t, r.Put(ctx, api.Image{Name: "env", Layers: []string{l1, l2}, Size: 999}))
	img, err := r.Get(ctx, "env")
	must(t, err)
	if img.Name != "env" || len(img.Layers) != 2 || img.Layers[0] != l1 || img.Layers[1] != l2 {
		t.Fatalf("Get: got %+v", img)
	}
	if want := int64(len("base layer") + len("tools")); img.Size != want {
		t.Errorf("Size: got %d, want %d (computed from the layers)", img.Size, want)
	}
	if img.CreatedAt.IsZero() || time.Since(img.CreatedAt) > time.Minute {
		t.Errorf("CreatedAt: got %v, want now", img.CreatedAt)
	}

	// Put replaces; Create refuses.
	must(t, r.Put(ctx, api.Image{Name: "env", Layers: []string{l1}}))
	if img, _ := r.Get(ctx, "env"); len(img.Layers) != 1 {
		t.Errorf("after second Put: got %d layers, want 1", len(img.Layers))
	}
	err = r.Create(ctx, api.Image{Name: "env", Layers: []string{l2}})
	if !errors.Is(err, errdefs.ErrConflict) || errdefs.Code(err) != "image_exists" {
		t.Errorf("Create existing: got %v, want ErrConflict image_exists", err)
	}
	must(t, r.Create(ctx, api.Image{Name: "team/other:1", Layers: []string{l2}}))

	list, err := r.List(ctx)
	must(t, err)
	if len(list) != 2 || list[0].Name != "env" || list[1].Name != "team/other:1" {
		t.Fatalf("List: got %+v, want env and team/other:1", list)
	}

	must(t, r.Delete(ctx, "env"))
	if _, err := r.Get(ctx, "env"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get after Delete: got %v, want ErrNotFound", err)
	}
	if err := r.Delete(ctx, "env"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Delete missing: got %v, want ErrNotFound", err)
	}
	if _, err := bs.Stat(ctx, l1); err != nil {
		t.Errorf("Delete removed the image's layer from the blob store: %v", err)
	}
}

func TestRegistryInvalid(t *testing.T) {
	ctx := context.Background()
	bs := newBlobs(t)
	r := image.NewRegistry(store.Memory(), bs)
	l := putBlob(t, bs, "layer")
	cases := []struct {
		name string
		img  api.Image
		code string
	}{
		{"bad name", api.Image{Name: "Bad", Layers: []string{l}}, "invalid_image_name"},
		{"no layers", api.Image{Name: "x"}, "invalid_image"},
		{"bad digest", api.Image{Name: "x", Layers: []string{"sha256:zz"}}, "invalid_digest"},
		{"missing layer", api.Image{Name: "x", Layers: []string{blob.FromBytes([]byte("nope"))}}, "layer_not_found"},
	}
	for _, tc := range cases {
		err := r.Put(ctx, tc.img)
		if !errors.Is(err, errdefs.ErrInvalid) || errdefs.Code(err) != tc.code {
			t.Errorf("%s: got %v (code %q), want ErrInvalid %s", tc.name, err, errdefs.Code(err), tc.code)
		}
	}
	if _, err := r.Get(ctx, "../etc"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Get(../etc): got %v, want ErrInvalid", err)
	}
}

func TestEnsureBusybox(t *testing.T) {
	requireBusybox(t)
	ctx := context.Background()
	bs := newBlobs(t)
	st := store.Memory()
	work := t.TempDir()

	img, err := image.NewRegistry(st, bs).EnsureBusybox(ctx, work)
	must(t, err)
	if img.Name != "busybox" || len(img.Layers) != 1 || img.Size == 0 {
		t.Fatalf("EnsureBusybox: got %+v", img)
	}
	if size, err := bs.Stat(ctx, img.Layers[0]); err != nil || size != img.Size {
		t.Fatalf("layer in blob store: got %d, %v; want %d bytes", size, err, img.Size)
	}
	if left, _ := os.ReadDir(work); len(left) != 0 {
		t.Errorf("work dir: %d entries left behind", len(left))
	}
	again, err := image.NewRegistry(st, bs).EnsureBusybox(ctx, work)
	must(t, err)
	if !again.CreatedAt.Equal(img.CreatedAt) || again.Layers[0] != img.Layers[0] {
		t.Errorf("second EnsureBusybox: got %+v, want the first image %+v", again, img)
	}
}

// TestEnsureBusyboxRace: registries sharing one store and blob store stand
// for processes racing at first start; all must end with one image and
// one layer.
func TestEnsureBusyboxRace(t *testing.T) {
	requireBusybox(t)
	ctx := context.Background()
	bs := newBlobs(t)
	st := store.Memory()
	const racers = 3
	imgs := make([]api.Image, racers)
	errs := make([]error, racers)
	var wg sync.WaitGroup
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			imgs[i], errs[i] = image.NewRegistry(st, bs).EnsureBusybox(ctx, filepath.Join(t.TempDir(), "work"))
		}()
	}
	wg.Wait()
	for i := range racers {
		if errs[i] != nil {
			t.Fatalf("racer %d: %v", i, errs[i])
		}
		if imgs[i].Layers[0] != imgs[0].Layers[0] || !imgs[i].CreatedAt.Equal(imgs[0].CreatedAt) {
			t.Errorf("racer %d got %+v, racer 0 got %+v", i, imgs[i], imgs[0])
		}
	}
	if l, _ := bs.List(ctx); len(l) != 1 {
		t.Errorf("blob store: got %d blobs, want 1 (the build is reproducible)", len(l))
	}
}
