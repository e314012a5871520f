package api

import (
	"fmt"
	"net/http"

	"github.com/paddock-dev/paddock/host/api/client"
	"github.com/paddock-dev/paddock/host/calls"
	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/store"
)

// toAgent answers agent a with its capabilities as the host's config sets
// them now (service.Capabilities).
func (s *Server) toAgent(a store.Agent) client.Agent {
	return client.Agent{UID: a.UID, Namespace: a.Namespace, Name: a.Name, Kind: a.Kind, Module: a.ModuleDigest, Plugin: a.Plugin,
		CrashPolicy: a.CrashPolicy, CreatedAt: a.CreatedAt, UpdatedAt: a.UpdatedAt,
		Capabilities: toCapabilities(s.svc.Capabilities(a))}
}

// toCapabilities is the wire form of c: secret names only (c holds no
// value), empty lists as [] rather than null.
func toCapabilities(c calls.Capabilities) client.Capabilities {
	out := client.Capabilities{HTTP: make([]client.HTTPRule, 0, len(c.HTTP)),
		Models: append([]string{}, c.Models...), Secrets: append([]string{}, c.Secrets...),
		Limits: client.Limits{CallsPerTurn: c.Limits.CallsPerTurn, ResponseBytesPerTurn: c.Limits.ResponseBytesPerTurn,
			TokensPerTurn: c.Limits.TokensPerTurn, TokensPerDay: c.Limits.TokensPerDay},
		Approval: client.ApprovalRules{HTTP: make([]client.ApprovalHTTPRule, 0, len(c.Approval.HTTP)),
			Models: append([]string{}, c.Approval.Models...), TimeoutMs: c.Approval.Timeout.Milliseconds()}}
	for _, r := range c.Approval.HTTP {
		out.Approval.HTTP = append(out.Approval.HTTP, client.ApprovalHTTPRule{Host: r.Host, Methods: r.Methods, PathPrefix: r.PathPrefix})
	}
	for _, r := range c.HTTP {
		out.HTTP = append(out.HTTP, client.HTTPRule{Scheme: r.Scheme, Host: r.Host, Port: r.Port,
			Methods: r.Methods, AllowPrivate: r.AllowPrivate, Secrets: r.Secrets})
	}
	return out
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
	return writeJSON(w, http.StatusCreated, s.toAgent(a))
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
	return writeJSON(w, http.StatusOK, s.toAgent(a))
}

func (s *Server) listAgents(w http.ResponseWriter, r *http.Request) error {
	as, err := s.svc.ListAgents(r.Context())
	if err != nil {
		return err
	}
	out := client.AgentList{Agents: make([]client.Agent, 0, len(as))}
	for _, a := range as {
		out.Agents = append(out.Agents, s.toAgent(a))
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) getAgent(w http.ResponseWriter, r *http.Request) error {
	a, err := s.svc.GetAgent(r.Context(), r.PathValue("agent"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, s.toAgent(a))
}
