package client

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/warrenhq/warren/api"
)

// maxScreen bounds a screenshot's PNG.
const maxScreen = 64 << 20

// Screen returns what a vm sandbox's display shows now, as a PNG.
func (c *Client) Screen(ctx context.Context, id string) ([]byte, error) {
	p, err := sandboxPath(id, "/screen")
	if err != nil {
		return nil, err
	}
	resp, err := c.do(ctx, request{method: http.MethodGet, path: p, accept: "image/png"})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxScreen))
	if err != nil {
		return nil, fmt.Errorf("warren client: read the screen: %w", err)
	}
	return b, nil
}

// Input sends keyboard and pointer events to a vm sandbox's display, in
// order (api.InputText, InputKey, InputMove, InputClick).
func (c *Client) Input(ctx context.Context, id string, events ...api.InputEvent) error {
	p, err := sandboxPath(id, "/input")
	if err != nil {
		return err
	}
	return c.doJSON(ctx, http.MethodPost, p, nil, api.InputRequest{Events: events}, nil)
}
