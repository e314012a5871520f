package api

import (
	"fmt"
	"net/http"

	"github.com/paddock-dev/paddock/host/api/client"
	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/store"
)

func toAgent(a store.Agent) client.Agent {
	return client.Agent{UID: a.UID, Name: a.Name, Kind: a.Kind, Module: a.ModuleDigest, Plugin: a.Plugin,
		CrashPolicy: a.CrashPolicy, CreatedAt: a.CreatedAt, UpdatedAt: a.UpdatedAt}
}

func (s *Server) createAgent(w http.ResponseWriter, r *http.Request) error {
	var in client.CreateAgentRequest
	if err := s.decode(w, r, &in); err != nil {
		return err
	}
	a, err := s.svc.CreateAgent(r.Context(), in.Name, service.Binding{Module: in.Module, Plugin: in.Plugin, CrashPolicy: in.CrashPolicy})
	if err != nil {
		return hint(bindingHints(err), "agent_exists", fmt.Sprintf("; PUT /v1/agents/%s (paddock agent update) re-binds it", in.Name))
	}
	w.Header().Set("Location", "/v1/agents/"+a.Name)
	return writeJSON(w, http.StatusCreated, toAgent(a))
}

// updateAgent re-binds an existing agent (a new module or plugin, or
// another default crash policy): new events run the new binding, events
// already started keep theirs (docs/DESIGN.md invariant 10).
func (s *Server) updateAgent(w http.ResponseWriter, r *http.Request) error {
	old, err := s.svc.GetAgent(r.Context(), r.PathValue("agent"))
	if err != nil {
		return err
	}
	var in client.UpdateAgentRequest
	if err := s.decode(w, r, &in); err != nil {
		return err
	}
	a, err := s.svc.UpdateAgent(r.Context(), old, service.Binding{Module: in.Module, Plugin: in.Plugin, CrashPolicy: in.CrashPolicy})
	if err != nil {
		return bindingHints(err)
	}
	w.Header().Set("Location", "/v1/agents/"+a.Name)
	return writeJSON(w, http.StatusOK, toAgent(a))
}

func (s *Server) listAgents(w http.ResponseWriter, r *http.Request) error {
	as, err := s.svc.ListAgents(r.Context())
	if err != nil {
		return err
	}
	out := client.AgentList{Agents: make([]client.Agent, 0, len(as))}
	for _, a := range as {
		out.Agents = append(out.Agents, toAgent(a))
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) getAgent(w http.ResponseWriter, r *http.Request) error {
	a, err := s.svc.GetAgent(r.Context(), r.PathValue("agent"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, toAgent(a))
}
