package apiserver

import "net/http"

// layerRoutes registers /v1/layers and /v1/environments.
func (s *Server) layerRoutes(auth func(handler) http.Handler) {}
