package main

import (
	"testing"
	"time"
)

// TestKillDashNineDuringADeferredTurnChargesNoAttempt: a wasm turn runs
// deferred — read, not written (docs/DESIGN.md "Deferred dispatch"; here
// runtime.promote_after is longer than the turn) — when its host is killed
// with SIGKILL. Nothing of the attempt was written, so nothing of it is
// recorded: after the restart the event commits exactly once, with no
// attempt counted and no error, and its stream has one turn.started, on
// both drivers.
func TestKillDashNineDuringADeferredTurnChargesNoAttempt(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	t.Parallel()
	for _, driver := range []string{"sqlite", "postgres"} {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			addr := freePort(t)
			cfg := writeConfig(t, driver, addr)
			// Longer than the 600 ms turn below, shorter than lease_ttl (2s).
			editConfig(t, cfg, "  lease_ttl: 2s\n", "  lease_ttl: 2s\n  promote_after: 1500ms\n")
			srv := startServer(t, cfg, addr)
			sess := srv.cli("session", "create", "faulty")
			// The activation's first dispatch is written (it learns what
			// the agent runs); the next is deferred.
			srv.cli("signal", "send", "faulty", sess, "nap 10")
			waitUntil(t, "the first turn", time.Minute, func() bool { return len(srv.transcript("faulty", sess)) == 1 })
			srv.cli("signal", "send", "faulty", sess, "sleep 600")
			time.Sleep(300 * time.Millisecond) // the turn runs, unwritten
			srv.kill9()
			srv = startServer(t, cfg, addr)
			waitUntil(t, "the second turn after the restart", 2*time.Minute, func() bool { return len(srv.transcript("faulty", sess)) >= 2 })
			time.Sleep(500 * time.Millisecond) // a few scans: nothing runs twice

			turns, evs := srv.transcript("faulty", sess), srv.events("faulty", sess)
			if len(turns) != 2 || len(evs) != 2 {
				t.Fatalf("%d turns of %d events, want 2 of 2", len(turns), len(evs))
			}
			second := evs[1]
			if second.Status != "done" || second.Attempts != 0 || second.LastError != "" {
				t.Errorf("the event killed mid-turn: status %s, attempts %d, last error %q; want done, 0, none",
					second.Status, second.Attempts, second.LastError)
			}
			if got := turns[1].Messages[len(turns[1].Messages)-1].Content; got != "slept 600 ms" {
				t.Errorf("second turn replied %q", got)
			}
			c := openStream(t, addr, "faulty", sess, "")
			defer c.close()
			r := newReader(t)
			deadline := time.AfterFunc(time.Minute, c.close)
			defer deadline.Stop()
			if err := follow(c, r, func(sseEvent) bool { return len(r.commits) == 2 }); err != nil {
				t.Fatalf("the stream ended before both commits: %v (events %v)", err, r.kinds)
			}
			started, fi := 0, 0
			for _, k := range r.kinds {
				if k == "chunk" {
					continue
				}
				f := r.frames[fi]
				fi++
				if f.EventID != second.ID {
					continue
				}
				switch k {
				case "turn.started":
					started++
				case "turn.retrying", "turn.failed":
					t.Errorf("frame %d: %s of the event killed while deferred (nothing of that attempt was written)", f.Seq, k)
				}
			}
			if started != 1 {
				t.Errorf("%d turn.started frames of the event, want 1 (the attempt that committed)", started)
			}
		})
	}
}
