package host_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/store"
)

// midTurnAgent's turns for a message starting "slow" run until released,
// steered (answering the steer) or cancelled; other turns answer at once.
type midTurnAgent struct {
	started chan string
	release chan struct{}
	aborted chan string
}

func newMidTurnAgent() *midTurnAgent {
	return &midTurnAgent{started: make(chan string, 16), release: make(chan struct{}, 16), aborted: make(chan string, 16)}
}

func (m *midTurnAgent) fn(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
	msg := req.Event.Message
	m.started <- msg
	reply := func(s string) *abi.TurnResult {
		return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: s}}}
	}
	if !strings.HasPrefix(msg, "slow") {
		return reply("done: " + msg), nil
	}
	select {
	case s := <-abi.SteersOf(ctx):
		req.TurnRef = s.TurnRef // echo the newest ref, as the SDKs do
		return reply("steered: " + s.Message), nil
	case <-m.release:
		return reply("done: " + msg), nil
	case <-ctx.Done():
		m.aborted <- msg
		return nil, ctx.Err()
	}
}

// midTurnFixture runs a host with the agent under the given default
// mid_turn policy, a session, and the slow turn "slow" in flight.
func midTurnFixture(t *testing.T, st store.Store, policy host.MidTurn) (*fixture, *midTurnAgent, *service.Service, store.Agent, store.ActorKey) {
	t.Helper()
	m := newMidTurnAgent()
	pol := testPolicy()
	pol.MidTurn = policy
	f := start(t, st, map[string]abi.TurnFunc{"m": m.fn}, pol)
	a := f.agent("m")
	key := f.session(a)
	f.signal(key, "slow")
	if got := recv(t, m.started); got != "slow" {
		t.Fatalf("started %q, want slow", got)
	}
	return f, m, service.New(f.h, nil, nil), a, key
}

// contents returns a turn's messages as role:content.
func contents(turn store.Turn) string {
	var out []string
	for _, m := range turn.Messages {
		out = append(out, m.Role+":"+m.Content)
	}
	return strings.Join(out, "|")
}

func TestMidTurnQueueRunsTheMessageAfterTheTurn(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		f, m, svc, a, key := midTurnFixture(t, st, "") // default: queue
		res, err := svc.Signal(context.Background(), a, key.SessionID, service.SignalParams{Message: "next"})
		if err != nil || !res.Created || res.MidTurn != host.MidTurnQueue || res.InFlight || res.Event.Kind != abi.EventMessage {
			t.Fatalf("queued message: %+v %v", res, err)
		}
		m.release <- struct{}{}
		f.waitFor("two turns", func() bool { return f.get(key).TurnCount == 2 })
		turns := f.transcript(key)
		if contents(turns[0]) != "user:slow|assistant:done: slow" || contents(turns[1]) != "user:next|assistant:done: next" {
			t.Errorf("transcript: %q, %q", contents(turns[0]), contents(turns[1]))
		}
	})
}

func TestMidTurnSteerReachesTheRunningTurn(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		f, _, svc, a, key := midTurnFixture(t, st, host.MidTurnSteer)
		res, err := svc.Signal(context.Background(), a, key.SessionID, service.SignalParams{Message: "make it short", IdempotencyKey: "s-1"})
		if err != nil || !res.Created || !res.InFlight || res.MidTurn != host.MidTurnSteer || res.Event.Kind != abi.EventSteer {
			t.Fatalf("steered message: %+v %v", res, err)
		}
		f.waitFor("the steered turn", func() bool { return f.get(key).TurnCount == 1 })
		if got := contents(f.transcript(key)[0]); got != "user:slow|user:make it short|assistant:steered: make it short" {
			t.Errorf("transcript %q", got)
		}
		// A re-send returns the first (steer) event, not a conflict.
		again, err := svc.Signal(context.Background(), a, key.SessionID, service.SignalParams{Message: "make it short", IdempotencyKey: "s-1"})
		if err != nil || again.Created || again.Event.ID != res.Event.ID {
			t.Fatalf("re-send: %+v %v", again, err)
		}
		// With nothing in flight a steered message is queued like one.
		idle, err := svc.Signal(context.Background(), a, key.SessionID, service.SignalParams{Message: "later"})
		if err != nil || !idle.Created || idle.InFlight {
			t.Fatalf("steer with nothing in flight: %+v %v", idle, err)
		}
		f.waitFor("the queued one", func() bool { return f.get(key).TurnCount == 2 })
	})
}

func TestMidTurnInterruptCancelsTheRunningTurnThenRunsTheMessage(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		f, m, svc, a, key := midTurnFixture(t, st, host.MidTurnInterrupt)
		first := f.events(key)[0]
		res, err := svc.Signal(context.Background(), a, key.SessionID, service.SignalParams{Message: "do this instead", IdempotencyKey: "i-1"})
		if err != nil || !res.Created || !res.InFlight || res.Interrupted != first.ID || res.MidTurn != host.MidTurnInterrupt {
			t.Fatalf("interrupting message: %+v %v (slow event %d)", res, err, first.ID)
		}
		if got := recv(t, m.aborted); got != "slow" {
			t.Fatalf("aborted %q", got)
		}
		f.waitFor("the message's turn", func() bool { return len(f.transcript(key)) == 2 })
		turns := f.transcript(key)
		if turns[0].EventID != first.ID || turns[0].Outcome != store.OutcomeCancelled {
			t.Errorf("first turn: %+v, want the cancel record of event %d", turns[0], first.ID)
		}
		if got := contents(turns[1]); got != "user:do this instead|assistant:done: do this instead" || turns[1].EventID != res.Event.ID {
			t.Errorf("second turn %q (event %d)", got, turns[1].EventID)
		}
		es := f.events(key)
		if es[0].Status != store.EventCancelled || es[1].Status != store.EventDone {
			t.Errorf("events: %s, %s", es[0].Status, es[1].Status)
		}
		// A re-send returns the first event and cancels nothing.
		m.release <- struct{}{} // never needed: nothing slow runs
		again, err := svc.Signal(context.Background(), a, key.SessionID, service.SignalParams{Message: "do this instead", IdempotencyKey: "i-1"})
		if err != nil || again.Created || again.Event.ID != res.Event.ID || again.Interrupted != 0 {
			t.Fatalf("re-send: %+v %v", again, err)
		}
		if n := len(f.transcript(key)); n != 2 {
			t.Errorf("%d turns after the re-send, want 2", n)
		}
	})
}

func TestMidTurnRejectRefusesAndWritesNothing(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		f, m, svc, a, key := midTurnFixture(t, st, host.MidTurnReject)
		before := len(f.events(key))
		_, err := svc.Signal(context.Background(), a, key.SessionID, service.SignalParams{Message: "not now"})
		var ce *service.ConflictError
		if !errors.As(err, &ce) || ce.Reason != service.ConflictTurnInFlight || ce.Field != "mid_turn" || !errors.Is(err, store.ErrConflict) {
			t.Fatalf("rejected message: %v (%T), want a *ConflictError turn_in_flight", err, err)
		}
		if n := len(f.events(key)); n != before {
			t.Errorf("%d events after the refusal, want %d", n, before)
		}
		m.release <- struct{}{}
		f.waitFor("the slow turn", func() bool { return f.get(key).TurnCount == 1 })
		f.waitFor("the activation to go idle", func() bool {
			res, err := svc.Signal(context.Background(), a, key.SessionID, service.SignalParams{Message: "now"})
			return err == nil && res.Created
		})
		f.waitFor("its turn", func() bool { return f.get(key).TurnCount == 2 })
	})
}

func TestMidTurnOfTheSignalOverridesTheAgentPolicy(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		f, m, svc, a, key := midTurnFixture(t, st, host.MidTurnQueue)
		// The agent's own policy (reloaded): reject.
		pol := f.h.Policy()
		next := *pol
		next.Agents = map[string]host.AgentPolicy{a.Name: {MidTurn: host.MidTurnReject, CrashPolicy: store.CrashRestart,
			MaxAttempts: pol.MaxAttempts, BackoffMin: pol.BackoffMin, BackoffMax: pol.BackoffMax, IdleTimeout: pol.IdleTimeout,
			TurnTimeout: pol.TurnTimeout, RestartPendingTimeout: pol.RestartPendingTimeout, Pool: pol.Pool}}
		f.h.SetPolicy(next)
		_, err := svc.Signal(context.Background(), a, key.SessionID, service.SignalParams{Message: "refused"})
		var ce *service.ConflictError
		if !errors.As(err, &ce) || ce.Reason != service.ConflictTurnInFlight {
			t.Fatalf("under the agent's reject: %v", err)
		}
		// The signal's queue beats it.
		res, err := svc.Signal(context.Background(), a, key.SessionID, service.SignalParams{Message: "queued", MidTurn: host.MidTurnQueue})
		if err != nil || !res.Created || res.MidTurn != host.MidTurnQueue {
			t.Fatalf("signal's queue: %+v %v", res, err)
		}
		// And a signal's steer reaches the turn.
		st2, err := svc.Signal(context.Background(), a, key.SessionID, service.SignalParams{Message: "hurry", MidTurn: host.MidTurnSteer})
		if err != nil || !st2.InFlight || st2.Event.Kind != abi.EventSteer {
			t.Fatalf("signal's steer: %+v %v", st2, err)
		}
		f.waitFor("both turns", func() bool { return f.get(key).TurnCount == 2 })
		turns := f.transcript(key)
		if contents(turns[0]) != "user:slow|user:hurry|assistant:steered: hurry" || contents(turns[1]) != "user:queued|assistant:done: queued" {
			t.Errorf("transcript %q, %q", contents(turns[0]), contents(turns[1]))
		}
		_ = m
	})
}

func TestMidTurnIsValidatedAndOnlyForMessages(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		f, m, svc, a, key := midTurnFixture(t, st, "")
		for _, p := range []service.SignalParams{
			{Message: "x", MidTurn: "later"},
			{Kind: abi.EventSteer, Message: "x", MidTurn: host.MidTurnQueue},
			{Kind: service.SignalCancel, MidTurn: host.MidTurnReject},
			{Kind: service.SignalWake, MidTurn: host.MidTurnSteer},
		} {
			_, err := svc.Signal(context.Background(), a, key.SessionID, p)
			var ie *service.InvalidError
			if !errors.As(err, &ie) || ie.Field != "mid_turn" {
				t.Errorf("%+v: %v, want an *InvalidError naming mid_turn", p, err)
			}
		}
		if n := len(f.events(key)); n != 1 {
			t.Errorf("%d events, want 1", n)
		}
		m.release <- struct{}{}
	})
}
