package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/postgres"
	"github.com/paddock-dev/paddock/store/storetest"
)

// benchTurn runs one turn on a claimed activation: NextDelivery (marked
// sent) then CommitTurn with one reply message and a new state.
func benchTurn(ctx context.Context, s *postgres.Store, a store.Activation, state []byte) error {
	d, err := s.NextDelivery(ctx, store.NextDeliveryParams{Activation: a.Ref(), DeliveryID: uuid.NewString(),
		Binding: "sha256:bench", MarkSent: true, TailMessages: 8})
	if err != nil {
		return fmt.Errorf("NextDelivery: %w", err)
	}
	_, err = s.CommitTurn(ctx, store.CommitTurnParams{Ref: d.Delivery.TurnRef(), State: state,
		Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "reply"}}, Outcome: abi.OutcomeOK})
	if err != nil {
		return fmt.Errorf("CommitTurn: %w", err)
	}
	return nil
}

// benchSession creates a session with n open events and claims it.
func benchSession(b *testing.B, f *fixture, agentUID string, n int) store.Activation {
	b.Helper()
	f.key = f.session(agentUID)
	for i := range n {
		f.append(fmt.Sprintf("message %d", i))
	}
	return f.claim(time.Hour)
}

// BenchmarkCommitTurn measures one turn (NextDelivery + CommitTurn, two
// transactions) on one session whose activation was claimed once. Each
// iteration's event is appended with the timer stopped, so the session has
// one open event at a time, as an interactive session does.
func BenchmarkCommitTurn(b *testing.B) {
	f := newFixture(b)
	agent, err := f.s.GetAgent(f.ctx, store.DefaultNamespace, "agent")
	must(b, err, "GetAgent")
	a := benchSession(b, f, agent.UID, 0)
	state := make([]byte, 256)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		f.append(fmt.Sprintf("message %d", i))
		b.StartTimer()
		if err := benchTurn(f.ctx, f.s, a, state); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "turns/s")
}

// BenchmarkCommitTurnParallel runs turns on many sessions at once (one
// session per goroutine, about 16 goroutines), to show throughput when turns
// contend for the pool and the server rather than for rows.
func BenchmarkCommitTurnParallel(b *testing.B) {
	f := newFixture(b)
	agent, err := f.s.GetAgent(f.ctx, store.DefaultNamespace, "agent")
	must(b, err, "GetAgent")
	// RunParallel starts parallelism*GOMAXPROCS goroutines: about 16,
	// each with a session of its own.
	procs := runtime.GOMAXPROCS(0)
	parallelism := max(1, (16+procs-1)/procs)
	sessions := parallelism * procs
	per := 2*b.N/sessions + 1
	acts := make([]store.Activation, sessions)
	keys := make([]store.ActorKey, sessions)
	for i := range acts {
		acts[i] = benchSession(b, f, agent.UID, per)
		keys[i] = f.key
	}
	var next atomic.Int64
	state := make([]byte, 256)
	b.SetParallelism(parallelism)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(next.Add(1) - 1)
		a := acts[i]
		for pb.Next() {
			err := benchTurn(f.ctx, f.s, a, state)
			var nd *store.NoDueEventError
			if errors.As(err, &nd) {
				// pb.Next hands out work unevenly: top this session up.
				_, _, err = f.s.AppendEvent(f.ctx, store.AppendEventParams{Key: keys[i], Kind: abi.EventMessage,
					Payload: []byte(`{"message": "more"}`)})
				if err == nil {
					err = benchTurn(f.ctx, f.s, a, state)
				}
			}
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "turns/s")
}

// BenchmarkClaimActivation: the claim of an idle-stopped session's
// activation (storetest.BenchClaimActivation, shared with sqlite).
func BenchmarkClaimActivation(b *testing.B) { storetest.BenchClaimActivation(b, newStore(b)) }

// BenchmarkNextDelivery: the dispatch of a session's next event,
// NextDelivery + MarkDeliverySent (storetest.BenchNextDelivery, shared
// with sqlite).
func BenchmarkNextDelivery(b *testing.B) { storetest.BenchNextDelivery(b, newStore(b)) }

// BenchmarkFireDueAlarms: a burst of 1,000 alarms due at one instant fired
// by three concurrent callers (storetest.BenchFireDueAlarms, shared with
// sqlite).
func BenchmarkFireDueAlarms(b *testing.B) { storetest.BenchFireDueAlarms(b, newStore(b)) }

// BenchmarkAppendEventParallel: signals' acceptance under load, 8 or 64
// concurrent callers appending to 1,000 sessions (each append to the next
// session), each returning once its event is durable; the group commit's
// acceptance lane sends them in batches (setappend.go).
func BenchmarkAppendEventParallel(b *testing.B) {
	for _, callers := range []int{8, 64} {
		b.Run(fmt.Sprint("callers=", callers), func(b *testing.B) { benchAppends(b, callers) })
	}
}

func benchAppends(b *testing.B, callers int) {
	f := newFixture(b)
	agent, err := f.s.GetAgent(f.ctx, store.DefaultNamespace, "agent")
	must(b, err, "GetAgent")
	const sessions = 1000
	keys := make([]store.ActorKey, sessions)
	for i := range keys {
		keys[i] = f.session(agent.UID)
	}
	var next atomic.Int64
	b.SetParallelism(max(1, callers/runtime.GOMAXPROCS(0)))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			key := keys[int(next.Add(1))%sessions]
			if _, _, err := f.s.AppendEvent(f.ctx, store.AppendEventParams{Key: key, Kind: abi.EventMessage,
				Payload: []byte(`{"message":"hello"}`)}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "appends/s")
}
