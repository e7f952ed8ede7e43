package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"

	"github.com/warrenhq/warren/api"
)

// Image archive formats ImportImage accepts.
const (
	FormatDockerArchive = "docker-archive" // a `docker save` tarball
	FormatOCILayout     = "oci-layout"     // an OCI image layout, sent as a tar
	FormatQCOW2         = "qcow2"          // a disk image, for --backend vm
)

// ImportOptions adjusts an image import.
type ImportOptions struct {
	// Ref picks one image of an archive holding several: a tag in a
	// docker-archive ("app:1.0"), a ref.name annotation in a layout.
	Ref string
	// Progress, if set, is called as the upload goes with the bytes sent
	// so far.
	Progress func(sent int64)
}

// ImportImage uploads an image archive in format (FormatDockerArchive, or
// FormatOCILayout as a tar of the layout directory) and makes it the
// environment name ("name", or "name@version"; without a version the
// image's tag is used, or a prefix of its ID). The server flattens the
// image's layers into one base layer of the same name and version; the
// image config's env, working directory, user and entrypoint become the
// environment's defaults. It refuses a bad archive (ErrInvalid, codes
// "invalid_image", "image_too_large": device nodes, paths escaping the
// root, a corrupt tar) and an existing environment (ErrConflict).
func (c *Client) ImportImage(ctx context.Context, format, name string, r io.Reader, opts ImportOptions) (*api.Environment, error) {
	q := url.Values{"name": {name}, "format": {format}}
	if opts.Ref != "" {
		q.Set("ref", opts.Ref)
	}
	if opts.Progress != nil {
		r = &progressReader{r: r, f: opts.Progress}
	}
	resp, err := c.do(ctx, request{method: http.MethodPost, path: "/v1/images:import", query: q, body: r, contentType: contentTar})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var env api.Environment
	if err := decodeBody(resp, &env); err != nil {
		return nil, err
	}
	return &env, nil
}

// ImportImageFromPath imports the docker-archive file or the OCI layout
// directory at path (see ImportImage); format says which.
func (c *Client) ImportImageFromPath(ctx context.Context, format, path, name string, opts ImportOptions) (*api.Environment, error) {
	switch format {
	case FormatDockerArchive, FormatQCOW2:
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		if fi, err := f.Stat(); err == nil && fi.IsDir() {
			return nil, fmt.Errorf("%s is a directory: a %s is a file (an OCI layout directory is %s)", path, format, FormatOCILayout)
		}
		return c.ImportImage(ctx, format, name, f, opts)
	case FormatOCILayout:
		fi, err := os.Stat(path)
		if err != nil {
			return nil, err
		}
		if !fi.IsDir() {
			return nil, fmt.Errorf("%s is not a directory: an OCI layout is a directory", path)
		}
		if _, err := os.Stat(filepath.Join(path, "oci-layout")); err != nil {
			return nil, fmt.Errorf("%s is not an OCI image layout (no oci-layout file)", path)
		}
		pr, pw := io.Pipe()
		packErr := make(chan error, 1)
		go func() {
			err := PackDir(pw, path)
			pw.CloseWithError(err)
			packErr <- err
		}()
		env, err := c.ImportImage(ctx, format, name, pr, opts)
		pr.CloseWithError(errUploadEnded)
		if perr := <-packErr; perr != nil && !errors.Is(perr, errUploadEnded) {
			return nil, perr
		}
		return env, err
	}
	return nil, fmt.Errorf("image format %q: want %s or %s", format, FormatDockerArchive, FormatOCILayout)
}

// LayoutSize is about how many bytes ImportImageFromPath sends for the OCI
// layout in dir: the sum of its files' sizes, for progress displays.
func LayoutSize(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			n += fi.Size()
		}
		return nil
	})
	return n, err
}

// ExportEnv writes the environment ref ("name@version") to w in format
// (FormatOCILayout: a tar stream of an OCI image layout with one gzip
// layer per warren layer). The stream is untrusted input to whoever
// unpacks it: use ExportEnvToDir, or ExtractTar. A stream cut short by
// the server lacks the tar end marker (and index.json, written last).
func (c *Client) ExportEnv(ctx context.Context, ref, format string, w io.Writer) error {
	if ref == "" {
		return errors.New("warren client: empty environment ref")
	}
	p := "/v1/environments/" + url.PathEscape(ref) + "/export"
	resp, err := c.do(ctx, request{method: http.MethodGet, path: p, query: url.Values{"format": {format}}, accept: contentTar})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(w, resp.Body); err != nil {
		return fmt.Errorf("warren client: export %s: %w", ref, err)
	}
	return nil
}

// ExportEnvToDir exports the environment ref as an OCI image layout into
// dir, which is created if missing and must be empty otherwise. The
// archive is unpacked with ExtractTar, so nothing lands outside dir.
// progress, if set, is called with the bytes received so far.
func (c *Client) ExportEnvToDir(ctx context.Context, ref, dir string, progress func(received int64)) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	if len(ents) > 0 {
		return fmt.Errorf("%s is not empty: export into a new or empty directory", dir)
	}
	pr, pw := io.Pipe()
	extractErr := make(chan error, 1)
	go func() {
		var r io.Reader = pr
		if progress != nil {
			r = &progressReader{r: pr, f: progress}
		}
		err := ExtractTar(r, dir)
		pr.CloseWithError(err)
		extractErr <- err
	}()
	err = c.ExportEnv(ctx, ref, FormatOCILayout, pw)
	pw.CloseWithError(err)
	if xerr := <-extractErr; err == nil {
		err = xerr
	}
	return err
}

// progressReader reports how much has been read.
type progressReader struct {
	r io.Reader
	n int64
	f func(int64)
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.n += int64(n)
	if n > 0 {
		p.f(p.n)
	}
	return n, err
}
