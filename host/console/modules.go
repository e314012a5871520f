package console

import (
	"net/http"
	"sort"
	"time"

	"github.com/paddock-dev/paddock/store"
)

// moduleView is a module with the agents bound to it.
type moduleView struct {
	store.Module
	Agents []string
}

// pluginView is a plugin worker without its env values (they may be
// secrets): env names only, and the agents bound to it.
type pluginView struct {
	Name, Path, SHA256 string
	Processes          int
	EnvNames           []string
	Agents             []string
	Updated            time.Time
}

// modules lists modules and plugin workers with the agents that use them.
func (c *Console) modules(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	ms, err := c.svc.ListModules(ctx)
	if err != nil {
		return err
	}
	ps, err := c.svc.ListPlugins(ctx)
	if err != nil {
		return err
	}
	as, err := c.svc.ListAgents(ctx)
	if err != nil {
		return err
	}
	byModule, byPlugin := map[string][]string{}, map[string][]string{}
	for _, a := range as {
		if a.ModuleDigest != "" {
			byModule[a.ModuleDigest] = append(byModule[a.ModuleDigest], a.Name)
		}
		if a.Plugin != "" {
			byPlugin[a.Plugin] = append(byPlugin[a.Plugin], a.Name)
		}
	}
	mv := make([]moduleView, 0, len(ms))
	for _, m := range ms {
		mv = append(mv, moduleView{Module: m, Agents: byModule[m.Digest]})
	}
	pv := make([]pluginView, 0, len(ps))
	for _, p := range ps {
		names := make([]string, 0, len(p.Env))
		for k := range p.Env {
			names = append(names, k)
		}
		sort.Strings(names)
		pv = append(pv, pluginView{Name: p.Name, Path: p.Path, SHA256: p.SHA256, Processes: p.Processes, EnvNames: names,
			Agents: byPlugin[p.Name], Updated: p.UpdatedAt})
	}
	return c.render(w, r, http.StatusOK, "modules", "Modules and plugins", "modules", struct {
		Modules []moduleView
		Plugins []pluginView
	}{mv, pv})
}
