package apiserver

import "net/http"

// ociRoutes registers OCI image import and environment export.
func (s *Server) ociRoutes(auth func(handler) http.Handler) {}
