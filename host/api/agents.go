package api

import (
	"net/http"
	"time"

	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/store"
)

type agentJSON struct {
	UID         string            `json:"uid"`
	Name        string            `json:"name"`
	Kind        string            `json:"kind"`
	Module      string            `json:"module,omitempty"`
	Plugin      string            `json:"plugin,omitempty"`
	CrashPolicy store.CrashPolicy `json:"crash_policy"`
	CreatedAt   time.Time         `json:"created_at"`
	UpdatedAt   time.Time         `json:"updated_at"`
}

func toAgentJSON(a store.Agent) agentJSON {
	return agentJSON{UID: a.UID, Name: a.Name, Kind: a.Kind, Module: a.ModuleDigest, Plugin: a.Plugin,
		CrashPolicy: a.CrashPolicy, CreatedAt: a.CreatedAt, UpdatedAt: a.UpdatedAt}
}

// bindingIn is the body of agent re-binding; agent registration adds the
// name.
type bindingIn struct {
	Module      string `json:"module"`
	Plugin      string `json:"plugin"`
	CrashPolicy string `json:"crash_policy"`
}

func (b bindingIn) binding() service.Binding {
	return service.Binding{Module: b.Module, Plugin: b.Plugin, CrashPolicy: b.CrashPolicy}
}

func (s *Server) createAgent(w http.ResponseWriter, r *http.Request) error {
	var in struct {
		Name        string `json:"name"`
		Module      string `json:"module"`
		Plugin      string `json:"plugin"`
		CrashPolicy string `json:"crash_policy"`
	}
	if err := s.decode(w, r, &in); err != nil {
		return err
	}
	a, err := s.svc.CreateAgent(r.Context(), in.Name, bindingIn{in.Module, in.Plugin, in.CrashPolicy}.binding())
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/v1/agents/"+a.Name)
	return writeJSON(w, http.StatusCreated, toAgentJSON(a))
}

// updateAgent re-binds an existing agent (a new module or plugin, or
// another default crash policy): new events run the new binding, events
// already started keep theirs (DESIGN invariant 10).
func (s *Server) updateAgent(w http.ResponseWriter, r *http.Request) error {
	old, err := s.svc.GetAgent(r.Context(), r.PathValue("agent"))
	if err != nil {
		return err
	}
	var in bindingIn
	if err := s.decode(w, r, &in); err != nil {
		return err
	}
	a, err := s.svc.UpdateAgent(r.Context(), old, in.binding())
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/v1/agents/"+a.Name)
	return writeJSON(w, http.StatusOK, toAgentJSON(a))
}

func (s *Server) listAgents(w http.ResponseWriter, r *http.Request) error {
	as, err := s.svc.ListAgents(r.Context())
	if err != nil {
		return err
	}
	out := make([]agentJSON, 0, len(as))
	for _, a := range as {
		out = append(out, toAgentJSON(a))
	}
	return writeJSON(w, http.StatusOK, map[string]any{"agents": out})
}

func (s *Server) getAgent(w http.ResponseWriter, r *http.Request) error {
	a, err := s.svc.GetAgent(r.Context(), r.PathValue("agent"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, toAgentJSON(a))
}
