package fabric

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// Serves follows the admitted workers' announced pools and kinds, and
// Admitted reports each admission: what a host decides placement by
// (docs/DESIGN.md "Remote pools across hosts").
func TestServesFollowsLiveWorkersAndAdmittedIsCalled(t *testing.T) {
	type admission struct {
		worker string
		pools  []string
	}
	admitted := make(chan admission, 4)
	e := newEnv(t, func(c *BrokerConfig) {
		c.Admitted = func(w string, pools []string) { admitted <- admission{w, pools} }
	})
	digest := "sha256:" + strings.Repeat("a", 64)
	if e.b.Serves("p", digest) || e.b.Serves("p", "") {
		t.Fatal("Serves is true with no worker connected")
	}
	w := e.startWorker("w1")
	select {
	case a := <-admitted:
		if a.worker != "w1" || !slices.Equal(a.pools, []string{"p"}) {
			t.Errorf("Admitted(%q, %v), want w1 [p]", a.worker, a.pools)
		}
	case <-time.After(time.Minute):
		t.Fatal("Admitted was not called")
	}
	for _, c := range []struct {
		pool, binding string
		want          bool
	}{
		{"p", digest, true},
		{"p", "", true},
		{"q", digest, false},
		{"p", "plugin:other@" + strings.Repeat("b", 64), false}, // a kind the worker does not announce
		{"p", "garbage", false},
	} {
		if got := e.b.Serves(c.pool, c.binding); got != c.want {
			t.Errorf("Serves(%q, %q) = %v, want %v", c.pool, c.binding, got, c.want)
		}
	}
	w.kill()
	e.waitFor("Serves to turn false after the worker died", time.Minute, func() bool { return !e.b.Serves("p", digest) })
}
