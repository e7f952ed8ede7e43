package oci

import (
	"context"
	"io"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
)

// Service is the apiserver's OCI endpoint: import into, and export out of,
// one registry.
type Service struct {
	Importer
	// Layers mounts layers for export; nil makes export ErrUnavailable.
	Layers LayerSource
}

// ImportImage implements apiserver.OCI; see Importer.Import.
func (s *Service) ImportImage(ctx context.Context, format, name, ref string, body io.Reader) (api.Environment, error) {
	return s.Import(ctx, ImportRequest{Format: format, Name: name, Ref: ref}, body)
}

// ExportEnv implements apiserver.OCI: the environment ref as a tar of an
// OCI image layout (see ExportLayout). ErrInvalid for a format other than
// "oci-layout", ErrNotFound for an unknown environment.
func (s *Service) ExportEnv(ctx context.Context, ref, format string, w io.Writer) error {
	if format != FormatOCILayout {
		return errdefs.Invalid("export format %q: want %s", format, FormatOCILayout)
	}
	if s.Layers == nil {
		return errdefs.Unavailable("export: no layer source configured")
	}
	env, err := s.Store.GetEnv(ctx, ref)
	if err != nil {
		return err
	}
	if err := s.mkWorkDir(); err != nil {
		return err
	}
	return ExportLayout(ctx, env, s.Layers, s.WorkDir, w)
}
