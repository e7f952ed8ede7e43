// Package httperr carries classified errors (internal/errdefs) across HTTP:
// Write renders one as a status, a Retry-After header and an api.ErrorBody,
// and Read turns such an answer back into the same kind, code and retry
// hint. The apiserver renders errors for its callers with it, the node API
// for apiservers, and the node API client reads a node's answer with it, so
// a node's refusal (429 node_full, Retry-After 2) is still an ErrExhausted
// with its hint when the apiserver decides what to do with it. The mapping
// of kinds to statuses lives here and nowhere else.
package httperr

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
)

// Status maps an error kind to an HTTP status and a default code.
func Status(err error) (int, string) {
	switch {
	case errors.Is(err, errdefs.ErrInvalid):
		return http.StatusBadRequest, api.CodeInvalid
	case errors.Is(err, errdefs.ErrUnauthenticated):
		return http.StatusUnauthorized, api.CodeUnauthenticated
	case errors.Is(err, errdefs.ErrForbidden):
		return http.StatusForbidden, api.CodeForbidden
	case errors.Is(err, errdefs.ErrNotFound):
		return http.StatusNotFound, api.CodeNotFound
	case errors.Is(err, errdefs.ErrConflict):
		return http.StatusConflict, api.CodeConflict
	case errors.Is(err, errdefs.ErrExhausted):
		return http.StatusTooManyRequests, api.CodeExhausted
	case errors.Is(err, errdefs.ErrUnavailable):
		return http.StatusServiceUnavailable, api.CodeUnavailable
	case errors.Is(err, errdefs.ErrUnreachable):
		return http.StatusBadGateway, api.CodePortUnreachable
	}
	return http.StatusInternalServerError, api.CodeInternal
}

// ToAPI maps err to its HTTP status and wire form. 429 and 503 always
// carry a retry hint in whole seconds (at least 1).
func ToAPI(err error) (int, api.Error) {
	status, code := Status(err)
	if c := errdefs.Code(err); c != "" {
		code = c
	}
	e := api.Error{Code: code, Message: err.Error(), InfraError: infraReason(err, code)}
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		ra := errdefs.RetryAfter(err)
		if ra <= 0 {
			ra = time.Second
		}
		e.RetryAfter = int((ra + time.Second - 1) / time.Second)
	}
	return status, e
}

// Write renders err as an api.ErrorBody with its status and, for 429 and
// 503, a Retry-After header. It returns the status.
func Write(w http.ResponseWriter, err error) int {
	status, e := ToAPI(err)
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	WriteJSON(w, status, api.ErrorBody{Error: e})
	return status
}

// WriteJSON writes v as a JSON answer with status.
func WriteJSON(w http.ResponseWriter, status int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	return json.NewEncoder(w).Encode(v)
}

// kinds maps a status back to the error kind it stands for.
var kinds = map[int]error{
	http.StatusBadRequest:            errdefs.ErrInvalid,
	http.StatusUnauthorized:          errdefs.ErrUnauthenticated,
	http.StatusForbidden:             errdefs.ErrForbidden,
	http.StatusNotFound:              errdefs.ErrNotFound,
	http.StatusConflict:              errdefs.ErrConflict,
	http.StatusTooManyRequests:       errdefs.ErrExhausted,
	http.StatusServiceUnavailable:    errdefs.ErrUnavailable,
	http.StatusBadGateway:            errdefs.ErrUnreachable,
	http.StatusRequestEntityTooLarge: errdefs.ErrInvalid,
}

// FromAPI is the inverse of ToAPI: the classified error an answer with
// status and body e stands for. A status of 0 (an error event inside a
// stream) is classified by e's code. Statuses without a kind (500 and
// anything unexpected) give an error of no kind, which renders as 500 again.
func FromAPI(status int, e api.Error) error {
	kind := kinds[status]
	if status == 0 {
		kind = kindOfCode(e.Code)
	}
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(status)
	}
	if msg == "" {
		msg = "request failed"
	}
	code := e.Code
	if kind == nil && code == "" {
		code = api.CodeInternal
	}
	return &errdefs.Error{Kind: kind, Code: code, Msg: msg, RetryAfter: time.Duration(e.RetryAfter) * time.Second, Infra: e.InfraError}
}

// infraReason says why err, answered with code, is the platform's fault,
// or "" when it is the caller's or its task's: an explicit errdefs.Infra,
// else by code (a lost or unreachable node, an internal error, a platform
// component unavailable).
func infraReason(err error, code string) string {
	if r := errdefs.InfraOf(err); r != "" {
		return r
	}
	switch code {
	case api.CodeSandboxLost:
		return "the sandbox's node was lost"
	case api.CodeNodeUnreachable:
		return "the sandbox's node did not answer"
	case api.CodeInternal:
		return "internal platform error"
	case api.CodeUnavailable:
		return "a platform component is unavailable"
	case api.CodeImageUnavailable:
		return "the sandbox's image could not be read from the blob store"
	}
	return ""
}

// kindOfCode classifies the generic codes ToAPI gives by default, and the
// few specific ones the node API sends in streams.
func kindOfCode(code string) error {
	switch code {
	case api.CodeInvalid:
		return errdefs.ErrInvalid
	case api.CodeUnauthenticated:
		return errdefs.ErrUnauthenticated
	case api.CodeForbidden:
		return errdefs.ErrForbidden
	case api.CodeNotFound, api.CodeSandboxNotFound, api.CodeFileNotFound, api.CodeImageNotFound, api.CodeLayerNotFound:
		return errdefs.ErrNotFound
	case api.CodeConflict, api.CodeSandboxGone:
		return errdefs.ErrConflict
	case api.CodeExhausted, api.CodeNodeFull:
		return errdefs.ErrExhausted
	case api.CodeUnavailable, api.CodeBackendUnavailable, api.CodeRuntimeUnavailable, api.CodeImageUnavailable:
		return errdefs.ErrUnavailable
	case api.CodePortUnreachable:
		return errdefs.ErrUnreachable
	}
	return nil
}

// maxErrorBody bounds how much of an error answer Read looks at.
const maxErrorBody = 64 << 10

// Read turns a non-2xx answer into its classified error, reading (and not
// closing) the body. A body that is not an api.ErrorBody still gives the
// status's kind, with the body's start as the message; a Retry-After
// header fills in a hint the body lacks.
func Read(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	var body api.ErrorBody
	if err := json.Unmarshal(b, &body); err != nil || body.Error.Code == "" && body.Error.Message == "" {
		body.Error = api.Error{Message: http.StatusText(resp.StatusCode)}
		if s := string(b); len(s) > 0 {
			if len(s) > 200 {
				s = s[:200]
			}
			body.Error.Message += ": " + s
		}
	}
	if body.Error.RetryAfter == 0 {
		if n, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && n > 0 {
			body.Error.RetryAfter = n
		}
	}
	return FromAPI(resp.StatusCode, body.Error)
}

// MaxJSONBody bounds JSON request bodies (api.MaxRequestBody); exec stdin
// and FnCall files ride in them.
const MaxJSONBody = api.MaxRequestBody

// DecodeJSON reads one JSON object from r's body strictly: unknown fields
// and trailing data are ErrInvalid, so a typo like "memroy" fails loudly
// instead of being ignored. A body over MaxJSONBody is ErrInvalid with
// code api.CodeTooLarge, refused as soon as it is seen (by its
// Content-Length) or read that far.
func DecodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	if r.ContentLength > MaxJSONBody {
		return tooLarge(r.ContentLength)
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxJSONBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return tooLarge(-1)
		}
		if errors.Is(err, io.EOF) {
			return errdefs.Invalid("empty request body: want a JSON object")
		}
		return errdefs.Invalid("malformed JSON: %v", err)
	}
	if dec.More() {
		return errdefs.Invalid("malformed JSON: data after the object")
	}
	return nil
}

func tooLarge(n int64) error {
	if n < 0 {
		return errdefs.New(errdefs.ErrInvalid, api.CodeTooLarge, "request body: more than %d bytes, at most %d", int64(MaxJSONBody), int64(MaxJSONBody))
	}
	return errdefs.New(errdefs.ErrInvalid, api.CodeTooLarge, "request body: %d bytes, at most %d", n, int64(MaxJSONBody))
}
