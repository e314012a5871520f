package api

import (
	"net/http"

	"github.com/paddock-dev/paddock/host/api/client"
	"github.com/paddock-dev/paddock/host/service"
)

func (s *Server) registerPlugin(w http.ResponseWriter, r *http.Request) error {
	var in client.PluginRegistration
	if err := s.decode(w, r, &in); err != nil {
		return err
	}
	pw, created, err := s.svc.RegisterPlugin(r.Context(), service.PluginParams{
		Name: in.Name, Path: in.Path, SHA256: in.SHA256, Env: in.Env, Processes: in.Processes,
	})
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/v1/plugins/"+pw.Name)
	return writeJSON(w, createdOr200(created), pw)
}

func (s *Server) listPlugins(w http.ResponseWriter, r *http.Request) error {
	ps, err := s.svc.ListPlugins(r.Context())
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, client.PluginList{Plugins: ps})
}

func (s *Server) getPlugin(w http.ResponseWriter, r *http.Request) error {
	p, err := s.svc.GetPlugin(r.Context(), r.PathValue("plugin"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, p)
}
