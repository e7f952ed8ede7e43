package client

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/warrenhq/warren/api"
)

// Error is a refusal from the server: the decoded body of a non-2xx answer,
// or an error event in the middle of an exec stream (StatusCode is 0 there).
// Switch on Code, or use errors.Is with the Err* sentinels, never on Message.
type Error struct {
	StatusCode int    // HTTP status; 0 for an error inside a 200 stream
	Code       string // one of the api.Code* constants
	Message    string
	// RetryAfter is how long the server asked the caller to wait before
	// trying again (429 and 503); 0 when it did not say.
	RetryAfter time.Duration
	// Infra, when set, says the platform, not the task, made the call
	// fail, and why (api.Error.InfraError): mask the rollout, do not
	// score it. IsInfra tells.
	Infra string
}

func (e *Error) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.StatusCode)
	}
	if msg == "" {
		msg = "request failed"
	}
	if e.Code == "" {
		return msg
	}
	return fmt.Sprintf("%s (%s)", msg, e.Code)
}

// Sentinels for errors.Is. Each matches an *Error by its HTTP status or,
// when there is none (an error event in a stream), by its code.
var (
	ErrInvalid         = errors.New("invalid argument")   // 400
	ErrUnauthenticated = errors.New("unauthenticated")    // 401
	ErrForbidden       = errors.New("forbidden")          // 403
	ErrNotFound        = errors.New("not found")          // 404, any *_not_found code
	ErrConflict        = errors.New("conflict")           // 409
	ErrExhausted       = errors.New("resource exhausted") // 429: quota, rate limit, node full
	ErrUnavailable     = errors.New("unavailable")        // 503: no node or backend can take it
	ErrInternal        = errors.New("internal error")     // 500
)

var codeStatus = map[string]int{
	api.CodeInvalid:            http.StatusBadRequest,
	api.CodeUnauthenticated:    http.StatusUnauthorized,
	api.CodeForbidden:          http.StatusForbidden,
	api.CodeNotFound:           http.StatusNotFound,
	api.CodeSandboxNotFound:    http.StatusNotFound,
	api.CodeImageNotFound:      http.StatusNotFound,
	api.CodeLayerNotFound:      http.StatusNotFound,
	api.CodeEnvNotFound:        http.StatusNotFound,
	api.CodeFileNotFound:       http.StatusNotFound,
	api.CodeConflict:           http.StatusConflict,
	api.CodeSandboxGone:        http.StatusConflict,
	api.CodeLayerExists:        http.StatusConflict,
	api.CodeEnvExists:          http.StatusConflict,
	api.CodeLayerInUse:         http.StatusConflict,
	api.CodeExhausted:          http.StatusTooManyRequests,
	api.CodeNodeFull:           http.StatusTooManyRequests,
	api.CodeUnavailable:        http.StatusServiceUnavailable,
	api.CodeBackendUnavailable: http.StatusServiceUnavailable,
	api.CodeSandboxLost:        http.StatusServiceUnavailable,
	api.CodeNodeUnreachable:    http.StatusServiceUnavailable,
	api.CodePortUnreachable:    http.StatusBadGateway,
	api.CodeInternal:           http.StatusInternalServerError,

	api.CodeInvalidProject:      http.StatusBadRequest,
	api.CodeRequestExceedsQuota: http.StatusBadRequest,
	api.CodeProjectNotFound:     http.StatusNotFound,
	api.CodeTokenNotFound:       http.StatusNotFound,
	api.CodeProjectExists:       http.StatusConflict,
	api.CodeProjectHasChildren:  http.StatusConflict,
	api.CodeProjectInUse:        http.StatusConflict,
	api.CodeTooManyProjects:     http.StatusConflict,
	api.CodeNodeNameMismatch:    http.StatusForbidden,
	api.CodeNodeNotOwner:        http.StatusForbidden,
	api.CodeNodeRegistered:      http.StatusConflict,
	api.CodeNodeNameTaken:       http.StatusConflict,
	api.CodeQuotaExceedsParent:  http.StatusConflict,
	api.CodeQuotaBelowChildren:  http.StatusConflict,
	api.CodeIdempotencyReused:   http.StatusConflict,
	api.CodeIdempotencyLost:     http.StatusConflict,
	api.CodeQuotaExceeded:       http.StatusTooManyRequests,
	api.CodeRateLimited:         http.StatusTooManyRequests,

	api.CodeRuntimeNotFound:    http.StatusNotFound,
	api.CodeRuntimeUnavailable: http.StatusServiceUnavailable,
	api.CodeFnOverloaded:       http.StatusTooManyRequests,
}

var statusSentinel = map[int]error{
	http.StatusBadRequest:          ErrInvalid,
	http.StatusUnauthorized:        ErrUnauthenticated,
	http.StatusForbidden:           ErrForbidden,
	http.StatusNotFound:            ErrNotFound,
	http.StatusConflict:            ErrConflict,
	http.StatusTooManyRequests:     ErrExhausted,
	http.StatusServiceUnavailable:  ErrUnavailable,
	http.StatusInternalServerError: ErrInternal,
}

// class is e's HTTP status or, for an error event inside a stream
// (StatusCode 0) or an unusual status, the status its code stands for.
func (e *Error) class() int {
	if _, ok := statusSentinel[e.StatusCode]; ok {
		return e.StatusCode
	}
	if s, ok := codeStatus[e.Code]; ok {
		return s
	}
	return e.StatusCode
}

// Is makes errors.Is(err, client.ErrNotFound) and friends work.
func (e *Error) Is(target error) bool {
	s, ok := statusSentinel[e.class()]
	return ok && s == target
}

// codeForStatus names the code of an answer whose body carried none (a proxy
// in the way, or a server too old to say).
func codeForStatus(status int) string {
	switch status {
	case http.StatusBadRequest:
		return api.CodeInvalid
	case http.StatusUnauthorized:
		return api.CodeUnauthenticated
	case http.StatusForbidden:
		return api.CodeForbidden
	case http.StatusNotFound:
		return api.CodeNotFound
	case http.StatusConflict:
		return api.CodeConflict
	case http.StatusTooManyRequests:
		return api.CodeExhausted
	case http.StatusServiceUnavailable, http.StatusBadGateway, http.StatusGatewayTimeout:
		return api.CodeUnavailable
	}
	if status >= 500 {
		return api.CodeInternal
	}
	return ""
}

// IsNotFound reports whether err says a sandbox, image, file or route does
// not exist.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// IsConflict reports whether err is a 409 conflict.
func IsConflict(err error) bool { return errors.Is(err, ErrConflict) }

// IsExhausted reports whether err is a 429: a quota, a rate limit or a node's
// admission refused, and a later try may succeed.
func IsExhausted(err error) bool { return errors.Is(err, ErrExhausted) }

// IsUnavailable reports whether err is a 503: no node or backend can take the
// request now.
func IsUnavailable(err error) bool { return errors.Is(err, ErrUnavailable) }

// IsUnauthenticated reports whether the token was missing or not accepted.
func IsUnauthenticated(err error) bool { return errors.Is(err, ErrUnauthenticated) }

// IsForbidden reports whether the token lacks the role for the request.
func IsForbidden(err error) bool { return errors.Is(err, ErrForbidden) }

// IsInvalid reports whether the server rejected the request as malformed.
func IsInvalid(err error) bool { return errors.Is(err, ErrInvalid) }

// IsRetryable reports whether the server refused for now (429 or 503); see
// RetryAfter for how long it asked to wait.
func IsRetryable(err error) bool { return IsExhausted(err) || IsUnavailable(err) }

// IsFileNotFound reports whether err says a path inside an existing sandbox
// does not exist (as opposed to the sandbox itself).
func IsFileNotFound(err error) bool { return hasCode(err, api.CodeFileNotFound) }

// IsSandboxNotFound reports whether err says the sandbox does not exist.
func IsSandboxNotFound(err error) bool { return hasCode(err, api.CodeSandboxNotFound) }

// IsQuotaExceeded reports whether a create was refused because its
// project's quota (or an ancestor's) is used up; RetryAfter says when to
// try again.
func IsQuotaExceeded(err error) bool { return hasCode(err, api.CodeQuotaExceeded) }

// IsRateLimited reports whether a create was refused by its project's
// creates-per-second limit; RetryAfter says when to try again.
func IsRateLimited(err error) bool { return hasCode(err, api.CodeRateLimited) }

// IsRuntimeUnavailable reports whether err says the runtime asked for
// cannot run: a sandbox runtime (api.RuntimeGVisor) on no node that could
// take the sandbox (the message says why, e.g. runsc missing), or an
// FnCall runtime whose environment is missing.
func IsRuntimeUnavailable(err error) bool { return hasCode(err, api.CodeRuntimeUnavailable) }

// RetryAfter returns the wait the server asked for in err, or 0.
func RetryAfter(err error) time.Duration {
	var e *Error
	if errors.As(err, &e) {
		return e.RetryAfter
	}
	return 0
}

func hasCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

func fromAPIError(status int, ae *api.Error) *Error {
	return &Error{
		StatusCode: status,
		Code:       ae.Code,
		Message:    ae.Message,
		RetryAfter: time.Duration(ae.RetryAfter) * time.Second,
		Infra:      ae.InfraError,
	}
}

// IsInfra reports whether err failed because of the platform (its node
// lost, its agent restarted mid-call, the platform shut the sandbox down,
// an internal error), not the task, and why.
func IsInfra(err error) (string, bool) {
	var e *Error
	if errors.As(err, &e) && e.Infra != "" {
		return e.Infra, true
	}
	return "", false
}
