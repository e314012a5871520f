package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// Benchmark bodies shared by the drivers, so that both measure the same
// calls. A driver's bench_test.go calls them with a fresh store:
//
//	func BenchmarkClaimActivation(b *testing.B) { storetest.BenchClaimActivation(b, open(b)) }
//	func BenchmarkNextDelivery(b *testing.B)    { storetest.BenchNextDelivery(b, open(b)) }
//
// Every timed call's result is checked, so a benchmark cannot measure a
// failure path. The untimed calls that put the session back into shape
// between iterations run with the timer stopped.

// benchTail is the host's default transcript tail (host.Settings.TranscriptTail).
const benchTail = 20

// benchSession registers a module and an agent on s and creates one
// session of it.
func benchSession(b *testing.B, s store.Store) (ctx context.Context, agent store.Agent, key store.ActorKey) {
	b.Helper()
	ctx = context.Background()
	data := []byte("\x00asm\x01\x00\x00\x00bench")
	m, _, err := s.PutModule(ctx, store.PutModuleParams{Digest: digest(data), ABIVersion: abi.Version, Bytes: data})
	noErr(b, err, "PutModule")
	agent, err = s.CreateAgent(ctx, store.CreateAgentParams{
		UID: uuid.NewString(), Name: "bench", ModuleDigest: m.Digest, CrashPolicy: store.CrashRestart,
	})
	noErr(b, err, "CreateAgent")
	sess, _, err := s.CreateSession(ctx, store.CreateSessionParams{
		AgentUID: agent.UID, SessionID: uuid.NewString(), CrashPolicy: store.CrashRestart,
	})
	noErr(b, err, "CreateSession")
	return ctx, agent, sess.ActorKey
}

// BenchClaimActivation measures ClaimActivation of a sleeping session in
// the host's sense (idle-stopped: no live activation, as after
// policy.idle_timeout) with a signal waiting, as when a signal wakes it.
// Each iteration claims; the activation is stopped again with the timer
// stopped. The claim must return a live activation of the session under
// the lease and ids asked for, one epoch above the previous claim.
func BenchClaimActivation(b *testing.B, s store.Store) {
	ctx, _, key := benchSession(b, s)
	_, _, err := s.AppendEvent(ctx, store.AppendEventParams{Key: key, Kind: abi.EventMessage,
		Payload: []byte(`{"message":"wake up"}`)})
	noErr(b, err, "AppendEvent")
	sess, err := s.GetSession(ctx, key)
	noErr(b, err, "GetSession")
	epoch := sess.ActorEpoch
	b.ReportAllocs()
	for b.Loop() {
		p := store.ClaimActivationParams{Key: key, UID: uuid.NewString(), LeaseID: uuid.NewString(),
			HostID: "bench-host", LeaseTTL: time.Minute}
		act, err := s.ClaimActivation(ctx, p)
		if err != nil {
			b.Fatalf("ClaimActivation (epoch %d): %v", epoch, err)
		}
		b.StopTimer()
		epoch++
		if act.UID != p.UID || act.LeaseID != p.LeaseID || act.ActorKey != key || act.HostID != p.HostID ||
			act.ActorEpoch != epoch || act.State != store.ActivationActive || act.CurrentEventID != 0 {
			b.Fatalf("ClaimActivation returned %+v, want uid %s lease %s epoch %d active on %s", act, p.UID, p.LeaseID, epoch, key)
		}
		noErr(b, s.StopActivation(ctx, act.Ref()), "StopActivation")
		b.StartTimer()
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "claims/s")
}

// BenchNextDelivery measures the dispatch of a session's next event as a
// host does it for a worker whose bytes leave the process (plugin, remote):
// NextDelivery (delivery created, event made current, session inputs and
// a 20-message transcript tail read) then MarkDeliverySent. The session
// holds one claimed activation; each iteration's event is appended before
// it, and its turn committed after it, with the timer stopped, so there is
// one open event at a time and the transcript grows as in a conversation.
// The dispatch must carry the appended event, and the commit that follows
// must succeed (it needs the delivery sent, invariant 9). next-µs and
// mark-µs are the two calls' shares of an op.
func BenchNextDelivery(b *testing.B, s store.Store) {
	ctx, agent, key := benchSession(b, s)
	act, err := s.ClaimActivation(ctx, store.ClaimActivationParams{Key: key, UID: uuid.NewString(),
		LeaseID: uuid.NewString(), HostID: "bench-host", LeaseTTL: time.Hour})
	noErr(b, err, "ClaimActivation")
	state := []byte(`{"turns":0,"notes":["call the plumber about the sink"]}`)
	i := 0
	appendNext := func() store.Event {
		i++
		ev, _, err := s.AppendEvent(ctx, store.AppendEventParams{Key: key, Kind: abi.EventMessage,
			Payload: fmt.Appendf(nil, `{"message":"message %d"}`, i)})
		noErr(b, err, "AppendEvent")
		return ev
	}
	ev := appendNext()
	var next, mark time.Duration // the two calls' shares
	b.ReportAllocs()
	for b.Loop() {
		start := time.Now()
		d, err := s.NextDelivery(ctx, store.NextDeliveryParams{Activation: act.Ref(), DeliveryID: uuid.NewString(),
			Binding: agent.ModuleDigest, TailMessages: benchTail})
		if err != nil {
			b.Fatalf("NextDelivery of event %d: %v", ev.ID, err)
		}
		sent := time.Now()
		ref := d.Delivery.TurnRef()
		if err := s.MarkDeliverySent(ctx, ref); err != nil {
			b.Fatalf("MarkDeliverySent %s: %v", ref, err)
		}
		b.StopTimer()
		next, mark = next+sent.Sub(start), mark+time.Since(sent)
		if d.Event.ID != ev.ID || d.Delivery.EventID != ev.ID || d.Delivery.State != store.DeliveryCreated ||
			d.Delivery.ActivationUID != act.UID || d.Attempt != 1 || len(d.Tail) != min(2*(i-1), benchTail) {
			b.Fatalf("dispatch of event %d (turn %d): event %d, delivery %+v, attempt %d, tail %d messages",
				ev.ID, i, d.Event.ID, d.Delivery, d.Attempt, len(d.Tail))
		}
		t, err := s.CommitTurn(ctx, store.CommitTurnParams{Ref: ref, State: state, Outcome: abi.OutcomeOK,
			Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "noted"}}})
		noErr(b, err, "CommitTurn")
		if t.TurnNo != int64(i) || t.EventID != ev.ID {
			b.Fatalf("CommitTurn: turn %d of event %d, want turn %d of event %d", t.TurnNo, t.EventID, i, ev.ID)
		}
		ev = appendNext()
		b.StartTimer()
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "dispatches/s")
	b.ReportMetric(float64(next.Microseconds())/float64(b.N), "next-µs")
	b.ReportMetric(float64(mark.Microseconds())/float64(b.N), "mark-µs")
}
