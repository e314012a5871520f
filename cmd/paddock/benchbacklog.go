package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime/pprof"
	"slices"
	"sync"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/examples/hasher"
	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/store"
)

// backlogRun is `paddock bench --backlog B`: the cost of a turn when B
// events wait behind it (issue: "the cost of a turn must not depend on how
// many events wait behind it"). With the host stopped, every one of the K
// sessions is given B open events (untimed, P producers); then the host
// starts and drains them, and the figure is the rate of the first N turns
// measured from the first commit (so that the module's compilation and the
// activations' claims stay out of it): turns/s with B open events per
// session. N < B·K, so the backlog is still there at the end of the
// measurement (B − N/K events per session).
type backlogRun struct {
	o     benchOptions
	st    store.Store
	h     *host.Host
	sink  *benchSink
	keys  []store.ActorKey
	start func() // starts the host
	rt    *roundTrips
	log   func(string, ...any)
	// agentFlag names the flag that chose the agent (checkAnswers).
	agentFlag string
}

// run preloads the backlog, starts the host and measures the drain; it
// fills res's rate, wall time and per-turn round trips.
func (b *backlogRun) run(ctx context.Context, res *BenchResult) error {
	o := b.o
	b.log("backlog: appending %d open events to each of %d sessions (host stopped, untimed)", o.backlog, o.keys)
	var wg sync.WaitGroup
	errs := make([]error, o.producers)
	jobs := make([][]benchJob, o.producers)
	for p := range o.producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := p; k < o.keys; k += o.producers {
				for seq := range o.backlog {
					data, _ := json.Marshal(hasher.Job{Idx: seq*o.keys + k, Key: benchKeyName(k), Seq: seq, T: time.Now().UnixNano()})
					payload, err := abi.Marshal(struct {
						Data json.RawMessage `json:"data"`
					}{data})
					var e store.Event
					if err == nil {
						e, _, err = b.st.AppendEvent(ctx, store.AppendEventParams{Key: b.keys[k], Kind: abi.EventMessage, Payload: payload})
					}
					if err != nil {
						errs[p] = fmt.Errorf("backlog append: %w", failing(ctx, err))
						return
					}
					jobs[p] = append(jobs[p], benchJob{id: e.ID, key: benchKeyName(k), seq: seq})
				}
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	b.log("backlog: starting the host; measuring the first %d turns", o.n)
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return err
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	rt0, xact0 := b.rt.n.Load(), b.rt.xacts.Load()
	b.start()
	for _, k := range b.keys {
		b.h.Ensure(k)
	}
	// The first commit starts the clock; N more end it.
	for b.sink.count.Load() < int64(o.n)+1 {
		select {
		case <-ctx.Done():
			return fmt.Errorf("backlog: %d of %d turns committed: %w", b.sink.count.Load(), o.n+1, failing(ctx, ctx.Err()))
		case <-time.After(10 * time.Millisecond):
		}
	}
	done := b.sink.count.Load()
	// The drained turns (the rest of the backlog stays open) answered
	// their jobs.
	if err := b.sink.checkAnswers(b.sink.committedJobs(slices.Concat(jobs...)), b.agentFlag); err != nil {
		return err
	}
	b.sink.mu.Lock()
	times := make([]time.Time, 0, len(b.sink.committed))
	for _, t := range b.sink.committed {
		times = append(times, t)
	}
	b.sink.mu.Unlock()
	slices.SortFunc(times, func(x, y time.Time) int { return x.Compare(y) })
	wall := times[o.n].Sub(times[0])
	res.Mode = fmt.Sprintf("backlog=%d", o.backlog)
	res.ColdStartP50MS, res.ColdStartP99MS = -1, -1 // the drain is timed from its first commit, after the claims
	res.Completed = o.n
	res.WallS = round3(wall.Seconds())
	res.JobsPerS = float64(o.n) / wall.Seconds()
	res.JobsPerS = float64(int(res.JobsPerS + 0.5))
	if res.RoundTrips >= 0 {
		res.RoundTrips = round3(float64(b.rt.n.Load()-rt0) / float64(done))
		res.Transactions = round3(float64(b.rt.xacts.Load()-xact0) / float64(done))
	}
	return nil
}
