package api

import (
	"net/http"
	"slices"

	"github.com/paddock-dev/paddock/host/api/client"
	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/store"
)

// toPlugin shows a plugin worker with its environment's names only: the
// values are often secrets, and the API never returns them.
func toPlugin(p store.PluginWorker) client.Plugin {
	out := client.Plugin{Name: p.Name, Path: p.Path, SHA256: p.SHA256, Processes: p.Processes,
		CreatedAt: p.CreatedAt, UpdatedAt: p.UpdatedAt}
	for k := range p.Env {
		out.EnvNames = append(out.EnvNames, k)
	}
	slices.Sort(out.EnvNames)
	return out
}

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
	return writeJSON(w, createdOr200(created), toPlugin(pw))
}

func (s *Server) listPlugins(w http.ResponseWriter, r *http.Request) error {
	ps, err := s.svc.ListPlugins(r.Context())
	if err != nil {
		return err
	}
	out := client.PluginList{Plugins: make([]client.Plugin, 0, len(ps))}
	for _, p := range ps {
		out.Plugins = append(out.Plugins, toPlugin(p))
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) getPlugin(w http.ResponseWriter, r *http.Request) error {
	p, err := s.svc.GetPlugin(r.Context(), r.PathValue("plugin"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, toPlugin(p))
}
