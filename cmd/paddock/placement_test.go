package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	apiclient "github.com/paddock-dev/paddock/host/api/client"
	"github.com/paddock-dev/paddock/store/pgtest"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// TestRemotePoolRunsOnTheHostWithItsWorker runs three hosts on one
// PostgreSQL, each with the same remote pool, and one `paddock worker`
// connected to host 0 only. Signals for sessions of the remote pool are sent
// through hosts 1 and 2: every one must run on host 0 (the only host with a
// live worker of the pool), promptly, and no other host may claim an
// activation for those sessions — before the worker connects, nobody does.
func TestRemotePoolRunsOnTheHostWithItsWorker(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DSN(t)
	notes, _ := wasmtest.BuildExample(t, wasmtest.Notes)
	dir := t.TempDir()
	key := filepath.Join(dir, "w1.key")
	out, err := exec.Command(paddockBin(t), "worker", "keygen").Output()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, out, 0o600); err != nil {
		t.Fatal(err)
	}
	var servers []*server
	var fabrics []string
	for i := range 3 {
		addr, fabricAddr := freePort(t), freePort(t)
		// Default scan interval and lease; a short backoff, so that a host
		// that bounces turns (the bug) retries often.
		cfg := fmt.Sprintf(`listen: %s
data_dir: %s
wasm:
  cache_dir: %s
store:
  driver: postgres
  dsn: %q
pools:
  remote:
    capacity: 8
    remote: true
fabric:
  listen: tcp://%s
  heartbeat_interval: 500ms
  heartbeat_timeout: 2s
  workers:
    - id: w1
      key_file: %s
policy:
  backoff_min: 200ms
  backoff_max: 1s
  turn_timeout: 2m
agents:
  - name: notes-remote
    module_file: %s
    policy:
      pool: remote
`, addr, filepath.Join(dir, fmt.Sprint("data", i)), e2eCacheDir(t), dsn, fabricAddr, key, notes)
		p := filepath.Join(dir, fmt.Sprintf("host%d.yaml", i))
		if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		servers = append(servers, startServer(t, p, addr))
		fabrics = append(fabrics, fabricAddr)
	}
	ctx := context.Background()
	const agent = "notes-remote"
	send := func(s *server, sess, msg string) int64 {
		t.Helper()
		r, err := s.api().SendSignal(ctx, agent, sess, apiclient.Signal{Message: msg})
		if err != nil {
			t.Fatal(err)
		}
		return r.EventID
	}
	// done reports whether every event of sess is done.
	done := func(sess string, n int) bool {
		evs := servers[0].events(agent, sess)
		if len(evs) != n {
			return false
		}
		for _, e := range evs {
			if e.Status != "done" {
				return false
			}
		}
		return true
	}

	// Before any worker: a signal through host 1 waits; no host claims the
	// session, no attempt is consumed.
	early := servers[1].cli("session", "create", agent)
	send(servers[1], early, "note written before the worker came")
	time.Sleep(3 * time.Second) // three scans of every host
	if s := servers[0].session(agent, early); s.ActorEpoch != 0 {
		t.Errorf("with no worker anywhere the session was claimed %d times, want never", s.ActorEpoch)
	}
	if evs := servers[0].events(agent, early); evs[0].Attempts != 0 || evs[0].Status != "open" {
		t.Errorf("with no worker anywhere the event is %+v, want open with no attempt", evs[0])
	}

	// The worker connects to host 0; the waiting signal runs there.
	workerStart := time.Now()
	startWorker(t, fabrics[0], "w1", key)
	waitUntil(t, "the signal sent before the worker came to run", time.Minute, func() bool { return done(early, 1) })
	earlyDone := time.Now()
	earlyAfter := earlyDone.Sub(workerStart)
	admitted := logTime(t, servers[0], `msg="fabric worker admitted"`)
	sinceAdmitted := earlyDone.Sub(admitted)
	claimedAfter := firstClaim(t, dsn, servers[0].session(agent, early)).Sub(admitted)

	// Signals through hosts 1 and 2, one session each per round, several
	// rounds: each runs on host 0 within the bound.
	var sessions []string
	for i := range 4 {
		sessions = append(sessions, servers[1+i%2].cli("session", "create", agent))
	}
	var lat []time.Duration
	for round := range 3 {
		for i, sess := range sessions {
			via := servers[1+i%2]
			sent := time.Now()
			send(via, sess, fmt.Sprintf("note round %d", round))
			waitUntil(t, fmt.Sprintf("round %d signal of session %d to run", round, i), time.Minute, func() bool { return done(sess, round+1) })
			lat = append(lat, time.Since(sent))
		}
	}

	// Every event ran once, on host 0, with an epoch of at most 2 per event.
	for _, sess := range append([]string{early}, sessions...) {
		s := servers[2].session(agent, sess)
		if s.ActorEpoch > 2*s.EventCount {
			t.Errorf("session %s: epoch %d after %d events, want ≤ %d (claims by hosts without a worker?)", sess, s.ActorEpoch, s.EventCount, 2*s.EventCount)
		}
		for _, e := range servers[2].events(agent, sess) {
			if e.Status != "done" || e.Attempts != 0 {
				t.Errorf("session %s event %d: %s after %d failed attempts, want done with none", sess, e.ID, e.Status, e.Attempts)
			}
		}
	}
	holders := activationHosts(t, dsn, servers[0].api(), agent)
	if id := hostID(t, servers[0]); len(holders) != 1 || holders[0] != id {
		t.Errorf("activations of %s held by hosts %v, want only host 0 (%s), the one with the worker", agent, holders, id)
	}

	slices.Sort(lat)
	figure(t, "remote placement: 3 hosts on PostgreSQL, worker on host 0 only, signals through hosts 1 and 2 → done after median %.0f ms, max %.0f ms (%d signals; scan_interval 1s); a signal waiting before the worker came → claimed by host 0 %.0f ms after the worker was admitted, done %.1f s after (%.1f s after the worker process started; its first turn fetches and compiles the module)",
		float64(lat[len(lat)/2].Microseconds())/1000, float64(lat[len(lat)-1].Microseconds())/1000, len(lat),
		float64(claimedAfter.Microseconds())/1000, sinceAdmitted.Seconds(), earlyAfter.Seconds())
}

// activationHosts returns the distinct host ids of every activation ever
// claimed for the agent's sessions.
func activationHosts(t *testing.T, dsn string, api *apiclient.Client, agent string) []string {
	t.Helper()
	ctx := context.Background()
	a, err := api.GetAgent(ctx, agent)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	rows, err := pool.Query(ctx, `SELECT DISTINCT host_id FROM activations WHERE agent_uid = $1 ORDER BY host_id`, a.UID)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		out = append(out, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// firstClaim returns when the session's first activation was claimed.
func firstClaim(t *testing.T, dsn string, s apiclient.Session) time.Time {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var at time.Time
	if err := pool.QueryRow(ctx, `SELECT min(created_at) FROM activations WHERE agent_uid = $1 AND session_id = $2`,
		s.AgentUID, s.SessionID).Scan(&at); err != nil {
		t.Fatal(err)
	}
	return at
}

var hostIDInLog = regexp.MustCompile(`msg="host running" host_id=([0-9a-f-]{36})`)

// hostID reads a server's host id from its "host running" log line.
func hostID(t *testing.T, s *server) string {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	m := hostIDInLog.FindStringSubmatch(s.log.String())
	if m == nil {
		t.Fatalf("no host id in the log:\n%s", s.log.String())
	}
	return m[1]
}

// logTime returns the time of the first line of a server's log that
// contains msg.
func logTime(t *testing.T, s *server, msg string) time.Time {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, line := range strings.Split(s.log.String(), "\n") {
		if !strings.Contains(line, msg) {
			continue
		}
		ts, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
		at, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		return at
	}
	t.Fatalf("no %s in the log:\n%s", msg, s.log.String())
	return time.Time{}
}
