package microvm

import (
	"context"
	"io"
	"net/url"
	"strconv"

	"github.com/warrenhq/warren/internal/backend"
)

// The guest agent resolves every path strictly inside the sandbox's root
// (package rootfs, in the guest), as containers' file calls do on the host.

// Stat implements backend.Files.
func (m *MicroVM) Stat(ctx context.Context, id, path string) (backend.FileInfo, error) {
	var fi backend.FileInfo
	s, err := m.withAgent(ctx, id, "stat")
	if err != nil {
		return fi, err
	}
	err = s.guest.call(ctx, "GET", "/v1/stat", url.Values{"path": {path}}, nil, &fi)
	return fi, err
}

// WriteFile implements backend.Files.
func (m *MicroVM) WriteFile(ctx context.Context, id, path string, mode uint32, r io.Reader) error {
	q := url.Values{"path": {path}, "mode": {strconv.FormatUint(uint64(mode), 8)}}
	return m.put(ctx, id, "/v1/file", q, r)
}

// ReadFile implements backend.Files.
func (m *MicroVM) ReadFile(ctx context.Context, id, path string, w io.Writer) error {
	return m.stream(ctx, id, "/v1/file", url.Values{"path": {path}}, w)
}

// WriteTar implements backend.Files.
func (m *MicroVM) WriteTar(ctx context.Context, id, dir string, r io.Reader) error {
	return m.put(ctx, id, "/v1/tar", url.Values{"dir": {dir}}, r)
}

// ReadTar implements backend.Files.
func (m *MicroVM) ReadTar(ctx context.Context, id, path string, w io.Writer) error {
	return m.stream(ctx, id, "/v1/tar", url.Values{"path": {path}}, w)
}

func (m *MicroVM) put(ctx context.Context, id, path string, q url.Values, r io.Reader) error {
	s, err := m.withAgent(ctx, id, "write")
	if err != nil {
		return err
	}
	if r == nil {
		r = eofReader{}
	}
	return s.guest.send(ctx, "PUT", path, q, r)
}

// stream streams a GET's body to w.
func (m *MicroVM) stream(ctx context.Context, id, path string, q url.Values, w io.Writer) error {
	s, err := m.withAgent(ctx, id, "read")
	if err != nil {
		return err
	}
	resp, err := s.guest.do(ctx, "GET", path, q, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(w, resp.Body); err != nil {
		return err
	}
	return trailerError(resp)
}

type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }
