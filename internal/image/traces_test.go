package image_test

import (
	"context"
	"crypto/rand"
	"errors"
	"reflect"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/lazy"
)

// TestTraces: the first trace a node reports for a layer is kept (later
// ones are not), only if it is a trace of that layer in the blob store;
// images, layer lists and descriptions carry it; GC keeps its blob while
// the layer lives, and drops blob and record with the layer.
func TestTraces(t *testing.T) {
	ctx := context.Background()
	r, bs := newRegistry(t)
	big := make([]byte, 600<<10)
	rand.Read(big)
	a := mkLayer(t, r, api.LayerBase, "a@1", map[string]string{"big.bin": string(big)})
	b := mkLayer(t, r, api.LayerToolkit, "b@1", map[string]string{"b": "b"})
	_, err := r.CreateEnv(ctx, api.CreateEnvironmentRequest{Name: "e", Version: "1", Base: "a@1", Toolkits: []string{"b@1"}})
	must(t, err)
	m, err := image.ReadManifest(ctx, bs, a.Digest)
	must(t, err)
	trace := func(layer string, pieces ...int) string {
		t.Helper()
		enc, err := lazy.Trace{Layer: layer, BlockSize: m.BlockSize, Pieces: pieces}.Encode()
		must(t, err)
		return putBlob(t, bs, string(enc))
	}
	first, second := trace(a.Digest, 0, 1), trace(a.Digest, 1, 0)

	if ok, err := r.RecordTrace(ctx, a.Digest, first, "n1"); err != nil || !ok {
		t.Fatalf("record the first trace: %v, %v", ok, err)
	}
	if ok, err := r.RecordTrace(ctx, a.Digest, second, "n2"); err != nil || ok {
		t.Fatalf("record a second trace: %v, %v; want not recorded, no error", ok, err)
	}
	if got, err := r.Trace(ctx, a.Digest); err != nil || got != first {
		t.Fatalf("trace of a: %q, %v; want the first, %s", got, err, first)
	}

	// A record whose blob is gone is replaced by the next trace.
	must(t, bs.Delete(ctx, first))
	if ok, err := r.RecordTrace(ctx, a.Digest, second, "n2"); err != nil || !ok {
		t.Fatalf("record a trace over one whose blob is gone: %v, %v", ok, err)
	}
	first, second = second, trace(a.Digest, 0, 1)

	// What a node cannot make the control plane keep.
	for _, tc := range []struct {
		name, layer, trace string
		kind               error
	}{
		{"a trace of another layer", b.Digest, first, errdefs.ErrInvalid},
		{"a malformed layer digest", a.Digest + "x", first, errdefs.ErrInvalid},
		{"a missing blob", b.Digest, blob.FromBytes([]byte("no such trace")), errdefs.ErrNotFound},
		{"not a trace", b.Digest, putBlob(t, bs, "not a trace"), errdefs.ErrInvalid},
		{"a layer not in the store", blob.FromBytes([]byte("no such layer")), trace(blob.FromBytes([]byte("no such layer")), 0), errdefs.ErrNotFound},
	} {
		if ok, err := r.RecordTrace(ctx, tc.layer, tc.trace, "n1"); ok || !errors.Is(err, tc.kind) {
			t.Errorf("record %s: %v, %v; want %v", tc.name, ok, err, tc.kind)
		}
	}
	mb, err := image.ReadManifest(ctx, bs, b.Digest)
	must(t, err)
	enc, err := lazy.Trace{Layer: b.Digest, BlockSize: mb.BlockSize, Pieces: []int{0, 1 << 20}}.Encode()
	must(t, err)
	if ok, err := r.RecordTrace(ctx, b.Digest, putBlob(t, bs, string(enc)), "n1"); ok || !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("record a trace with pieces past its layer: %v, %v; want ErrInvalid", ok, err)
	}
	if got, _ := r.Trace(ctx, b.Digest); got != "" {
		t.Errorf("b has trace %s after only bad ones", got)
	}

	want := map[string]string{a.Digest: first}
	if img, err := r.Get(ctx, "e"); err != nil || !reflect.DeepEqual(img.PrefetchTraces, want) {
		t.Errorf("image e: traces %v, %v; want %v", img.PrefetchTraces, err, want)
	}
	if img, err := r.ResolveLayers(ctx, []string{"a@1", "b@1"}); err != nil || !reflect.DeepEqual(img.PrefetchTraces, want) {
		t.Errorf("layers a, b: traces %v, %v; want %v", img.PrefetchTraces, err, want)
	}
	if l, err := r.DescribeLayer(ctx, "a@1"); err != nil || l.PrefetchTrace != first {
		t.Errorf("describe a: trace %q, %v; want %s", l.PrefetchTrace, err, first)
	}
	ls, err := r.ListLayers(ctx)
	must(t, err)
	for _, l := range ls {
		if w := want[l.Digest]; l.PrefetchTrace != w {
			t.Errorf("layer list: %s has trace %q, want %q", l.Ref, l.PrefetchTrace, w)
		}
	}

	// GC keeps the recorded trace of a live layer; the other trace blobs
	// are garbage.
	_, err = r.GC(ctx, nil)
	must(t, err)
	if _, err := bs.Stat(ctx, first); err != nil {
		t.Fatalf("GC deleted the trace of a live layer: %v", err)
	}
	if _, err := bs.Stat(ctx, second); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("GC kept a trace no layer has: %v", err)
	}
	// The layer goes: its trace's blob and record go with it.
	must(t, r.DeleteEnv(ctx, "e@1"))
	must(t, r.DeleteLayer(ctx, "a@1", nil))
	_, err = r.GC(ctx, nil)
	must(t, err)
	if _, err := bs.Stat(ctx, first); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("GC kept the trace of a deleted layer: %v", err)
	}
	if got, err := r.Trace(ctx, a.Digest); err != nil || got != "" {
		t.Errorf("the trace record of a deleted layer: %q, %v; want none", got, err)
	}
}
