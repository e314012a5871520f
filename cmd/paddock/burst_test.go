package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paddock-dev/paddock/store/pgtest"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// burstSize is the burst test's shape: the small default runs in `go test`;
// `make burst` sets the full size (BURST_SESSIONS=3000, BURST_CAPACITY=64,
// BURST_IDLE=30s, BURST_PENDING=60s: the example config's values).
type burstSize struct {
	sessions, capacity int
	idle, pending      time.Duration
}

func burstFromEnv(t *testing.T) burstSize {
	t.Helper()
	b := burstSize{sessions: 600, capacity: 8, idle: 5 * time.Second, pending: 2 * time.Second}
	if v := os.Getenv("BURST_SESSIONS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("BURST_SESSIONS: %v", err)
		}
		b.sessions = n
	}
	if v := os.Getenv("BURST_CAPACITY"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("BURST_CAPACITY: %v", err)
		}
		b.capacity = n
	}
	for env, d := range map[string]*time.Duration{"BURST_IDLE": &b.idle, "BURST_PENDING": &b.pending} {
		if v := os.Getenv(env); v != "" {
			x, err := time.ParseDuration(v)
			if err != nil {
				t.Fatalf("%s: %v", env, err)
			}
			*d = x
		}
	}
	return b
}

// post POSTs a JSON body and decodes the JSON answer into out.
func post(client *http.Client, url string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	resp, err := client.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("POST %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// TestBurstAgainstACapacityPoolStrandsNoEvent is docs/DESIGN.md invariant 11 end
// to end: two `paddock serve` processes on one PostgreSQL, a capacity pool
// far smaller than the burst, and one signal to each of many new notes
// sessions, sent half to each host. With no further client action every
// event must end done: idle activations give their slots to waiting
// sessions, and sessions put to sleep for capacity run when a slot frees,
// on either host. It reports the time to drain and the stranded count.
func TestBurstAgainstACapacityPoolStrandsNoEvent(t *testing.T) {
	t.Parallel()
	size := burstFromEnv(t)
	dsn := pgtest.DSN(t)
	notes, _ := wasmtest.BuildExample(t, wasmtest.Notes)
	dir := t.TempDir()
	var servers []*server
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
  idle_timeout: %s
  restart_pending_timeout: %s
pools:
  default:
    capacity: %d
agents:
  - name: notes
    module_file: %s
`, addr, filepath.Join(dir, fmt.Sprint("data", i)), e2eCacheDir(t), dsn, size.idle, size.pending, size.capacity, notes)
		p := filepath.Join(dir, fmt.Sprintf("host%d.yaml", i))
		if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		servers = append(servers, startServer(t, p, addr))
	}

	ctx := context.Background()
	db, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	count := func(q string) int {
		var n int
		if err := db.QueryRow(ctx, q).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// The burst: create and signal from 16 clients, alternating hosts.
	client := &http.Client{Timeout: time.Minute}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 16 {
		wg.Go(func() {
			for i := w; i < size.sessions; i += 16 {
				base := "http://" + servers[i%2].addr + "/v1/agents/notes/sessions"
				var s struct {
					SessionID string `json:"session_id"`
				}
				if err := post(client, base, map[string]any{}, &s); err != nil {
					errs <- err
					return
				}
				var ev struct {
					EventID int64 `json:"event_id"`
				}
				if err := post(client, base+"/"+s.SessionID+"/signals", map[string]any{"kind": "message", "message": fmt.Sprintf("note burst %d", i)}, &ev); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	sent := time.Since(start)

	// Drain: wait while events keep closing; give up after a long stall
	// (well past the idle and pending timeouts), then count what is left.
	const openQ = `SELECT count(*) FROM actor_events WHERE status = 'open'`
	open, last, lastChange := count(openQ), -1, time.Now()
	stall := 2*(size.idle+size.pending) + time.Minute
	for open > 0 && time.Since(lastChange) < stall {
		time.Sleep(200 * time.Millisecond)
		if open != last {
			last, lastChange = open, time.Now()
		}
		open = count(openQ)
	}
	drained := time.Since(start)
	if open > 0 {
		drained = lastChange.Sub(start) // the last event that closed
	}
	done := count(`SELECT count(*) FROM actor_events WHERE status = 'done'`)
	// Sessions a second host's pending timeout put to sleep after the first
	// host had run their event: asleep with nothing open, which is fine.
	parked := count(`SELECT count(*) FROM sessions WHERE status = 'sleeping' AND sleep_reason IN ('capacity', 'pending_timeout')`)
	figure(t, "burst: %d notes sessions × 1 signal, 2 hosts, capacity %d each, idle_timeout %s, restart_pending_timeout %s: signals sent in %.1f s, drained %.1f s after the first; done = %d, stranded = %d (left asleep for capacity: %d)",
		size.sessions, size.capacity, size.idle, size.pending, sent.Seconds(), drained.Seconds(), done, open, parked)
	if open != 0 || done != size.sessions {
		t.Fatalf("%d events stranded open, %d done of %d", open, done, size.sessions)
	}
}
