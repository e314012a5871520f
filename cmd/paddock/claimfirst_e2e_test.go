package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/store/pgtest"
)

// TestKillDashNineDuringAFirstTurnTakenByTheClaim: on PostgreSQL, host A
// runs one session of an agent (so it expects the agent), then a second
// session is signalled: its activation's claim takes its first turn
// (store.ClaimActivationParams.First), and A is killed with SIGKILL while
// that turn waits for its model. Host B takes the session over: the event
// commits exactly once, its stream shows the first attempt retried under a
// higher epoch, and the epoch of A's activation is never reused.
func TestKillDashNineDuringAFirstTurnTakenByTheClaim(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	t.Parallel()
	dsn := pgtest.DSN(t)
	model := newModelServer(t, func(n int, body map[string]any, w http.ResponseWriter, r *http.Request) {
		if n == 2 {
			// The second session's turn on A: slow until A dies.
			slowStream(w, r, 100*time.Millisecond, tokens("a", 600)...)
			return
		}
		slowStream(w, r, 5*time.Millisecond, tokens(fmt.Sprintf("t%d-", n), 5)...)
	})
	dir := t.TempDir()
	addrA, addrB := freePort(t), freePort(t)
	a := startServer(t, hcConfig(t, dir, addrA, dsn, model.URL, "", nil, ""), addrA)
	warm := a.cli("session", "create", "hc")
	a.cli("signal", "send", "hc", warm, callsMessage(t, modelCall("one")))
	waitUntil(t, "the warm session's turn", time.Minute, func() bool { return len(a.transcript("hc", warm)) == 1 })
	sess := a.cli("session", "create", "hc")
	a.cli("signal", "send", "hc", sess, callsMessage(t, modelCall("two")))
	waitUntil(t, "host A's second model call", time.Minute, func() bool { n, _ := model.counts(); return n >= 2 })
	b := startServer(t, hcConfig(t, dir, addrB, dsn, model.URL, "", nil, ""), addrB)
	a.kill9()
	waitUntil(t, "the turn on B", 2*time.Minute, func() bool { return len(b.transcript("hc", sess)) >= 1 })

	turns := b.transcript("hc", sess)
	evs := b.events("hc", sess)
	if len(turns) != 1 || len(evs) != 1 || evs[0].Status != "done" || turns[0].EventID != evs[0].ID {
		t.Fatalf("%d turns of %d events (%+v), want one committed", len(turns), len(evs), evs)
	}
	c := openStream(t, addrB, "hc", sess, "")
	defer c.close()
	r := newReader(t)
	deadline := time.AfterFunc(time.Minute, c.close)
	defer deadline.Stop()
	if err := follow(c, r, func(sseEvent) bool { return len(r.commits) == 1 }); err != nil {
		t.Fatalf("the stream ended before the commit: %v (events %v)", err, r.kinds)
	}
	var seq []string
	epochs := map[int64]bool{}
	fi := 0
	for _, k := range r.kinds {
		if k == "chunk" {
			continue
		}
		f := r.frames[fi]
		fi++
		seq = append(seq, k)
		if k == "turn.started" {
			if epochs[f.Epoch] {
				t.Errorf("a second turn.started at epoch %d", f.Epoch)
			}
			epochs[f.Epoch] = true
		}
	}
	if got, want := strings.Join(seq, " "), "turn.started turn.retrying turn.started turn.committed"; got != want {
		t.Fatalf("frames %s, want %s", got, want)
	}
}
