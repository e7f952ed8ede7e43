package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"

	"github.com/warrenhq/warren/api"
)

// WriteFile writes r's content to path (absolute) in the sandbox, replacing
// any file there. mode's permission bits are applied when non-zero;
// otherwise the server's default applies.
func (c *Client) WriteFile(ctx context.Context, id, path string, mode os.FileMode, r io.Reader) error {
	p, err := sandboxPath(id, "/files")
	if err != nil {
		return err
	}
	q := url.Values{"path": {path}}
	if perm := mode & os.ModePerm; perm != 0 {
		q.Set("mode", fmt.Sprintf("%04o", uint32(perm)))
	}
	if r == nil {
		r = http.NoBody
	}
	resp, err := c.do(ctx, request{method: http.MethodPut, path: p, query: q, body: r, contentType: contentOctet})
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// ReadFile copies the regular file at path in the sandbox to w. A directory
// is an error: use ReadTar or CopyFrom for those.
func (c *Client) ReadFile(ctx context.Context, id, path string, w io.Writer) error {
	p, err := sandboxPath(id, "/files")
	if err != nil {
		return err
	}
	resp, err := c.do(ctx, request{method: http.MethodGet, path: p, query: url.Values{"path": {path}}, accept: contentOctet})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if mediaType(resp.Header) == contentTar {
		return fmt.Errorf("warren client: %s is a directory; use ReadTar or CopyFrom", path)
	}
	// The transport reports a body shorter than Content-Length as
	// io.ErrUnexpectedEOF, so a cut connection is not a silent short file.
	if _, err := io.Copy(w, resp.Body); err != nil {
		return fmt.Errorf("warren client: read %s: %w", path, err)
	}
	return nil
}

// WriteTar extracts the tar stream r under dir (absolute) in the sandbox,
// creating dir if missing. Entry names are relative to dir.
func (c *Client) WriteTar(ctx context.Context, id, dir string, r io.Reader) error {
	p, err := sandboxPath(id, "/files")
	if err != nil {
		return err
	}
	resp, err := c.do(ctx, request{method: http.MethodPut, path: p, query: url.Values{"path": {dir}}, body: r, contentType: contentTar})
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// ReadTar writes path (a file or a directory) in the sandbox to w as a tar
// stream whose entries are named relative to path's parent: path=/work gives
// "work", "work/...". The stream comes from the sandbox and is untrusted: use
// ExtractTar (or CopyFrom) to unpack it safely.
func (c *Client) ReadTar(ctx context.Context, id, path string, w io.Writer) error {
	p, err := sandboxPath(id, "/files")
	if err != nil {
		return err
	}
	q := url.Values{"path": {path}, "format": {"tar"}}
	resp, err := c.do(ctx, request{method: http.MethodGet, path: p, query: q, accept: contentTar})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(w, resp.Body); err != nil {
		return fmt.Errorf("warren client: read tar of %s: %w", path, err)
	}
	return nil
}

// Stat describes path in the sandbox; a missing path is an error for which
// IsFileNotFound is true.
func (c *Client) Stat(ctx context.Context, id, path string) (*api.FileInfo, error) {
	p, err := sandboxPath(id, "/stat")
	if err != nil {
		return nil, err
	}
	var fi api.FileInfo
	if err := c.doJSON(ctx, http.MethodGet, p, url.Values{"path": {path}}, nil, &fi); err != nil {
		return nil, err
	}
	return &fi, nil
}
