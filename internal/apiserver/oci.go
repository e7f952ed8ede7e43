package apiserver

import (
	"context"
	"io"
	"net/http"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/httperr"
)

// OCI imports OCI images as environments and exports environments as OCI
// images (*oci.Service).
type OCI interface {
	// ImportImage reads an archive in format ("docker-archive" or
	// "oci-layout", a tar of the layout) from body and creates the
	// environment name ("name" or "name@version"); ref picks one image of
	// an archive holding several.
	ImportImage(ctx context.Context, format, name, ref string, body io.Reader) (api.Environment, error)
	// ExportEnv writes the environment ref in format ("oci-layout": a tar
	// of the layout) to w. It writes nothing to w before it knows it can
	// finish, so an early error can still be answered properly.
	ExportEnv(ctx context.Context, ref, format string, w io.Writer) error
}

// ociRoutes registers OCI image import and environment export.
func (s *Server) ociRoutes(auth func(handler) http.Handler) {
	s.mux.Handle("POST /v1/images:import", auth(s.changesImages(s.importImage)))
	s.mux.Handle("GET /v1/environments/{ref}/export", auth(s.exportEnv))
}

func (s *Server) oci() (OCI, error) {
	if s.cfg.OCI == nil {
		return nil, errdefs.Unavailable("OCI import and export are not configured on this server")
	}
	return s.cfg.OCI, nil
}

// importImage: POST /v1/images:import?name=app[@1.0]&format=docker-archive|oci-layout[&ref=app:1.0]
// with the archive as the body. 201 with the environment created.
func (s *Server) importImage(w http.ResponseWriter, r *http.Request) error {
	o, err := s.oci()
	if err != nil {
		return err
	}
	q := r.URL.Query()
	name, format := q.Get("name"), q.Get("format")
	if name == "" {
		return errdefs.Invalid("import: the name query parameter is required")
	}
	if format == "" {
		return errdefs.Invalid("import: the format query parameter is required (docker-archive or oci-layout)")
	}
	env, err := o.ImportImage(r.Context(), format, name, q.Get("ref"), r.Body)
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/v1/environments/"+env.Ref)
	return writeJSON(w, http.StatusCreated, env)
}

// exportEnv: GET /v1/environments/{ref}/export?format=oci-layout streams a
// tar of an OCI image layout. An error after the first byte cuts the
// stream short, which the tar's missing end marker shows.
func (s *Server) exportEnv(w http.ResponseWriter, r *http.Request) error {
	o, err := s.oci()
	if err != nil {
		return err
	}
	format := r.URL.Query().Get("format")
	if format == "" {
		format = "oci-layout"
	}
	w.Header().Set("Content-Type", "application/x-tar")
	ref, ctx := r.PathValue("ref"), r.Context()
	return httperr.Stream(w, s.log, func(cw io.Writer) error { return o.ExportEnv(ctx, ref, format, cw) })
}
