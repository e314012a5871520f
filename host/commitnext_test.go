package host_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/store"
)

// Attacks on the next turn taken by the commit before it
// (store.CommitTurnParams.Next) at the host's level.

// TestACancelLandingAfterTheReplyLeavesTheBacklogRunning: the running
// turn's event is cancelled after its worker answered and before the
// commit (the cancel's wake-up arrives later, as one from another host
// does): the commit is refused, and the events behind it still run at
// once — not after the refused activation's lease lapses.
func TestACancelLandingAfterTheReplyLeavesTheBacklogRunning(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		var inFlight atomic.Bool
		fn := func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			if req.Event.Message == "cancel me" {
				// The cancel lands while the reply is on its way; nobody
				// pokes this host. The turn is deferred (not written yet)
				// unless a host call or PromoteAfter wrote it: the cancel
				// then closes a queued event, without a transcript turn.
				key := store.ActorKey{AgentUID: req.TurnRef.AgentUID, SessionID: req.TurnRef.SessionID}
				cr, err := st.CancelEvent(ctx, store.CancelEventParams{Key: key, EventID: req.TurnRef.ActorEventID, Reason: "late"})
				if err != nil {
					return nil, err
				}
				inFlight.Store(cr.InFlight)
			}
			return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "re: " + req.Event.Message}}}, nil
		}
		pol := testPolicy()
		// Longer than waitFor's minute: only the host's own work may run
		// the backlog, not the watchdog after the lease lapsed.
		pol.LeaseTTL = 3 * time.Minute
		f := start(t, st, map[string]abi.TurnFunc{"c": fn}, pol)
		ag := f.agent("c")
		for _, first := range []string{"quick", ""} {
			key := f.session(ag)
			if first != "" {
				f.signal(key, first) // the cancelled turn is then the second
			}
			f.signal(key, "cancel me")
			f.signal(key, "after 1")
			f.signal(key, "after 2")
			want := func() int64 {
				n := int64(3) // and the cancelled turn when it was in flight
				if first == "" {
					n = 2
				}
				if inFlight.Load() {
					n++
				}
				return n
			}
			f.waitFor("the events after the cancelled one", func() bool { return f.get(key).TurnCount == want() })
			var got []string
			for _, tr := range f.transcript(key) {
				got = append(got, tr.Messages[len(tr.Messages)-1].Content)
			}
			if g := strings.Join(got, "|"); !strings.HasSuffix(g, "re: after 1|re: after 2") {
				t.Errorf("transcript replies %q", g)
			}
			wantSoundStream(t, st, key)
		}
	})
}

// TestShutdownWithBacklogsLosesNoEventAndChargesNoAttempt: hosts stop
// while sessions drain backlogs (each commit taking the next turn); a
// turn taken but not run is given back uncounted. A second host then
// commits every event exactly once, in order, none charged an attempt.
func TestShutdownWithBacklogsLosesNoEventAndChargesNoAttempt(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		var turns atomic.Int64
		fn := func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			turns.Add(1)
			time.Sleep(15 * time.Millisecond)
			return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "re: " + req.Event.Message}}}, nil
		}
		funcs := map[string]abi.TurnFunc{"b": fn}
		pol := testPolicy()
		pol.MaxAttempts = 1 // a charged attempt dead-letters the event
		const sessions, backlog, rounds = 4, 30, 3
		var keys []store.ActorKey
		var ag store.Agent
		for round := range rounds {
			ctx, stop := context.WithCancel(context.Background())
			h, err := host.New(host.Options{Store: st, Runner: funcRunner{funcs}, Policy: pol, Logger: quietLogger()})
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- h.Run(ctx) }()
			f := &fixture{t: t, st: st, h: h}
			if round == 0 {
				ag = f.agent("b")
				for range sessions {
					key := f.session(ag)
					keys = append(keys, key)
					for i := range backlog {
						f.signal(key, fmt.Sprintf("m%02d", i))
					}
				}
			} else {
				for _, key := range keys {
					h.Ensure(key)
				}
			}
			if round < rounds-1 {
				// Stop mid-backlog.
				at := int64(sessions * backlog * (round + 1) / (rounds + 1))
				deadline := time.Now().Add(time.Minute)
				for turns.Load() < at {
					if time.Now().After(deadline) {
						for _, key := range keys {
							sess := f.get(key)
							t.Logf("session %s: %s/%s turns=%d open=%d epoch=%d", key, sess.Status, sess.SleepReason, sess.TurnCount, sess.OpenEvents, sess.ActorEpoch)
							for _, e := range f.events(key) {
								if e.Status != store.EventDone {
									t.Logf("  event %d %s attempts=%d next=%s err=%q", e.ID, e.Status, e.Attempts, e.NextAttemptAt.Format(time.RFC3339Nano), e.LastError)
									break
								}
							}
						}
						t.Fatalf("round %d: timed out waiting for some turns (%d of %d)", round, turns.Load(), at)
					}
					time.Sleep(10 * time.Millisecond)
				}
				stop()
				if err := <-done; err != nil {
					t.Fatalf("host.Run: %v", err)
				}
				t.Logf("round %d: %v turns taken by a commit given back unsent, %v cut short by the shutdown", round,
					testutil.ToFloat64(h.Metrics().FailedAttempts.WithLabelValues("not_sent")),
					testutil.ToFloat64(h.Metrics().FailedAttempts.WithLabelValues("shutdown")))
				continue
			}
			f.waitFor("every event", func() bool {
				for _, key := range keys {
					if f.get(key).TurnCount < backlog {
						return false
					}
				}
				return true
			})
			stop()
			if err := <-done; err != nil {
				t.Fatalf("host.Run: %v", err)
			}
		}
		f := &fixture{t: t, st: st}
		for _, key := range keys {
			var got []string
			for _, tr := range f.transcript(key) {
				got = append(got, tr.Messages[len(tr.Messages)-1].Content)
			}
			var want []string
			for i := range backlog {
				want = append(want, fmt.Sprintf("re: m%02d", i))
			}
			if g, w := strings.Join(got, ","), strings.Join(want, ","); g != w {
				t.Errorf("session %s replies:\n%s\nwant\n%s", key, g, w)
			}
			for _, e := range f.events(key) {
				if e.Status != store.EventDone || e.Attempts != 0 {
					t.Errorf("event %d is %s after %d charged attempts, want done after none", e.ID, e.Status, e.Attempts)
				}
			}
			wantSoundStream(t, st, key)
		}
	})
}

// TestAnAgentUpdateMidBacklogBindsTheRestToTheNewAgent: an agent updated
// while a backlog drains through the commits' claims: every event that
// had not started runs on the new module (docs/DESIGN.md invariant 10).
func TestAnAgentUpdateMidBacklogBindsTheRestToTheNewAgent(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		gate := make(chan struct{})
		mk := func(name string) abi.TurnFunc {
			return func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
				if req.Event.Message == "gate" {
					<-gate
				}
				return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: name + ": " + req.Event.Message}}}, nil
			}
		}
		f := start(t, st, map[string]abi.TurnFunc{"v1": mk("v1"), "v2": mk("v2")}, testPolicy())
		ag := f.agent("v1")
		key := f.session(ag)
		f.signal(key, "a")
		f.signal(key, "b")
		f.waitFor("two turns", func() bool { return f.get(key).TurnCount == 2 })
		f.signal(key, "gate")
		f.waitFor("the gated turn to start", func() bool {
			for _, e := range f.events(key) {
				if e.Status == store.EventOpen && e.Binding != "" {
					return true
				}
			}
			return false
		})
		const backlog = 6
		for i := range backlog {
			f.signal(key, fmt.Sprintf("q%d", i))
		}
		ctx := context.Background()
		if _, _, err := st.PutModule(ctx, store.PutModuleParams{Digest: "v2", ABIVersion: abi.Version, Bytes: []byte("v2")}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.CreateAgent(ctx, store.CreateAgentParams{UID: ag.UID, Name: ag.Name, ModuleDigest: "v2",
			CrashPolicy: store.CrashRestart, Upsert: true}); err != nil {
			t.Fatal(err)
		}
		close(gate)
		f.waitFor("the backlog", func() bool { return f.get(key).TurnCount == 3+backlog })
		ts := f.transcript(key)
		if got := ts[2].Messages[len(ts[2].Messages)-1].Content; got != "v1: gate" {
			t.Errorf("the started turn replied %q, want it on v1", got)
		}
		for i, tr := range ts[3:] {
			if got, want := tr.Messages[len(tr.Messages)-1].Content, fmt.Sprintf("v2: q%d", i); got != want {
				t.Errorf("backlog turn %d replied %q, want %q", i, got, want)
			}
		}
		for _, e := range f.events(key)[3:] {
			if e.Binding != "v2" {
				t.Errorf("event %d bound to %q, want v2", e.ID, e.Binding)
			}
		}
		wantSoundStream(t, st, key)
	})
}

// afterTakeStore is a real store whose CommitTurn runs after once, right
// after the first commit that took the event carrying message trigger
// (store.Turn.Next): a write landing between that commit and the taken
// turn's run.
type afterTakeStore struct {
	store.Store
	trigger string
	once    atomic.Bool
	after   func(n *store.Dispatch)
}

func (s *afterTakeStore) CommitTurn(ctx context.Context, p store.CommitTurnParams) (store.Turn, error) {
	t, err := s.Store.CommitTurn(ctx, p)
	if err == nil && t.Next != nil {
		if m, _ := store.PayloadMessage(string(t.Next.Event.Payload)); m == s.trigger && s.once.CompareAndSwap(false, true) {
			s.after(t.Next)
		}
	}
	return t, err
}

// TestSteerOrCancelOfATakenTurnBeforeItRuns: a steer or a cancel lands
// right after the commit that took the next turn, before that turn runs,
// with or without the wake-up that would tell the controller: the steer
// reaches the turn (the stale revision is read again), the cancel ends it,
// and the events after it run.
func TestSteerOrCancelOfATakenTurnBeforeItRuns(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		for _, c := range []struct {
			kind string
			poke bool
		}{{"steer", true}, {"steer", false}, {"cancel", true}} {
			t.Run(fmt.Sprintf("%s/poke=%v", c.kind, c.poke), func(t *testing.T) {
				started := make(chan string, 64)
				hs := &afterTakeStore{Store: st, trigger: "two"}
				f := start(t, hs, map[string]abi.TurnFunc{"o": oneTripFn(started)}, testPolicy())
				key := f.session(f.agent("o"))
				hs.after = func(n *store.Dispatch) {
					ctx := context.Background()
					switch c.kind {
					case "steer":
						payload, _ := json.Marshal(map[string]string{"message": "left"})
						r, err := st.Steer(ctx, store.SteerParams{Key: key, Payload: payload, DeliveryID: uuid.NewString()})
						if err != nil || !r.InFlight || r.Ref.ActorEventID != n.Event.ID {
							t.Errorf("steer of the taken turn: %+v %v", r, err)
						}
					case "cancel":
						r, err := st.CancelEvent(ctx, store.CancelEventParams{Key: key, EventID: n.Event.ID, Reason: "no"})
						if err != nil || !r.InFlight {
							t.Errorf("cancel of the taken turn: %+v %v", r, err)
						}
					}
					if c.poke {
						f.h.Ensure(key)
					}
				}
				f.signal(key, "ignore") // 300 ms: the rest queues behind it
				for recv(t, started) != "ignore" {
				}
				f.signal(key, "one")
				f.signal(key, "two")
				f.signal(key, "three")
				f.waitFor("every turn", func() bool { return f.get(key).TurnCount == 4 })
				var got []string
				for _, tr := range f.transcript(key) {
					var ms []string
					for _, m := range tr.Messages {
						ms = append(ms, m.Content)
					}
					got = append(got, strings.Join(ms, "+"))
				}
				want := "ignore+unsteered|one+re: one|two+left+saw left|three+re: three"
				if c.kind == "cancel" {
					want = "ignore+unsteered|one+re: one|two+cancelled: no|three+re: three"
				}
				if g := strings.Join(got, "|"); g != want {
					t.Errorf("transcript %q, want %q", g, want)
				}
				for _, e := range f.events(key) {
					if e.Attempts != 0 {
						t.Errorf("event %d charged %d attempts", e.ID, e.Attempts)
					}
				}
				wantSoundStream(t, st, key)
				if !hs.once.Load() {
					t.Errorf("no commit took the event %q: the race was not run", hs.trigger)
				}
			})
		}
	})
}

// leaseLossStore is a real store whose lease renewal, once armed, reports
// every lease lost a single time (as a renewal that found them expired
// does), then renews as usual.
type leaseLossStore struct {
	store.Store
	armed atomic.Bool
	lost  chan struct{}
	// failed records each uncounted failed attempt's error and backoff.
	mu     sync.Mutex
	failed []store.FailAttemptParams
}

func (s *leaseLossStore) FailAttempt(ctx context.Context, p store.FailAttemptParams) (store.FailResult, error) {
	if !p.Counted {
		s.mu.Lock()
		s.failed = append(s.failed, p)
		s.mu.Unlock()
	}
	return s.Store.FailAttempt(ctx, p)
}

func (s *leaseLossStore) RenewLeases(ctx context.Context, p store.RenewLeasesParams) ([]store.ActivationRef, error) {
	if s.armed.CompareAndSwap(true, false) {
		close(s.lost)
		return nil, nil
	}
	return s.Store.RenewLeases(ctx, p)
}

// TestALeaseLostWithATakenTurnGivesItBackUncounted: the lease is lost
// right after the commit that took the next turn: that turn is given back
// unsent and uncounted, and every event still commits once, in order, at
// no charged attempt.
func TestALeaseLostWithATakenTurnGivesItBackUncounted(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		ls := &leaseLossStore{Store: st, lost: make(chan struct{})}
		hs := &afterTakeStore{Store: ls, trigger: "two"}
		started := make(chan string, 64)
		f := start(t, hs, map[string]abi.TurnFunc{"o": oneTripFn(started)}, testPolicy())
		hs.after = func(*store.Dispatch) {
			ls.armed.Store(true)
			select {
			case <-ls.lost:
			case <-time.After(time.Minute):
				t.Error("no lease renewal within a minute")
			}
			// The renewal loop cancels the lease right after the call.
			time.Sleep(300 * time.Millisecond)
		}
		key := f.session(f.agent("o"))
		f.signal(key, "ignore") // 300 ms: the rest queues behind it
		for recv(t, started) != "ignore" {
		}
		f.signal(key, "one")
		f.signal(key, "two")
		f.signal(key, "three")
		f.waitFor("every turn", func() bool { return f.get(key).TurnCount == 4 })
		var got []string
		for _, tr := range f.transcript(key) {
			got = append(got, tr.Messages[len(tr.Messages)-1].Content)
		}
		if g, w := strings.Join(got, "|"), "unsteered|re: one|re: two|re: three"; g != w {
			t.Errorf("transcript replies %q, want %q", g, w)
		}
		for _, e := range f.events(key) {
			if e.Status != store.EventDone || e.Attempts != 0 {
				t.Errorf("event %d is %s after %d charged attempts", e.ID, e.Status, e.Attempts)
			}
		}
		wantSoundStream(t, st, key)
		if !hs.once.Load() {
			t.Fatalf("no commit took the event %q: the race was not run", hs.trigger)
		}
		if n := testutil.ToFloat64(f.h.Metrics().FailedAttempts.WithLabelValues("not_sent")); n != 1 {
			t.Errorf("%v turns given back unsent, want 1 (the taken one)", n)
		}
		// Never sent, it is due at once for the next activation, not after
		// a retry's backoff.
		ls.mu.Lock()
		defer ls.mu.Unlock()
		if len(ls.failed) != 1 || ls.failed[0].Backoff != 0 || !strings.Contains(ls.failed[0].Error, "activation stopped before the turn was sent") {
			t.Errorf("uncounted failures %+v, want the taken turn's alone, due at once", ls.failed)
		}
	})
}
