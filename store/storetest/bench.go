package storetest

import (
	"context"
	"fmt"
	"sync"
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

// Alarm burst shape of BenchFireDueAlarms: BenchAlarmSessions sessions with
// BenchAlarmsPerSession alarms each, all due at one instant, fired by
// BenchAlarmHosts concurrent callers.
const (
	BenchAlarmSessions    = 200
	BenchAlarmsPerSession = 5
	BenchAlarmHosts       = 3
	benchAlarmBatch       = 64 // the host's FireDueAlarms limit (host.fireAlarms)
)

// BenchFireDueAlarms measures a burst of 1,000 alarms due at one instant
// (200 sessions × 5 one-shot alarms, due 1 s before the burst starts)
// fired by three concurrent callers, as three hosts' alarm scans would: each
// calls FireDueAlarms with the host's limit (64) until a call fires
// nothing. One op is one burst; alarms/s is alarms fired per second and
// burst-ms the time for the whole burst. With the timer stopped, each
// iteration first commits a turn on every session that sets its alarms (the
// sessions hold claimed activations) and afterwards checks that every alarm
// fired exactly once: no alarm is left and each session got exactly five
// alarm events more.
func BenchFireDueAlarms(b *testing.B, s store.Store) {
	ctx, agent, _ := benchSession(b, s)
	type sess struct {
		key    store.ActorKey
		act    store.Activation
		events int64
	}
	sessions := make([]sess, BenchAlarmSessions)
	for i := range sessions {
		x, _, err := s.CreateSession(ctx, store.CreateSessionParams{
			AgentUID: agent.UID, SessionID: uuid.NewString(), CrashPolicy: store.CrashRestart,
		})
		noErr(b, err, "CreateSession")
		_, _, err = s.AppendEvent(ctx, store.AppendEventParams{Key: x.ActorKey, Kind: abi.EventMessage,
			Payload: []byte(`{"message":"set your alarms"}`)})
		noErr(b, err, "AppendEvent")
		act, err := s.ClaimActivation(ctx, store.ClaimActivationParams{Key: x.ActorKey, UID: uuid.NewString(),
			LeaseID: uuid.NewString(), HostID: "bench-host", LeaseTTL: time.Hour})
		noErr(b, err, "ClaimActivation")
		sessions[i] = sess{key: x.ActorKey, act: act, events: 1}
	}
	// arm commits a turn on every session (its oldest open event) that
	// sets its alarms, all due at one instant in the past.
	arm := func() {
		due := time.Now().Add(-time.Second).Truncate(time.Millisecond).UTC()
		ops := make([]abi.AlarmOp, BenchAlarmsPerSession)
		for j := range ops {
			ops[j] = abi.AlarmOp{Name: fmt.Sprintf("a%d", j), At: &due, Data: []byte(`{"n":1}`)}
		}
		for _, x := range sessions {
			d, err := s.NextDelivery(ctx, store.NextDeliveryParams{Activation: x.act.Ref(), DeliveryID: uuid.NewString(),
				Binding: agent.ModuleDigest, MarkSent: true})
			noErr(b, err, "NextDelivery")
			_, err = s.CommitTurn(ctx, store.CommitTurnParams{Ref: d.Delivery.TurnRef(), KeepState: true,
				Outcome: abi.OutcomeOK, Alarms: ops})
			noErr(b, err, "CommitTurn with alarms")
		}
	}
	// check verifies that the burst fired every alarm exactly once.
	check := func() {
		for i, x := range sessions {
			alarms, err := s.ListAlarms(ctx, x.key)
			noErr(b, err, "ListAlarms")
			sn, err := s.GetSession(ctx, x.key)
			noErr(b, err, "GetSession")
			if len(alarms) != 0 || sn.EventCount != x.events+BenchAlarmsPerSession {
				b.Fatalf("session %s after the burst: %d alarms left, %d events, want 0 and %d",
					x.key, len(alarms), sn.EventCount, x.events+BenchAlarmsPerSession)
			}
			sessions[i].events = sn.EventCount
		}
	}
	const total = BenchAlarmSessions * BenchAlarmsPerSession
	b.ReportAllocs()
	b.StopTimer()
	arm()
	b.StartTimer()
	for b.Loop() {
		var wg sync.WaitGroup
		errs := make([]error, BenchAlarmHosts)
		for h := range BenchAlarmHosts {
			wg.Go(func() {
				for {
					keys, err := s.FireDueAlarms(ctx, benchAlarmBatch)
					if err != nil || len(keys) == 0 {
						errs[h] = err
						return
					}
				}
			})
		}
		wg.Wait()
		b.StopTimer()
		for _, err := range errs {
			noErr(b, err, "FireDueAlarms")
		}
		check()
		arm()
		b.StartTimer()
	}
	b.ReportMetric(float64(total*b.N)/b.Elapsed().Seconds(), "alarms/s")
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "burst-ms")
}
