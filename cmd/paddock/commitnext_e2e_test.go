package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	apiclient "github.com/paddock-dev/paddock/host/api/client"
)

// TestKillDashNineWhileABacklogDrainsCommitsEachEventOnceInOrder: a
// session's events wait behind each other, each taken by the commit before
// it (store.CommitTurnParams.Next); the host is killed with SIGKILL in the
// middle of the backlog and restarted. Every event then commits exactly
// once, in the order accepted, on both drivers.
func TestKillDashNineWhileABacklogDrainsCommitsEachEventOnceInOrder(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	t.Parallel()
	for _, driver := range []string{"sqlite", "postgres"} {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			addr := freePort(t)
			cfg := writeConfig(t, driver, addr)
			srv := startServer(t, cfg, addr)
			sess := srv.cli("session", "create", "faulty")
			const backlog = 14
			for i := range backlog {
				if _, err := srv.api().SendSignal(context.Background(), "faulty", sess,
					apiclient.Signal{Message: fmt.Sprintf("nap %d", 120+i)}); err != nil {
					t.Fatal(err)
				}
			}
			waitUntil(t, "part of the backlog", time.Minute, func() bool { return len(srv.transcript("faulty", sess)) >= 4 })
			srv.kill9()
			srv = startServer(t, cfg, addr)
			waitUntil(t, "the whole backlog", 2*time.Minute, func() bool { return len(srv.transcript("faulty", sess)) >= backlog })
			time.Sleep(500 * time.Millisecond) // a few scans: nothing runs twice
			turns := srv.transcript("faulty", sess)
			evs := srv.events("faulty", sess)
			if len(turns) != backlog || len(evs) != backlog {
				t.Fatalf("%d turns of %d events, want %d of %d", len(turns), len(evs), backlog, backlog)
			}
			for i, ev := range evs {
				if ev.Status != "done" {
					t.Errorf("event %d is %s", ev.ID, ev.Status)
				}
				if turns[i].EventID != ev.ID {
					t.Errorf("turn %d is of event %d, want event %d (accepted order)", i+1, turns[i].EventID, ev.ID)
				}
				want := fmt.Sprintf("napped %d ms", 120+i)
				if got := turns[i].Messages[len(turns[i].Messages)-1].Content; got != want {
					t.Errorf("turn %d replied %q, want %q", i+1, got, want)
				}
			}
		})
	}
}
