package console

import (
	"net/http"
	"sort"
	"strings"

	"github.com/paddock-dev/paddock/host/service"
)

// overview shows this host, its pools and its figures.
func (c *Console) overview(w http.ResponseWriter, r *http.Request) error {
	f, err := c.svc.Figures()
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
	pools := make([]string, 0, len(f.Pools))
	for name := range f.Pools {
		pools = append(pools, name)
	}
	sort.Strings(pools)
	return c.render(w, r, http.StatusOK, "overview", "Overview", "overview", struct {
		Figures   service.Figures
		PoolNames []string
		Metrics   []service.Metric
	}{f, pools, ms})
}
