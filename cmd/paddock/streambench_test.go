package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	hostconfig "github.com/paddock-dev/paddock/host/config"
	"github.com/paddock-dev/paddock/store/pgtest"
)

// procRSSKiB is a process's resident set in KiB (from /proc).
func procRSSKiB(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			var n float64
			fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), &n)
			return n
		}
	}
	return -1
}

// TestStreamBenchFigures is the stream benchmark behind `make
// bench-stream`, skipped unless STREAMBENCH is set: it measures,
// asserts no timing. Two `paddock serve` processes on one PostgreSQL
// (DATABASE_URL, or a throwaway cluster); host A runs the turns of S
// sessions (hcagent's emit command: N json chunks {"t": unix ns at the
// emit, "i": i}, one every INTERVAL ms — a token stream); each session has
// one SSE client on A (same host) and one on B (another host, which sees
// A's frames by polling stream heads). It reports the chunk latency emit →
// SSE client (same machine, one clock) p50/p99 for both, over the chunks
// emitted once every client was following, and the chunk frames the store
// holds per 1,000 tokens (store writes of the stream per 1,000 tokens).
//
// Then K idle subscribers (clients following quiet sessions from their
// head) on one host: RSS and goroutines each, connection included.
//
// Environment: STREAMBENCH_SESSIONS (8), _TOKENS per session (1000),
// _INTERVAL_MS between tokens (20, i.e. 50 tokens/s per session), _IDLE
// (1000 idle subscribers), _STORE=sqlite (one host on SQLite: same-host
// figures only).
func TestStreamBenchFigures(t *testing.T) {
	if os.Getenv("STREAMBENCH") == "" {
		t.Skip("a benchmark: make bench-stream (STREAMBENCH=1)")
	}
	envInt := func(k string, def int) int {
		if v, err := strconv.Atoi(os.Getenv(k)); err == nil && v > 0 {
			return v
		}
		return def
	}
	sessions := envInt("STREAMBENCH_SESSIONS", 8)
	ntok := envInt("STREAMBENCH_TOKENS", 1000)
	interval := envInt("STREAMBENCH_INTERVAL_MS", 20)

	sqlite := os.Getenv("STREAMBENCH_STORE") == "sqlite"
	dsn := ""
	if !sqlite {
		dsn = pgtest.DSN(t)
	}
	model := newModelServer(t, func(int, map[string]any, http.ResponseWriter, *http.Request) {})
	dir := t.TempDir()
	addrA, addrB := freePort(t), freePort(t)
	config := func(addr string) string {
		cfg := hcConfig(t, dir, addr, dsn, model.URL, "", nil, "")
		if sqlite {
			raw, err := os.ReadFile(cfg)
			if err != nil {
				t.Fatal(err)
			}
			out := strings.Replace(string(raw), "  driver: postgres\n  dsn: \"\"\n", "  driver: sqlite\n", 1)
			if err := os.WriteFile(cfg, []byte(out), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return cfg
	}
	a := startServer(t, config(addrA), addrA)
	ids := make([]string, sessions)
	for i := range ids {
		ids[i] = a.cli("session", "create", "hc")
	}

	type sample struct{ emit, recv int64 }
	var mu sync.Mutex
	lat := map[string][]sample{}
	heads := map[string]string{}               // session → the id of its turn.committed
	chunkFrames := map[string]map[int64]bool{} // session → seqs of its chunk frames
	var wg sync.WaitGroup
	var connected sync.WaitGroup
	follow := func(side, addr, sess string) {
		defer wg.Done()
		c := openStream(t, addr, "hc", sess, "")
		defer c.close()
		connected.Done()
		deadline := time.AfterFunc(5*time.Minute, c.close)
		defer deadline.Stop()
		var mine []sample
		for {
			ev, err := c.next()
			now := time.Now().UnixNano()
			if err != nil {
				t.Errorf("%s stream of %s: %v", side, sess, err)
				break
			}
			if ev.Event == "turn.committed" {
				mu.Lock()
				heads[sess] = ev.ID
				mu.Unlock()
				break
			}
			if ev.Event != "chunk" {
				continue
			}
			if side == "same host" {
				mu.Lock()
				if chunkFrames[sess] == nil {
					chunkFrames[sess] = map[int64]bool{}
				}
				chunkFrames[sess][parseStreamID(t, ev.ID).seq] = true
				mu.Unlock()
			}
			var ch struct {
				Data struct{ T int64 } `json:"data"`
			}
			if err := json.Unmarshal([]byte(ev.Data), &ch); err != nil {
				t.Errorf("chunk %s: %v", ev.Data, err)
				break
			}
			mine = append(mine, sample{ch.Data.T, now})
		}
		mu.Lock()
		lat[side] = append(lat[side], mine...)
		mu.Unlock()
	}
	// The same-host clients first; the turns start on A, the only host.
	connected.Add(sessions)
	for _, s := range ids {
		wg.Add(1)
		go follow("same host", addrA, s)
	}
	connected.Wait()
	msg := fmt.Sprintf(`{"emit":{"n":%d,"interval_ms":%d}}`, ntok, interval)
	for _, s := range ids {
		a.cli("signal", "send", "hc", s, msg)
	}
	sides := []string{"same host"}
	b := a
	if !sqlite {
		b = startServer(t, config(addrB), addrB)
		sides = append(sides, "other host")
		connected.Add(sessions)
		for _, s := range ids {
			wg.Add(1)
			go follow("other host", b.addr, s)
		}
		connected.Wait()
	}
	// Measure chunks emitted from a second after every client follows (the
	// other host's clients first catch up with what came before).
	from := time.Now().Add(time.Second).UnixNano()
	wg.Wait()
	for _, s := range ids {
		if ts := a.transcript("hc", s); len(ts) != 1 {
			t.Fatalf("session %s: %d turns, want 1", s, len(ts))
		}
	}

	store := "PostgreSQL"
	if sqlite {
		store = "SQLite"
	}
	for _, side := range sides {
		var ds []time.Duration
		for _, s := range lat[side] {
			if s.emit >= from {
				ds = append(ds, time.Duration(s.recv-s.emit))
			}
		}
		if len(ds) == 0 {
			t.Fatalf("%s: no chunk emitted after every client followed (make the turns longer)", side)
		}
		slices.Sort(ds)
		p := func(q float64) time.Duration { return ds[min(len(ds)-1, int(q*float64(len(ds))))] }
		figure(t, "stream bench: chunk latency emit → SSE client on the %s: p50 %.1f ms, p99 %.1f ms, max %.1f ms (%d chunks; %d sessions × %d tokens at %d tokens/s each; %s; flush_interval %v, poll_interval %v)",
			side, ms(p(0.5)), ms(p(0.99)), ms(ds[len(ds)-1]), len(ds), sessions, ntok, 1000/interval, store,
			hostconfig.Default().Stream.FlushInterval, hostconfig.Default().Stream.PollInterval)
	}

	total := int64(sessions * ntok)
	var nframes int
	for _, seqs := range chunkFrames {
		nframes += len(seqs)
	}
	figure(t, "stream bench: %.1f chunk frames (store writes) per 1,000 tokens at %d tokens/s (%d frames for %d tokens, %s)",
		float64(nframes)*1000/float64(total), 1000/interval, nframes, total, store)
	if !sqlite {
		// The store agrees: every token stored once, in those frames.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var frames, chunks int64
		if err := conn.QueryRow(ctx, `SELECT count(*), coalesce(sum(jsonb_array_length(body::jsonb->'chunks')), 0) FROM stream_frames WHERE kind = 'chunk'`).Scan(&frames, &chunks); err != nil {
			t.Fatal(err)
		}
		if chunks != total || frames != int64(nframes) {
			t.Errorf("the store holds %d chunks in %d frames; the clients saw %d tokens in %d frames", chunks, frames, total, nframes)
		}
	}

	// Idle subscribers of the other host, over real connections: its RSS
	// and goroutines before and after K clients follow quiet sessions from
	// their head (nothing to replay).
	k := envInt("STREAMBENCH_IDLE", 1000)
	// (The process's heap gauges move with its GC cycles, which the test
	// cannot force: RSS and goroutines only. BenchmarkIdleSubscribers in
	// host/api measures the heap after a forced GC.)
	settle := func() (rss, gor float64) {
		time.Sleep(2 * time.Second)
		return procRSSKiB(b.cmd.Process.Pid), metric(b.addr, "go_goroutines")
	}
	rss0, g0 := settle()
	conns := make([]*sseConn, 0, k)
	for i := range k {
		s := ids[i%len(ids)]
		conns = append(conns, openStream(t, b.addr, "hc", s, heads[s]))
	}
	waitUntil(t, "the idle clients to be counted", time.Minute, func() bool { return metric(b.addr, "paddock_stream_subscribers") >= float64(k) })
	rss1, g1 := settle()
	for _, c := range conns {
		c.close()
	}
	figure(t, "stream bench: idle subscribers over HTTP on one host: %.1f KiB RSS and %.1f goroutines each, connection included (%d clients on %d sessions; process RSS %.0f → %.0f MiB)",
		(rss1-rss0)/float64(k), (g1-g0)/float64(k), k, len(ids), rss0/1024, rss1/1024)
}
