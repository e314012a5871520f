package sqlite_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/sqlite"
	"github.com/paddock-dev/paddock/store/storetest"
)

// benchSession registers a module, an agent and a session, and claims it.
func benchSession(b *testing.B, s *sqlite.Store, agentUID string) store.Activation {
	b.Helper()
	ctx := context.Background()
	if agentUID == "" {
		data := []byte("\x00asm\x01\x00\x00\x00bench")
		if _, _, err := s.PutModule(ctx, store.PutModuleParams{Digest: "sha256:bench", ABIVersion: abi.Version, Bytes: data}); err != nil {
			b.Fatal(err)
		}
		agentUID = "agent-bench"
		if _, err := s.CreateAgent(ctx, store.CreateAgentParams{UID: agentUID, Name: "bench", ModuleDigest: "sha256:bench", CrashPolicy: store.CrashRestart}); err != nil {
			b.Fatal(err)
		}
	}
	sess, _, err := s.CreateSession(ctx, store.CreateSessionParams{AgentUID: agentUID, SessionID: uuid.NewString(), CrashPolicy: store.CrashRestart})
	if err != nil {
		b.Fatal(err)
	}
	act, err := s.ClaimActivation(ctx, store.ClaimActivationParams{
		Key: sess.ActorKey, UID: uuid.NewString(), LeaseID: uuid.NewString(), HostID: "bench", LeaseTTL: time.Hour,
	})
	if err != nil {
		b.Fatal(err)
	}
	return act
}

const benchPayload = `{"message":"what is the weather like today?"}`

// turn runs NextDelivery + CommitTurn for the activation's next event.
func turn(ctx context.Context, s *sqlite.Store, act store.Activation) error {
	d, err := s.NextDelivery(ctx, store.NextDeliveryParams{
		Activation: act.Ref(), DeliveryID: uuid.NewString(), Binding: "sha256:bench", MarkSent: true, TailMessages: 20,
	})
	if err != nil {
		return fmt.Errorf("next delivery: %w", err)
	}
	_, err = s.CommitTurn(ctx, store.CommitTurnParams{
		Ref:      d.Delivery.TurnRef(),
		Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "sunny, 21 degrees, light wind from the west"}},
		State:    []byte(`{"turns":1,"mood":"helpful"}`),
		Outcome:  abi.OutcomeOK,
	})
	if err != nil {
		return fmt.Errorf("commit turn: %w", err)
	}
	return nil
}

// BenchmarkCommitTurn: one claimed activation; each op is NextDelivery +
// CommitTurn of one pre-appended event (two write transactions).
func BenchmarkCommitTurn(b *testing.B) {
	s := open(b)
	ctx := context.Background()
	act := benchSession(b, s, "")
	for range b.N {
		if _, _, err := s.AppendEvent(ctx, store.AppendEventParams{Key: act.ActorKey, Kind: "message", Payload: json.RawMessage(benchPayload)}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		if err := turn(ctx, s, act); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "turns/s")
}

// BenchmarkTurnCycle: each op is a full durable turn, AppendEvent +
// NextDelivery + CommitTurn (three write transactions).
func BenchmarkTurnCycle(b *testing.B) {
	s := open(b)
	ctx := context.Background()
	act := benchSession(b, s, "")
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		if _, _, err := s.AppendEvent(ctx, store.AppendEventParams{Key: act.ActorKey, Kind: "message", Payload: json.RawMessage(benchPayload)}); err != nil {
			b.Fatal(err)
		}
		if err := turn(ctx, s, act); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "turns/s")
}

// BenchmarkCommitTurnParallel: GOMAXPROCS×4 sessions turning at once
// through the single writer; each op is one full turn cycle.
func BenchmarkCommitTurnParallel(b *testing.B) {
	s := open(b)
	ctx := context.Background()
	first := benchSession(b, s, "")
	var n atomic.Int64
	b.SetParallelism(4)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		act := first
		if n.Add(1) > 1 {
			act = benchSession(b, s, first.AgentUID)
		}
		for pb.Next() {
			if _, _, err := s.AppendEvent(ctx, store.AppendEventParams{Key: act.ActorKey, Kind: "message", Payload: json.RawMessage(benchPayload)}); err != nil {
				b.Error(err)
				return
			}
			if err := turn(ctx, s, act); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "turns/s")
}

// BenchmarkClaimActivation: the claim of an idle-stopped session's
// activation (storetest.BenchClaimActivation, shared with postgres).
func BenchmarkClaimActivation(b *testing.B) { storetest.BenchClaimActivation(b, open(b)) }

// BenchmarkNextDelivery: the dispatch of a session's next event,
// NextDelivery + MarkDeliverySent (storetest.BenchNextDelivery, shared
// with postgres).
func BenchmarkNextDelivery(b *testing.B) { storetest.BenchNextDelivery(b, open(b)) }

// BenchmarkFireDueAlarms: a burst of 1,000 alarms due at one instant fired
// by three concurrent callers (storetest.BenchFireDueAlarms, shared with
// postgres).
func BenchmarkFireDueAlarms(b *testing.B) { storetest.BenchFireDueAlarms(b, open(b)) }
