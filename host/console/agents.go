package console

import (
	"fmt"
	"net/http"
	"sort"
	"strconv"

	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/store"
)

// agentsPage is how many sessions and dead letters an agent's page shows.
const agentsPage = 20

// agents lists the agents.
func (c *Console) agents(w http.ResponseWriter, r *http.Request) error {
	as, err := c.svc.ListAgents(r.Context())
	if err != nil {
		return err
	}
	return c.render(w, r, http.StatusOK, "agents", "Agents", "agents", as)
}

// agent is an agent's page: binding, policy, capabilities (secret names
// only), its first sessions and dead letters.
func (c *Console) agent(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	a, err := c.svc.GetAgent(ctx, r.PathValue("agent"))
	if err != nil {
		return err
	}
	xs, next, err := c.svc.ListSessions(ctx, a, "", agentsPage)
	if err != nil {
		return err
	}
	dls, err := c.svc.ListDeadLetters(ctx, a, "", service.Page{Limit: agentsPage})
	if err != nil {
		return err
	}
	// Versions, newest first, agentsPage at a time (?versions_before=).
	var before int64
	if v := r.URL.Query().Get("versions_before"); v != "" {
		if before, err = strconv.ParseInt(v, 10, 64); err != nil || before < 1 {
			return &pageError{Status: http.StatusBadRequest, Message: fmt.Sprintf("versions_before %q is not a version number", v)}
		}
	}
	versions, err := c.svc.AgentVersions(ctx, a, before, agentsPage)
	if err != nil {
		return err
	}
	var versionsNext int64
	if len(versions) == agentsPage && versions[len(versions)-1].Version > 1 {
		versionsNext = versions[len(versions)-1].Version
	}
	pol := c.svc.AgentPolicy(a)
	secrets := append([]string(nil), pol.Capabilities.Secrets...)
	sort.Strings(secrets)
	rows := make([]service.SessionRow, 0, len(xs))
	for _, x := range xs {
		rows = append(rows, service.SessionRow{Agent: a.Name, Session: x})
	}
	return c.render(w, r, http.StatusOK, "agent", "Agent "+a.Name, "agents", struct {
		Agent        store.Agent
		Policy       host.AgentPolicy
		Secrets      []string
		Sessions     []service.SessionRow
		More         bool
		DeadLetters  []store.DeadLetter
		Versions     []store.AgentVersion
		VersionsNext int64
	}{a, pol, secrets, rows, next != "", dls, versions, versionsNext})
}
