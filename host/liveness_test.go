package host_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/store"
)

// These tests check docs/DESIGN.md invariant 11 (liveness): an open, due event of a
// session that is not destroyed runs without any client action as soon as
// capacity for its pool exists on a live host. The idle timeout is far
// longer than the tests' bound, so a slot freed only by an idle timeout, or
// an event left to a client's next signal, fails them.

// livenessPolicy is testPolicy with a small pool, an idle timeout no test
// waits out, and a short pending timeout.
func livenessPolicy(capacity int) host.Policy {
	pol := testPolicy()
	pol.Pools = map[string]int{"default": capacity}
	pol.IdleTimeout = 10 * time.Minute
	pol.RestartPendingTimeout = 300 * time.Millisecond
	return pol
}

// openEvents counts key's open events.
func (f *fixture) openEvents(key store.ActorKey) int {
	n := 0
	for _, e := range f.events(key) {
		if e.Status == store.EventOpen {
			n++
		}
	}
	return n
}

func TestBurstAgainstACapacityPoolRunsEveryEventOnTwoHosts(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		pol := livenessPolicy(2)
		f := start(t, st, map[string]abi.TurnFunc{"counter": counter}, pol)
		f2 := start(t, st, map[string]abi.TurnFunc{"counter": counter}, pol)
		a := f.agent("counter")
		const n = 40
		keys := make([]store.ActorKey, n)
		for i := range keys {
			// Restart sessions wait, then sleep (pending_timeout); sleep-policy
			// ones sleep at once (capacity). All must run.
			policy := store.CrashRestart
			if i%4 == 3 {
				policy = store.CrashSleep
			}
			keys[i] = f.sessionWith(a, policy)
			f.signal(keys[i], fmt.Sprintf("burst %d", i))
			f2.h.Ensure(keys[i])
		}
		for _, k := range keys {
			f.waitFor("every burst event done", func() bool { return f.get(k).TurnCount == 1 && f.openEvents(k) == 0 })
		}
		stranded := 0
		for _, k := range keys {
			if s := f.get(k); s.TurnCount != 1 || f.openEvents(k) != 0 {
				stranded++
			}
		}
		if stranded != 0 {
			t.Fatalf("%d of %d sessions stranded", stranded, n)
		}
	})
}

func TestAFiredAlarmRunsThoughItsSessionSleptForCapacity(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		b := &blocker{started: make(chan string, 10), release: make(chan struct{})}
		fn := func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			switch {
			case req.Event.Kind == abi.EventAlarm:
				return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "alarm " + req.Event.Alarm.Name}}}, nil
			case req.Event.Message == "set":
				return &abi.TurnResult{Outcome: abi.OutcomeSleep, Alarms: []abi.AlarmOp{{Name: "ring", InMs: 3000}}}, nil
			}
			return b.fn(ctx, req)
		}
		f := start(t, st, map[string]abi.TurnFunc{"a": fn}, livenessPolicy(1))
		ag := f.agent("a")
		alarmed := f.sessionWith(ag, store.CrashRestart)
		f.signal(alarmed, "set")
		f.waitFor("the alarm to be set", func() bool { return f.get(alarmed).TurnCount == 1 })
		hog := f.sessionWith(ag, store.CrashRestart)
		f.signal(hog, "long turn")
		recv(t, b.started)
		// The alarm fires while the only slot runs the long turn: its
		// session waits, then sleeps for capacity with the alarm event open.
		f.waitFor("the alarm's session to sleep for capacity", func() bool {
			s := f.get(alarmed)
			return s.Status == store.SessionSleeping && s.SleepReason == store.SleepReasonPendingTimeout && f.openEvents(alarmed) == 1
		})
		close(b.release)
		f.waitFor("the alarm's turn", func() bool { return f.get(alarmed).TurnCount == 2 && f.openEvents(alarmed) == 0 })
		turns := f.transcript(alarmed)
		if last := turns[len(turns)-1].Messages; last[len(last)-1].Content != "alarm ring" {
			t.Fatalf("last turn %+v, want the alarm's", last)
		}
		if f.get(hog).TurnCount != 1 {
			t.Fatalf("the long turn did not commit")
		}
	})
}

func TestFinishParksTheSessionWithoutAnIdleActivationAndASignalWakesIt(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		finish := func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			res, err := counter(ctx, req)
			if err == nil && req.Event.Message != "ok" {
				res.Outcome = abi.OutcomeFinish
			}
			return res, err
		}
		f := start(t, st, map[string]abi.TurnFunc{"finish": finish}, livenessPolicy(1))
		a := f.agent("finish")
		key := f.session(a)
		f.signal(key, "done")
		f.waitFor("the finish turn", func() bool { return f.get(key).TurnCount == 1 })
		f.waitFor("the session to sleep and its controller to exit", func() bool {
			return f.get(key).Status == store.SessionSleeping && !f.h.Running(key)
		})
		if s := f.get(key); s.SleepReason != store.SleepReasonFinish {
			t.Fatalf("sleep reason %q, want %q", s.SleepReason, store.SleepReasonFinish)
		}
		// No idle activation holds the pool's only slot: another session runs.
		other := f.session(a)
		f.signal(other, "ok")
		f.waitFor("another session's turn on the freed slot", func() bool { return f.get(other).TurnCount == 1 })

		// Finish does not destroy: a later signal runs; and events queued
		// behind a finish still run before the session sleeps.
		f.signal(key, "again")
		f.signal(key, "queued")
		f.waitFor("both later turns", func() bool { return f.get(key).TurnCount == 3 })
		f.waitFor("the session to sleep again", func() bool {
			s := f.get(key)
			return s.Status == store.SessionSleeping && s.SleepReason == store.SleepReasonFinish && f.openEvents(key) == 0
		})
	})
}

// crashSleepsInTheWindow is the store seen by a host, which between a
// controller's look at a session asleep for capacity and its claim lets
// another host's work happen: the session is woken, run and slept by the
// crash policy (here through the store's own writes).
type crashSleepsInTheWindow struct {
	store.Store
	key   store.ActorKey
	fired atomic.Bool
}

func (s *crashSleepsInTheWindow) PeekSession(ctx context.Context, key store.ActorKey) (store.SessionPeek, error) {
	p, err := s.Store.PeekSession(ctx, key)
	if err == nil && key == s.key && store.WaitsForCapacity(p.Session) && s.fired.CompareAndSwap(false, true) {
		if _, err := s.WakeSession(ctx, key); err != nil {
			return p, err
		}
		if _, err := s.SleepSession(ctx, store.SleepSessionParams{Key: key, Reason: store.SleepReasonCrash}); err != nil {
			return p, err
		}
	}
	return p, err
}

// A session the scan found asleep for capacity, but slept by the crash
// policy before this host's claim, stays asleep with its event open: the
// wake is part of the claim, which wakes only a session that still sleeps
// for capacity (docs/DESIGN.md invariant 11). It used to be woken by a
// separate WakeSession and run.
func TestACrashSleptSessionIsNotWokenByACapacityWake(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		f := &fixture{t: t, st: st}
		key := f.session(f.agent("counter"))
		payload, _ := json.Marshal(map[string]string{"message": "accepted"})
		if _, _, err := st.AppendEvent(context.Background(), store.AppendEventParams{Key: key, Kind: abi.EventMessage, Payload: payload}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.SleepSession(context.Background(), store.SleepSessionParams{Key: key, Reason: store.SleepReasonCapacity}); err != nil {
			t.Fatal(err)
		}
		racy := &crashSleepsInTheWindow{Store: st, key: key}
		f = runHost(t, host.Options{Store: racy, Runner: funcRunner{map[string]abi.TurnFunc{"counter": counter}}, Policy: livenessPolicy(1), Logger: quietLogger()})
		f.waitFor("the scan to find the session and the controller to look", racy.fired.Load)
		f.waitFor("the controller to let go", func() bool { return !f.h.Running(key) })
		s := f.get(key)
		if s.Status != store.SessionSleeping || s.SleepReason != store.SleepReasonCrash || s.TurnCount != 0 || f.openEvents(key) != 1 {
			t.Fatalf("session %s (%s), %d turns, %d open events; want asleep for crash, its event open and unrun",
				s.Status, s.SleepReason, s.TurnCount, f.openEvents(key))
		}
	})
}
