package api_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/paddock-dev/paddock/host/api"
)

// TestLoopbackHostOnlyRefusesARebindingName: a request addressed to another
// name (a DNS-rebinding page's) is refused before the handler runs;
// loopback names and addresses pass.
func TestLoopbackHostOnlyRefusesARebindingName(t *testing.T) {
	ran := 0
	h := api.LoopbackHostOnly(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { ran++ }))
	for _, c := range []struct {
		host string
		ok   bool
	}{
		{"127.0.0.1:8080", true}, {"localhost:8080", true}, {"LOCALHOST", true}, {"[::1]:8080", true},
		{"127.1.2.3", true}, {"localhost.:8080", true},
		{"rebind.evil.example:8080", false}, {"10.0.0.5:8080", false}, {"", false}, {"localhost.evil.example", false},
	} {
		ran = 0
		r := httptest.NewRequest("POST", "/ui/agents/a/sessions/s/signal", nil)
		r.Host = c.host
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if got := ran == 1; got != c.ok {
			t.Errorf("Host %q: handler ran %v, want %v (status %d)", c.host, got, c.ok, w.Code)
		}
		if !c.ok && w.Code != http.StatusForbidden {
			t.Errorf("Host %q: status %d, want 403", c.host, w.Code)
		}
	}
}
