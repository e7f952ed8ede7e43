package client

import (
	"context"
	"fmt"
	"net/http"

	"github.com/warrenhq/warren/api"
)

// RunFn runs one FnCall (POST /v1/fn/run): req's program, in a fresh
// container of runtime req.Runtime, once per case (once on req.Stdin when
// there are none), and waits for the result.
//
// A program that fails is not an error: the result's Status says how
// (WrongAnswer, NonZeroExit, TimeLimit, CompileError, ...), and so does
// each case's. A case in SandboxError failed for the platform's reasons,
// not the program's: drop such a result rather than score it. Output sent
// as base64 is decoded, so Stdout and Stderr hold the raw bytes and the
// *Encoding fields are empty.
//
// Errors: ErrNotFound (IsRuntimeNotFound) for a runtime no node declares,
// ErrInvalid, ErrUnavailable when no node has the runtime available, and
// ErrExhausted (IsFnOverloaded) when every container of the runtime is
// busy. That refusal guarantees nothing ran, so it is retried per the
// client's RetryPolicy, honouring Retry-After.
func (c *Client) RunFn(ctx context.Context, req api.FnRunRequest) (*api.FnResult, error) {
	var res api.FnResult
	if err := c.postRetrying(ctx, "/v1/fn/run", req, &res, IsExhausted); err != nil {
		return nil, err
	}
	if err := decodeFnResult(&res); err != nil {
		return nil, err
	}
	return &res, nil
}

// RunFnBatch runs independent FnCalls concurrently (POST /v1/fn/batch)
// and returns their outcomes in order: each item holds a Result (decoded
// as RunFn's) or an Error (ItemError classifies it), such as a 429
// fn_overloaded for a call no node could take then. Nothing is retried.
func (c *Client) RunFnBatch(ctx context.Context, req api.FnBatchRequest) (*api.FnBatchResult, error) {
	var out api.FnBatchResult
	if err := c.doJSON(ctx, http.MethodPost, "/v1/fn/batch", nil, req, &out); err != nil {
		return nil, err
	}
	for i := range out.Results {
		if r := out.Results[i].Result; r != nil {
			if err := decodeFnResult(r); err != nil {
				return nil, fmt.Errorf("%w (call %d)", err, i)
			}
		}
	}
	return &out, nil
}

// ListFnRuntimes returns the FnCall runtimes the nodes declare, with
// their pools summed over the fleet (GET /v1/fn/runtimes).
func (c *Client) ListFnRuntimes(ctx context.Context) ([]api.FnRuntime, error) {
	var list api.FnRuntimeList
	if err := c.doJSON(ctx, http.MethodGet, "/v1/fn/runtimes", nil, nil, &list); err != nil {
		return nil, err
	}
	return list.Runtimes, nil
}

// ItemError returns the error of one item of a batch answer (an FnCall's,
// or a gang member's) as *Error, so that errors.Is and the Is* helpers
// classify it by its code; nil for nil.
func ItemError(e *api.Error) error {
	if e == nil {
		return nil
	}
	return fromAPIError(0, e)
}

// IsRuntimeNotFound reports whether err says no node declares the FnCall
// runtime asked for.
func IsRuntimeNotFound(err error) bool { return hasCode(err, api.CodeRuntimeNotFound) }

// IsFnOverloaded reports whether an FnCall was refused because every
// container of its runtime was busy; nothing ran, and RetryAfter says
// when to try again.
func IsFnOverloaded(err error) bool { return hasCode(err, api.CodeFnOverloaded) }

// NewFnFile returns content as a file of an FnCall at path (relative to
// its working directory), base64-encoded when it is not UTF-8. Mode 0
// means 0644.
func NewFnFile(path string, content []byte, mode uint32) api.FnFile {
	f := api.FnFile{Path: path, Mode: mode}
	f.Content, f.Encoding = api.EncodeBytes(content)
	return f
}

// NewFnCase returns a case that feeds stdin to the program and, unless
// expected is nil, compares its stdout with expected; each is
// base64-encoded when it is not UTF-8.
func NewFnCase(stdin, expected []byte) api.FnCase {
	var c api.FnCase
	c.Stdin, c.StdinEncoding = api.EncodeBytes(stdin)
	if expected != nil {
		e, enc := api.EncodeBytes(expected)
		c.Expected, c.ExpectedEncoding = &e, enc
	}
	return c
}

// SetFnStdin puts b in req as the input of its one run (a call without
// cases), base64-encoded when it is not UTF-8.
func SetFnStdin(req *api.FnRunRequest, b []byte) {
	req.Stdin, req.StdinEncoding = api.EncodeBytes(b)
}

// decodeFnResult turns the base64 output of every run in res into raw
// bytes.
func decodeFnResult(res *api.FnResult) error {
	runs := make([]*api.FnCaseResult, 0, len(res.Cases)+1)
	if res.Compile != nil {
		runs = append(runs, res.Compile)
	}
	for i := range res.Cases {
		runs = append(runs, &res.Cases[i])
	}
	for _, r := range runs {
		if err := decodeOutput("fn", &r.Stdout, &r.StdoutEncoding, &r.Stderr, &r.StderrEncoding); err != nil {
			return err
		}
	}
	return nil
}
