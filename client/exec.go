package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/warrenhq/warren/api"
)

// Exec runs a command in a sandbox and waits for it, buffering its output on
// the server (capped by req.MaxOutput, 1 MiB per stream by default). Output
// sent as base64 is decoded, so Stdout and Stderr hold the raw bytes and the
// *Encoding fields are empty. A command that exits non-zero, times out or is
// killed is not an error: see ExitCode, TimedOut and Signal.
func (c *Client) Exec(ctx context.Context, id string, req api.ExecRequest) (*api.ExecResult, error) {
	p, err := sandboxPath(id, "/exec")
	if err != nil {
		return nil, err
	}
	req.Stream = false
	var res api.ExecResult
	if err := c.doJSON(ctx, http.MethodPost, p, nil, req, &res); err != nil {
		return nil, err
	}
	if err := decodeResultOutput(&res); err != nil {
		return nil, err
	}
	return &res, nil
}

// ExecStream runs a command and writes its output to stdout and stderr (nil
// discards) as it arrives, then returns the result; its Stdout and Stderr are
// empty. An error event in the stream is returned as *Error. A failing write
// to stdout or stderr aborts the call, which cancels the request.
func (c *Client) ExecStream(ctx context.Context, id string, req api.ExecRequest, stdout, stderr io.Writer) (*api.ExecResult, error) {
	p, err := sandboxPath(id, "/exec")
	if err != nil {
		return nil, err
	}
	req.Stream = true
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("warren client: encode request: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	resp, err := c.do(ctx, request{
		method: http.MethodPost, path: p, body: bytes.NewReader(body),
		contentType: contentJSON, accept: contentNDJSON,
	})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	if mediaType(resp.Header) == contentJSON {
		// A server (or proxy) that answered with the buffered form.
		var res api.ExecResult
		if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
			return nil, fmt.Errorf("warren client: decode exec result: %w", err)
		}
		if err := decodeResultOutput(&res); err != nil {
			return nil, err
		}
		if _, err := io.WriteString(stdout, res.Stdout); err != nil {
			return nil, fmt.Errorf("write stdout: %w", err)
		}
		if _, err := io.WriteString(stderr, res.Stderr); err != nil {
			return nil, fmt.Errorf("write stderr: %w", err)
		}
		res.Stdout, res.Stderr = "", ""
		return &res, nil
	}
	res, err := DecodeExecStream(resp.Body, stdout, stderr)
	if err != nil && ctx.Err() != nil && !isAPIError(err) {
		return nil, ctx.Err()
	}
	return res, err
}

// DecodeExecStream reads an NDJSON exec stream (api.ExecEvent per line) from
// r, writing output chunks to stdout and stderr, until the final result or
// an error event. A stream that ends before either is an error wrapping
// io.ErrUnexpectedEOF.
func DecodeExecStream(r io.Reader, stdout, stderr io.Writer) (*api.ExecResult, error) {
	dec := json.NewDecoder(r)
	for {
		var ev api.ExecEvent
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, fmt.Errorf("warren client: exec stream ended without a result: %w", err)
		}
		switch {
		case ev.Error != nil:
			return nil, fromAPIError(ev.Status, ev.Error)
		case ev.Result != nil:
			return ev.Result, nil
		case ev.Stream == "stdout" || ev.Stream == "stderr":
			data, err := api.DecodeBytes("data", ev.Data, ev.Encoding)
			if err != nil {
				return nil, fmt.Errorf("warren client: exec %s chunk: %w", ev.Stream, err)
			}
			w := stdout
			if ev.Stream == "stderr" {
				w = stderr
			}
			if _, err := w.Write(data); err != nil {
				return nil, fmt.Errorf("write %s: %w", ev.Stream, err)
			}
		default:
			// An event kind this client does not know (a newer server):
			// skip it rather than fail the whole exec.
		}
	}
}

func decodeResultOutput(res *api.ExecResult) error {
	return decodeOutput("exec", &res.Stdout, &res.StdoutEncoding, &res.Stderr, &res.StderrEncoding)
}

// decodeOutput turns a result's stdout and stderr into raw bytes in place,
// clearing their encodings.
func decodeOutput(what string, stdout, stdoutEnc, stderr, stderrEnc *string) error {
	for _, f := range []struct {
		data, enc *string
		name      string
	}{{stdout, stdoutEnc, "stdout"}, {stderr, stderrEnc, "stderr"}} {
		b, err := api.DecodeBytes(f.name, *f.data, *f.enc)
		if err != nil {
			return fmt.Errorf("warren client: %s %w", what, err)
		}
		*f.data, *f.enc = string(b), ""
	}
	return nil
}

// SetStdin puts b in req as the command's standard input, base64-encoded when
// it is not valid UTF-8.
func SetStdin(req *api.ExecRequest, b []byte) {
	req.Stdin, req.StdinEncoding = api.EncodeBytes(b)
}

func isAPIError(err error) bool {
	var e *Error
	return errors.As(err, &e)
}
