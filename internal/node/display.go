package node

import (
	"bytes"
	"context"
	"image/png"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
)

// Screen returns what a sandbox's display shows now, as a PNG (vm
// sandboxes; others are not_supported).
func (a *Agent) Screen(ctx context.Context, id string) ([]byte, error) {
	b, _, done, err := call[backend.Displayer](ctx, a, id, "screen")
	if err != nil {
		return nil, err
	}
	img, err := b.Screen(ctx, id)
	if err := done(err); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := (&png.Encoder{CompressionLevel: png.BestSpeed}).Encode(&buf, img); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// maxInputEvents bounds one input call.
const maxInputEvents = 256

// Input sends keyboard and pointer events to a sandbox's display, in
// order.
func (a *Agent) Input(ctx context.Context, id string, req api.InputRequest) error {
	if len(req.Events) == 0 || len(req.Events) > maxInputEvents {
		return errdefs.Invalid("input: %d events (want 1 to %d)", len(req.Events), maxInputEvents)
	}
	events := make([]backend.InputEvent, len(req.Events))
	for i, e := range req.Events {
		events[i] = backend.InputEvent(e)
	}
	b, _, done, err := call[backend.Displayer](ctx, a, id, "input")
	if err != nil {
		return err
	}
	return done(b.Input(ctx, id, events))
}
