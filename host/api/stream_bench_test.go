package api_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/api"
	"github.com/paddock-dev/paddock/host/runner"
	"github.com/paddock-dev/paddock/host/stream"
	"github.com/paddock-dev/paddock/host/stream/streamtest"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/sqlite"
	"github.com/paddock-dev/paddock/wasm"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// BenchmarkIdleSubscribers opens 1,000 idle SSE subscribers of the stream
// route (of one session, and of 1,000 sessions) over real TCP connections
// and reports what each costs the process: bytes (runtime.MemStats
// HeapAlloc + StackInuse after GC, delta / N) and goroutines. The client ends are raw
// connections that sent their request and read the response headers, with
// no goroutine of their own, so nearly all of it is the server's: the
// connection's handler goroutine with its buffers, net/http's background
// read, the subscription, and (one per watched session) the hub's reader.
func BenchmarkIdleSubscribers(b *testing.B) {
	for _, sessions := range []int{1, 1000} {
		b.Run(fmt.Sprintf("sessions=%d", sessions), func(b *testing.B) { benchIdle(b, 1000, sessions) })
	}
}

func benchIdle(b *testing.B, n, sessions int) {
	ctx := context.Background()
	quiet := slog.New(slog.DiscardHandler)
	st, err := sqlite.Open(ctx, filepath.Join(b.TempDir(), "p.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	rt, err := wasm.New(ctx, wasm.Config{CacheDir: wasmtest.CacheDir(b), MemoryLimitPages: 1024, TurnTimeout: time.Minute}, quiet)
	if err != nil {
		b.Fatal(err)
	}
	defer rt.Close(ctx)
	hub := stream.New(stream.Options{Store: st, Logger: quiet})
	defer hub.Close()
	h, err := host.New(host.Options{Store: st, Runner: runner.NewWasm(rt, st), Policy: host.DefaultPolicy(), Logger: quiet, StreamNotify: hub.Poke})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(api.New(api.Options{Host: h, Stream: hub, MaxBodyBytes: 1 << 20, MaxModuleBytes: 1 << 20, Logger: quiet}))
	defer srv.Close()
	w := streamtest.NewAgent(b, st, "notes")
	keys := make([]store.ActorKey, sessions)
	for i := range keys {
		keys[i] = w.Session()
		w.Start(keys[i], "hi").Commit("hello") // a little history: turn.started, turn.committed
	}
	addr := strings.TrimPrefix(srv.URL, "http://")
	var bytesPer, goroutinesPer float64
	rounds := 0
	for b.Loop() {
		before, g0 := heap(), goruntime.NumGoroutine()
		conns := make([]net.Conn, n)
		for i := range conns {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				b.Fatal(err)
			}
			conns[i] = c
			// Resume at the head: an idle subscriber with nothing to read.
			fmt.Fprintf(c, "GET /v1/agents/notes/sessions/%s/stream HTTP/1.1\r\nHost: x\r\nLast-Event-ID: 2\r\n\r\n", keys[i%sessions].SessionID)
			resp, err := http.ReadResponse(bufio.NewReader(io.LimitReader(c, 4096)), nil)
			if err != nil || resp.StatusCode != 200 {
				b.Fatalf("subscriber %d: %v %v", i, resp, err)
			}
		}
		for hub.Subscribers() != n {
			time.Sleep(time.Millisecond)
		}
		after, g1 := heap(), goruntime.NumGoroutine()
		bytesPer += float64(after-before) / float64(n)
		goroutinesPer += float64(g1-g0) / float64(n)
		rounds++
		for _, c := range conns {
			c.Close()
		}
		for hub.Subscribers() != 0 {
			time.Sleep(time.Millisecond)
		}
	}
	b.ReportMetric(bytesPer/float64(rounds), "bytes/subscriber")
	b.ReportMetric(goroutinesPer/float64(rounds), "goroutines/subscriber")
}

// heap returns the live heap plus the goroutine stacks in use, after a
// collection.
func heap() int64 {
	goruntime.GC()
	var m goruntime.MemStats
	goruntime.ReadMemStats(&m)
	return int64(m.HeapAlloc + m.StackInuse)
}
