package apiserver

import (
	"net/http"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/node/nodeapi"
)

// portRoutes serves a sandbox's ports (api/ports.go) on the one path of
// the calls on a sandbox (sandboxCall), for every method: HTTP to one of
// its ports, WebSocket upgrades included, and port-forward tunnels. Their
// rules (routeRules) ask for the rights of exec.
func (s *Server) portRoutes(auth func(handler) http.Handler) {
	h := auth(s.portCall)
	s.mux.Handle(nodeapi.PortsPattern, h)
	s.mux.Handle(nodeapi.PortsRootPattern, h)
	s.mux.Handle(nodeapi.TunnelPattern, h)
}

// portCall checks the port before the call goes the one path: 400 for a
// port outside 1-65535, whatever the sandbox.
func (s *Server) portCall(w http.ResponseWriter, r *http.Request) error {
	if _, err := api.ParsePort(r.PathValue("port")); err != nil {
		return errdefs.Invalid("%v", err)
	}
	return s.sandboxCall(w, r)
}
