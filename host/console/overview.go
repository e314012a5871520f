package console

import (
	"net/http"
	"strings"

	"github.com/paddock-dev/paddock/host/service"
)

// overview shows this host, the hosts holding leases (by the store), the
// pools in use with their waiting sessions, the remote workers, the turns
// of the last minute and this host's figures. To a token of one namespace
// the leases and pools count its namespace's agents only, and no figure
// names another namespace's agent (service.Cluster, service.Figures).
func (c *Console) overview(w http.ResponseWriter, r *http.Request) error {
	f, err := c.svc.Figures(r.Context())
	if err != nil {
		return err
	}
	// The metric name prefixes the overview shows.
	prefixes := []string{
		"paddock_turns", "paddock_failed_attempts", "paddock_dead_letters", "paddock_fence_rejections",
		"paddock_controller", "paddock_pending_sessions", "paddock_leases_expired",
		"paddock_steers", "paddock_alarms_fired", "paddock_waits_expired", "paddock_approval_holds",
		"paddock_stream", "paddock_fabric", "paddock_host_calls",
	}
	var ms []service.Metric
	for _, m := range f.Metrics {
		for _, p := range prefixes {
			if strings.HasPrefix(m.Name, p) {
				ms = append(ms, m)
				break
			}
		}
	}
	cl, err := c.svc.Cluster(r.Context())
	if err != nil {
		return err
	}
	return c.render(w, r, http.StatusOK, "overview", "Overview", "overview", struct {
		Figures service.Figures
		Cluster service.Cluster
		Metrics []service.Metric
	}{f, cl, ms})
}
