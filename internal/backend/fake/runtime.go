package fake

import (
	"context"
	"slices"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
)

var _ backend.Runtimes = (*Backend)(nil)

// Runtimes are Options.Runtimes: none unless set. A runtime changes
// nothing of how the fake runs a sandbox.
func (b *Backend) Runtimes() []string { return slices.Clone(b.opts.Runtimes) }

// RuntimeCapabilities are Capabilities for every runtime of Runtimes.
// ErrInvalid for another.
func (b *Backend) RuntimeCapabilities(runtime string) (backend.Capabilities, error) {
	if err := b.knownRuntime(runtime); err != nil {
		return backend.Capabilities{}, err
	}
	return b.Capabilities(), nil
}

// RuntimeAvailable is Available, then Options.RuntimeUnavailable's error
// for runtime. ErrInvalid for a runtime not in Runtimes.
func (b *Backend) RuntimeAvailable(ctx context.Context, runtime string) error {
	if err := b.knownRuntime(runtime); err != nil {
		return err
	}
	if err := b.Available(ctx); err != nil {
		return err
	}
	return b.opts.RuntimeUnavailable[runtime]
}

// knownRuntime: "" (the default) or one of Runtimes.
func (b *Backend) knownRuntime(runtime string) error {
	if runtime == "" || slices.Contains(b.opts.Runtimes, runtime) {
		return nil
	}
	return errdefs.Invalid("fake: unknown runtime %q (have %q)", runtime, b.opts.Runtimes)
}

// checkRuntime refuses a Create whose runtime is unknown or unavailable.
func (b *Backend) checkRuntime(ctx context.Context, spec backend.Spec) error {
	if spec.Runtime == "" {
		return nil
	}
	return b.RuntimeAvailable(ctx, spec.Runtime)
}
