package httperr

import (
	"errors"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
)

// Failures of the platform carry infra_error, the task's and the caller's
// do not; the mark survives a hop through the node API (FromAPI).
func TestInfraError(t *testing.T) {
	for _, tc := range []struct {
		err   error
		infra bool
	}{
		{errdefs.New(errdefs.ErrUnavailable, api.CodeSandboxLost, "sandbox x is lost"), true},
		{errdefs.New(errdefs.ErrUnavailable, api.CodeNodeUnreachable, "node n1 did not answer"), true},
		{errors.New("boom"), true}, // internal
		{errdefs.AsInfra(errdefs.New(errdefs.ErrConflict, api.CodeSandboxGone, "ended: node shutting down"), "the sandbox's node shut down"), true},
		{errdefs.New(errdefs.ErrConflict, api.CodeSandboxGone, "ended: ttl expired"), false},
		{errdefs.New(errdefs.ErrUnavailable, api.CodeNoCapacity, "no room"), false},
		{errdefs.New(errdefs.ErrNotFound, api.CodeSandboxNotFound, "no such sandbox"), false},
		{errdefs.Invalid("bad"), false},
	} {
		status, e := ToAPI(tc.err)
		if (e.InfraError != "") != tc.infra {
			t.Errorf("%v (%d %s): infra_error %q, want infra %v", tc.err, status, e.Code, e.InfraError, tc.infra)
		}
		back := FromAPI(status, e)
		if got := errdefs.InfraOf(back); got != e.InfraError {
			t.Errorf("%v through FromAPI: infra %q, want %q", tc.err, got, e.InfraError)
		}
		if _, again := ToAPI(back); again.InfraError != e.InfraError || again.Code != e.Code {
			t.Errorf("%v forwarded: %+v, want %+v", tc.err, again, e)
		}
	}
	if _, e := ToAPI(errdefs.AsInfra(errors.New("conn reset"), "cut")); e.InfraError != "cut" || e.Code != api.CodeInternal {
		t.Errorf("AsInfra of a plain error: %+v", e)
	}
}
