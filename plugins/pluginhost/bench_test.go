package pluginhost_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/plugins/pluginhost"
	"github.com/paddock-dev/paddock/plugins/plugintest"
)

// benchPlugin registers the test agent plugin under name with n processes
// on a new Manager (closed with b), starts all n processes and returns an
// instance with the processes' pids.
func benchPlugin(b *testing.B, name string, n int) (*pluginhost.Instance, *pluginhost.Manager, []int) {
	b.Helper()
	m := pluginhost.NewManager(slog.New(slog.NewTextHandler(io.Discard, nil)), pluginhost.Options{})
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := m.Close(ctx); err != nil {
			b.Errorf("close: %v", err)
		}
	})
	path, sum := plugintest.Build(b, agentPkg)
	if err := m.Register(context.Background(), pluginhost.Config{Name: name, Path: path, SHA256: sum, Processes: n}); err != nil {
		b.Fatalf("register %s: %v", name, err)
	}
	inst, err := m.Instance(context.Background(), name, "")
	if err != nil {
		b.Fatal(err)
	}
	// n overlapping turns: a busy process makes the next turn start
	// another, up to n.
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			res, err := inst.Turn(context.Background(), request("sleep 300", int64(i+1), nil))
			if err != nil || res.Outcome != abi.OutcomeOK {
				b.Errorf("warm-up turn: %v %+v", err, res)
			}
		})
	}
	wg.Wait()
	pids := benchPIDs(b, m, name)
	if len(pids) != n {
		b.Fatalf("%d processes started for %d overlapping turns, want %d", len(pids), n, n)
	}
	return inst, m, pids
}

func benchPIDs(b *testing.B, m *pluginhost.Manager, name string) []int {
	b.Helper()
	st, err := m.Status(name)
	if err != nil {
		b.Fatal(err)
	}
	var pids []int
	for _, p := range st.Processes {
		if !p.Retired {
			pids = append(pids, p.PID)
		}
	}
	slices.Sort(pids)
	return pids
}

// echoTurn runs "echo <n>" as event n and checks that the reply is
// "echo: <n>" and echoes the request's turn_ref.
func echoTurn(inst *pluginhost.Instance, n int64) error {
	arg := strconv.FormatInt(n, 10)
	req := request("echo "+arg, n, nil)
	res, err := inst.Turn(context.Background(), req)
	if err != nil {
		return err
	}
	if res.Outcome != abi.OutcomeOK || len(res.Messages) != 1 || res.Messages[0].Content != "echo: "+arg ||
		res.TurnRef != req.TurnRef {
		return fmt.Errorf("result %+v, want one message %q echoing %s", res, "echo: "+arg, req.TurnRef)
	}
	return nil
}

// BenchmarkTurnRoundTrip is one trivial turn ("echo n", answered without
// work) through a real plugin process: request encoding, the gRPC stream
// over go-plugin's unix socket, the plugin SDK, the result checks.
// ns/op and allocs/op are the host side's (the plugin is another process).
//
//	serial:       one turn at a time on one process
//	parallel/N:   N processes, 2N goroutines (RunParallel) turning at
//	              once; latency-µs is the mean latency of one turn
//
// After each run the same processes must still be serving (no restart
// hidden in the figures).
//
//	go test -run '^$' -bench TurnRoundTrip -benchmem ./plugins/
func BenchmarkTurnRoundTrip(b *testing.B) {
	b.Run("serial", func(b *testing.B) {
		inst, m, pids := benchPlugin(b, "bench-serial", 1)
		var n int64
		b.ReportAllocs()
		for b.Loop() {
			n++
			if err := echoTurn(inst, n); err != nil {
				b.Fatalf("turn %d: %v", n, err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "turns/s")
		if got := benchPIDs(b, m, "bench-serial"); !slices.Equal(got, pids) {
			b.Fatalf("processes %v after the run, were %v", got, pids)
		}
	})
	for _, procs := range []int{2, 4} {
		b.Run("parallel/"+strconv.Itoa(procs), func(b *testing.B) {
			name := "bench-parallel-" + strconv.Itoa(procs)
			inst, m, pids := benchPlugin(b, name, procs)
			var n, latency atomic.Int64
			b.SetParallelism(max(1, 2*procs/runtime.GOMAXPROCS(0)))
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := n.Add(1)
					start := time.Now()
					if err := echoTurn(inst, i); err != nil {
						b.Errorf("turn %d: %v", i, err)
						return
					}
					latency.Add(int64(time.Since(start)))
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "turns/s")
			b.ReportMetric(float64(latency.Load())/float64(b.N)/1e3, "latency-µs")
			if got := benchPIDs(b, m, name); !slices.Equal(got, pids) {
				b.Fatalf("processes %v after the run, were %v", got, pids)
			}
		})
	}
}
