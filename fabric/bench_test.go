package fabric

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/fabric/worker"
	"github.com/paddock-dev/paddock/wasm"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// benchTurn runs message as a turn of session on binding and checks the
// reply: the faulty agent answers "ok: <message>", echoing the turn_ref.
func (e *env) benchTurn(binding, session, message string) error {
	req := e.request(session, message)
	res, err := e.turn(binding, req)
	if err != nil {
		return err
	}
	if want := "ok: " + message; res.Outcome != "ok" || len(res.Messages) != 1 || res.Messages[0].Content != want ||
		res.TurnRef != req.TurnRef {
		return fmt.Errorf("result %+v, want one message %q echoing %s", res, want, req.TurnRef)
	}
	return nil
}

// BenchmarkTurnRoundTrip is one trivial turn of the faulty agent (any
// other message is answered "ok: <message>") through a real broker and
// real workers over ZeroMQ on loopback, bound through the guard transport
// as paddock serve binds: request encoding and sealing, TURN, ACCEPTED,
// RESULT, the worker's warm instance. The workers run in this process, so
// allocs/op counts both ends.
//
//	serial/wasm     one turn at a time, the wasm module (warm instance)
//	serial/plugin   one turn at a time, the same agent as a plugin process
//	                on the worker's machine
//	parallel/wasm/1-worker, parallel/wasm/2-workers
//	                GOMAXPROCS×2 sessions turning at once on one worker,
//	                then spread over two (the broker keeps no session
//	                affinity: a session's turns alternate between them);
//	                latency-µs is the mean latency of one turn
//
// msgs/turn is the broker's messages per turn, both directions, heartbeats
// included. The broker must end without a BUSY, a lost receipt, a late
// result or a failed send.
//
//	go test -run '^$' -bench TurnRoundTrip -benchmem ./fabric/
func BenchmarkTurnRoundTrip(b *testing.B) {
	e := newEnv(b, withGuard)
	digest := e.module(wasmtest.Faulty)
	// Compile into the workers' compilation cache first, without a
	// deadline: a cold compile under -race can outlast a turn's.
	_, body := wasmtest.BuildExample(b, wasmtest.Faulty)
	rt, err := wasm.New(context.Background(), wasm.Config{CacheDir: wasmtest.CacheDir(b)}, nil)
	if err == nil {
		_, err = rt.Validate(context.Background(), body)
		rt.Close(context.Background())
	}
	if err != nil {
		b.Fatalf("compile the faulty module: %v", err)
	}
	pc, pbinding := e.plugin("faulty", "./examples/faulty/plugin")
	goroutines := 2 * runtime.GOMAXPROCS(0)
	tweak := func(c *worker.Config) {
		c.Capacity = 2 * goroutines // never BUSY, even while a slot's release is on its way
		c.Plugins = append(c.Plugins, pc)
	}
	e.startWorker("w1", tweak)
	warm := func(b *testing.B, binding, session string) {
		for i := range 4 { // fetch, instantiate; an instance on each worker
			if err := e.benchTurn(binding, session, fmt.Sprint("warm ", i)); err != nil {
				b.Fatal(err)
			}
		}
	}
	serial := func(binding string) func(b *testing.B) {
		return func(b *testing.B) {
			warm(b, binding, "serial")
			before := e.b.Stats()
			b.ReportAllocs()
			var n int
			for b.Loop() {
				n++
				if err := e.benchTurn(binding, "serial", fmt.Sprint("hello ", n)); err != nil {
					b.Fatalf("turn %d: %v", n, err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "turns/s")
			e.msgsPerTurn(b, before)
		}
	}
	b.Run("serial/wasm", serial(digest))
	b.Run("serial/plugin", serial(pbinding))

	parallel := func(b *testing.B) {
		for i := range goroutines {
			warm(b, digest, fmt.Sprint("parallel-", i))
		}
		before := e.b.Stats()
		var session, n, latency atomic.Int64
		b.SetParallelism(2)
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			s := fmt.Sprint("parallel-", session.Add(1)-1)
			for pb.Next() {
				msg := fmt.Sprint("hello ", n.Add(1))
				start := time.Now()
				if err := e.benchTurn(digest, s, msg); err != nil {
					b.Errorf("%s: %v", s, err)
					return
				}
				latency.Add(int64(time.Since(start)))
			}
		})
		b.StopTimer()
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "turns/s")
		b.ReportMetric(float64(latency.Load())/float64(b.N)/1e3, "latency-µs")
		e.msgsPerTurn(b, before)
	}
	b.Run("parallel/wasm/1-worker", parallel)
	e.startWorker("w2", tweak)
	b.Run("parallel/wasm/2-workers", parallel)

	if st := e.b.Stats(); st.Busy+st.AcceptTimeouts+st.LateResults+st.SendStalls+st.SendQueueFull+st.SendExpired+st.SendFailed != 0 {
		b.Fatalf("broker stats %+v: a turn met a busy worker, a lost receipt, a late result or a failed send", st)
	}
}

// msgsPerTurn reports the broker's messages (both directions, heartbeats
// included) per turn dispatched since before.
func (e *env) msgsPerTurn(b *testing.B, before Stats) {
	st := e.b.Stats()
	if turns := st.Turns - before.Turns; turns > 0 {
		msgs := st.MessagesIn + st.MessagesOut - before.MessagesIn - before.MessagesOut
		b.ReportMetric(float64(msgs)/float64(turns), "msgs/turn")
	}
}
