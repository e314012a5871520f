package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	apiclient "github.com/paddock-dev/paddock/host/api/client"
)

// TestAHostStoppedRightAfterACommitLosesItsLeaseAndCommitsNothingTwice:
// on PostgreSQL, host A drains a session's backlog, each commit renewing
// its lease (store.CommitTurnParams.LeaseTTL, so that its renewal rounds
// skip it) and taking the next event; A is stopped (SIGSTOP) as soon as a
// commit landed, past its lease. Host B takes the session over and drains
// the rest; A then resumes, a zombie whose renewal round may have skipped
// the lease its last commit renewed: every event still commits exactly
// once, in order, and A ends up holding nothing.
func TestAHostStoppedRightAfterACommitLosesItsLeaseAndCommitsNothingTwice(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	t.Parallel()
	addrA, addrB := freePort(t), freePort(t)
	cfgA := writeConfig(t, "postgres", addrA)
	raw, err := os.ReadFile(cfgA)
	if err != nil {
		t.Fatal(err)
	}
	cfgB := filepath.Join(t.TempDir(), "paddock.yaml")
	b := strings.Replace(string(raw), "listen: "+addrA, "listen: "+addrB, 1)
	b = strings.Replace(b, "data_dir: ", "data_dir: "+filepath.Dir(cfgB)+"/b-", 1)
	if err := os.WriteFile(cfgB, []byte(b), 0o600); err != nil {
		t.Fatal(err)
	}
	a := startServer(t, cfgA, addrA)
	t.Cleanup(func() { _ = a.cmd.Process.Signal(syscall.SIGCONT) })
	sess := a.cli("session", "create", "faulty")
	const backlog = 8
	for i := range backlog {
		if _, err := a.api().SendSignal(context.Background(), "faulty", sess,
			apiclient.Signal{Message: fmt.Sprintf("nap %d", 150+i)}); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "A's first commits", time.Minute, func() bool { return len(a.transcript("faulty", sess)) >= 2 })
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	srvB := startServer(t, cfgB, addrB)
	waitUntil(t, "B to drain the backlog", 2*time.Minute, func() bool { return len(srvB.transcript("faulty", sess)) >= backlog })
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "A to drop its controller", time.Minute, func() bool { return controllers(t, a.addr) == 0 })
	turns := srvB.transcript("faulty", sess)
	evs := srvB.events("faulty", sess)
	if len(turns) != backlog || len(evs) != backlog {
		t.Fatalf("%d turns of %d events, want %d of %d", len(turns), len(evs), backlog, backlog)
	}
	for i, ev := range evs {
		if ev.Status != "done" || turns[i].EventID != ev.ID {
			t.Errorf("event %d is %s; turn %d is of event %d", ev.ID, ev.Status, i+1, turns[i].EventID)
		}
		if want := fmt.Sprintf("napped %d ms", 150+i); turns[i].Messages[len(turns[i].Messages)-1].Content != want {
			t.Errorf("turn %d replied %q, want %q", i+1, turns[i].Messages[len(turns[i].Messages)-1].Content, want)
		}
	}
}
