package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/store/pgtest"
)

// TestKillDashNineDuringAOneTripDispatchedTurn: on PostgreSQL, host A runs
// a session's first event (its commit carries the dispatched payloads),
// then dispatches the second with the agent it expects (the one-round-trip
// claim) and is killed with SIGKILL while that turn waits for its model.
// Host B takes the session over: every event commits exactly once, the
// stream shows one turn.started per attempt before its chunks and one
// turn.committed per event, and the transcript holds two turns.
func TestKillDashNineDuringAOneTripDispatchedTurn(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	t.Parallel()
	dsn := pgtest.DSN(t)
	model := newModelServer(t, func(n int, body map[string]any, w http.ResponseWriter, r *http.Request) {
		if n == 2 {
			// A's second turn: slow until A dies.
			slowStream(w, r, 100*time.Millisecond, tokens("a", 600)...)
			return
		}
		slowStream(w, r, 5*time.Millisecond, tokens(fmt.Sprintf("t%d-", n), 5)...)
	})
	dir := t.TempDir()
	addrA, addrB := freePort(t), freePort(t)
	a := startServer(t, hcConfig(t, dir, addrA, dsn, model.URL, "", nil, ""), addrA)
	sess := a.cli("session", "create", "hc")
	a.cli("signal", "send", "hc", sess, callsMessage(t, modelCall("one")))
	waitUntil(t, "the first turn", time.Minute, func() bool { return len(a.transcript("hc", sess)) == 1 })
	a.cli("signal", "send", "hc", sess, callsMessage(t, modelCall("two")))
	waitUntil(t, "host A's second model call", time.Minute, func() bool { n, _ := model.counts(); return n >= 2 })
	b := startServer(t, hcConfig(t, dir, addrB, dsn, model.URL, "", nil, ""), addrB)
	a.kill9()
	waitUntil(t, "the second turn on B", 2*time.Minute, func() bool { return len(b.transcript("hc", sess)) >= 2 })

	turns := b.transcript("hc", sess)
	if len(turns) != 2 {
		t.Fatalf("%d turns, want 2", len(turns))
	}
	evs := b.events("hc", sess)
	if len(evs) != 2 {
		t.Fatalf("%d events, want 2", len(evs))
	}
	for i, ev := range evs {
		if ev.Status != "done" || turns[i].EventID != ev.ID {
			t.Errorf("event %d: status %s, turn %d's event %d", ev.ID, ev.Status, i+1, turns[i].EventID)
		}
	}
	c := openStream(t, addrB, "hc", sess, "")
	defer c.close()
	r := newReader(t)
	deadline := time.AfterFunc(time.Minute, c.close)
	defer deadline.Stop()
	if err := follow(c, r, func(sseEvent) bool { return len(r.commits) == 2 }); err != nil {
		t.Fatalf("the stream ended before both commits: %v (events %v)", err, r.kinds)
	}
	// One turn.started per (event, epoch, attempt), before that turn's
	// chunks and commit.
	started := map[string]bool{}
	fi := 0
	var seq []string
	for _, k := range r.kinds {
		if k == "chunk" {
			continue
		}
		f := r.frames[fi]
		fi++
		seq = append(seq, k)
		key := fmt.Sprintf("%d/%d/%d", f.EventID, f.Epoch, f.Attempt)
		switch k {
		case "turn.started":
			if started[key] {
				t.Errorf("a second turn.started of %s", key)
			}
			started[key] = true
		case "turn.committed", "turn.retrying":
			if !started[key] {
				t.Errorf("%s of %s before its turn.started", k, key)
			}
		}
	}
	want := "turn.started turn.committed turn.started turn.retrying turn.started turn.committed"
	if got := strings.Join(seq, " "); got != want {
		t.Fatalf("frames %s, want %s", got, want)
	}
	if r.commits[evs[1].ID].Epoch != turns[1].ActorEpoch || turns[1].ActorEpoch <= turns[0].ActorEpoch {
		t.Errorf("the second event committed at epoch %d (frame %d), the first at %d", turns[1].ActorEpoch,
			r.commits[evs[1].ID].Epoch, turns[0].ActorEpoch)
	}
}
