package main

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/store/pgtest"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// figure records a measured figure: logged, and appended to the file named
// by FIGURES_FILE (make test prints it at the end).
func figure(t *testing.T, format string, args ...any) {
	t.Helper()
	line := fmt.Sprintf(format, args...)
	t.Log(line)
	if path := os.Getenv("FIGURES_FILE"); path != "" {
		f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err == nil {
			fmt.Fprintln(f, line)
			f.Close()
		}
	}
}

// controllers reads paddock_controllers from a host's /metrics.
func controllers(t *testing.T, addr string) int {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var n float64
		if _, err := fmt.Sscanf(sc.Text(), "paddock_controllers %g", &n); err == nil {
			return int(n)
		}
	}
	return -1
}

// TestFailoverAfterKillDashNineOfTheOwningHost runs two hosts on one
// PostgreSQL with the DEFAULT lease and scan settings, kills the host that
// runs a session's turn with SIGKILL, and measures how long until the other
// host holds the session and runs the interrupted turn again.
func TestFailoverAfterKillDashNineOfTheOwningHost(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DSN(t)
	faulty, _ := wasmtest.BuildExample(t, wasmtest.Faulty)
	dir := t.TempDir()
	var addrs, cfgs []string
	for i := range 2 {
		addr := freePort(t)
		cfg := fmt.Sprintf(`listen: %s
data_dir: %s
wasm:
  cache_dir: %s
store:
  driver: postgres
  dsn: %q
policy:
  turn_timeout: 2m
agents:
  - name: faulty
    module_file: %s
`, addr, filepath.Join(dir, fmt.Sprint("data", i)), e2eCacheDir(t), dsn, faulty)
		p := filepath.Join(dir, fmt.Sprintf("host%d.yaml", i))
		if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		addrs, cfgs = append(addrs, addr), append(cfgs, p)
	}
	a := startServer(t, cfgs[0], addrs[0])
	b := startServer(t, cfgs[1], addrs[1])
	servers := []*server{a, b}

	sess := a.cli("session", "create", "faulty")
	a.cli("signal", "send", "faulty", sess, "sleep 60000") // a long turn
	a.cli("signal", "send", "faulty", sess, "after")
	// The owner runs the 60 s turn: its controller gauge stays 1 while the
	// other host's stays 0 (a host woken by NOTIFY may hold a controller
	// for a moment, until its claim loses): require it over several samples.
	owner, streak := -1, 0
	waitUntil(t, "a host to run the turn", time.Minute, func() bool {
		a, b := controllers(t, servers[0].addr), controllers(t, servers[1].addr)
		cur := -1
		switch {
		case a == 1 && b == 0:
			cur = 0
		case a == 0 && b == 1:
			cur = 1
		}
		if cur >= 0 && cur == owner {
			streak++
		} else {
			owner, streak = cur, 1
		}
		time.Sleep(100 * time.Millisecond)
		return owner >= 0 && streak >= 5
	})
	survivor := servers[1-owner]
	before := survivor.session("faulty", sess)

	servers[owner].kill9()
	killed := time.Now()
	var moved time.Duration
	waitUntil(t, "the survivor to hold the session", 30*time.Second, func() bool {
		if s := survivor.session("faulty", sess); s.ActorEpoch > before.ActorEpoch && controllers(t, survivor.addr) == 1 {
			moved = time.Since(killed)
			return true
		}
		return false
	})
	evs := survivor.events("faulty", sess)
	if evs[0].Attempts != 1 || evs[0].Status != "open" {
		t.Errorf("the interrupted event: %+v, want open with 1 counted attempt (its lease expired)", evs[0])
	}
	figure(t, "failover: kill -9 of the owning host → session held by the other host after %.1f s (defaults: lease_ttl 8s, scan_interval 1s; goal ≤ 10 s, limit 15 s)", moved.Seconds())
	if moved > 15*time.Second {
		t.Errorf("takeover took %v, limit 15 s", moved)
	}
	// The long turn itself runs again on the survivor; cancel it so the
	// queued event goes on, then both are accounted for exactly once.
	survivor.cli("signal", "cancel", "faulty", sess)
	waitUntil(t, "the queued event to commit on the survivor", 60*time.Second, func() bool {
		ts := survivor.transcript("faulty", sess)
		return len(ts) == 2
	})
	ts := survivor.transcript("faulty", sess)
	if !strings.Contains(ts[1].Messages[len(ts[1].Messages)-1].Content, "after") {
		t.Errorf("second turn: %+v", ts[1])
	}
}
