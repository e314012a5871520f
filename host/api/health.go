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

// ready answers GET /readyz (no token needed): 200 with the health body
// when the store answers a cheap read in time, else 503 store_unavailable
// (or timeout). /healthz stays liveness: the process answers.
func (s *Server) ready(w http.ResponseWriter, r *http.Request) error {
	if err := s.svc.Ready(r.Context()); err != nil {
		if e := asError(err); e != nil && e.Code == "timeout" {
			return &Error{Status: http.StatusServiceUnavailable, Code: "store_unavailable", Message: "the store did not answer in time"}
		}
		return err
	}
	return s.health(w, r)
}

// openapi serves the OpenAPI description.
func (s *Server) openapi(w http.ResponseWriter, r *http.Request) error {
	w.Header().Set("Content-Type", "application/yaml")
	_, err := w.Write(OpenAPI)
	return err
}
