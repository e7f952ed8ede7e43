// Package errdefs classifies warren's errors with a few sentinels and lets a
// package attach a stable, machine-readable code to one. Packages return
// wrapped sentinels; only the API edge turns them into HTTP statuses, so the
// mapping lives in one place (after containerd's errdefs).
package errdefs

import (
	"errors"
	"fmt"
	"time"

	"github.com/warrenhq/warren/api"
)

// Error kinds. Test with errors.Is.
var (
	ErrInvalid         = errors.New("invalid argument")
	ErrUnauthenticated = errors.New("unauthenticated")
	ErrForbidden       = errors.New("forbidden")
	ErrNotFound        = errors.New("not found")
	ErrConflict        = errors.New("conflict")
	// ErrExhausted: a quota, rate limit or node admission refused; retry later.
	ErrExhausted = errors.New("resource exhausted")
	// ErrUnavailable: a host feature, backend or peer is missing or down.
	ErrUnavailable = errors.New("unavailable")
	// ErrUnreachable: a server inside a sandbox that warren relays to
	// (its port) did not accept or did not answer; warren itself is fine.
	ErrUnreachable = errors.New("unreachable")
)

// Error is a classified error with a stable code, e.g. Kind ErrNotFound with
// Code "image_not_found".
type Error struct {
	Kind       error
	Code       string
	Msg        string
	RetryAfter time.Duration // for ErrExhausted and ErrUnavailable
	// Infra, when set, says the platform, not the caller's task, made the
	// call fail, and why (api.Error.InfraError).
	Infra string
}

func (e *Error) Error() string { return e.Msg }
func (e *Error) Unwrap() error { return e.Kind }

// New returns an error of the given kind and code with a formatted message.
func New(kind error, code, format string, args ...any) error {
	return &Error{Kind: kind, Code: code, Msg: fmt.Sprintf(format, args...)}
}

// Invalid returns an ErrInvalid with a formatted message.
func Invalid(format string, args ...any) error {
	return &Error{Kind: ErrInvalid, Msg: fmt.Sprintf(format, args...)}
}

// Exhausted returns an ErrExhausted that asks the caller to retry after d.
func Exhausted(code string, retryAfter time.Duration, format string, args ...any) error {
	return &Error{Kind: ErrExhausted, Code: code, Msg: fmt.Sprintf(format, args...), RetryAfter: retryAfter}
}

// Unavailable returns an ErrUnavailable with a formatted message, e.g. for a
// backend whose host feature is missing.
func Unavailable(format string, args ...any) error {
	return &Error{Kind: ErrUnavailable, Msg: fmt.Sprintf(format, args...)}
}

// Code returns the most specific code attached to err, or "" if none.
func Code(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// RetryAfter returns the retry hint attached to err, or 0.
func RetryAfter(err error) time.Duration {
	var e *Error
	if errors.As(err, &e) {
		return e.RetryAfter
	}
	return 0
}

// Request classifies the error of an api.Check* function: ErrInvalid,
// with code api.CodeTooLarge when a field is over its limit
// (*api.LimitError). Nil stays nil.
func Request(err error) error {
	if err == nil {
		return nil
	}
	var le *api.LimitError
	if errors.As(err, &le) {
		return &Error{Kind: ErrInvalid, Code: api.CodeTooLarge, Msg: err.Error()}
	}
	return &Error{Kind: ErrInvalid, Msg: err.Error()}
}

// InfraOf returns the reason an error is the platform's fault: an *Error's
// Infra, or "" when it carries none.
func InfraOf(err error) string {
	var e *Error
	for errors.As(err, &e) {
		if e.Infra != "" {
			return e.Infra
		}
		if err = e.Kind; err == nil {
			break
		}
	}
	return ""
}

// AsInfra marks err as the platform's fault for reason (an *Error keeps
// its kind and code).
func AsInfra(err error, reason string) error {
	var e *Error
	if errors.As(err, &e) {
		c := *e
		c.Infra = reason
		return &c
	}
	return &Error{Code: "internal", Msg: err.Error(), Infra: reason}
}
