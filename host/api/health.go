package api

import (
	"net/http"

	"github.com/paddock-dev/paddock/host/api/client"
)

// health answers GET /healthz (no token needed): the store driver and the
// host id. /metrics is the host's Prometheus registry (see New).
func (s *Server) health(w http.ResponseWriter, r *http.Request) error {
	h := s.svc.Health()
	return writeJSON(w, http.StatusOK, client.Health{Status: "ok", Store: h.Store, HostID: h.HostID})
}

// openapi serves the OpenAPI description.
func (s *Server) openapi(w http.ResponseWriter, r *http.Request) error {
	w.Header().Set("Content-Type", "application/yaml")
	_, err := w.Write(OpenAPI)
	return err
}
