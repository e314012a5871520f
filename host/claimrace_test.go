package host_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/store"
)

// peekClaimHook runs a hook between a controller's PeekSession and its
// ClaimActivation with a first turn (store.ClaimActivationParams.First):
// once per armed session, just before the claim is sent, and an after
// hook once it returned. It records each armed claim's answer.
type peekClaimHook struct {
	store.Store
	mu    sync.Mutex
	hooks map[store.ActorKey]*claimHookOf
}

type claimHookOf struct {
	before, after func(ctx context.Context)
	fired         chan struct{}
	// epoch is the epoch the claim asked its first turn at (0: the
	// claim's own, a cold start without a look: controller.quickStart).
	epoch int64
	act   store.Activation
	err   error
}

func (h *peekClaimHook) arm(key store.ActorKey, before, after func(ctx context.Context)) *claimHookOf {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.hooks == nil {
		h.hooks = map[store.ActorKey]*claimHookOf{}
	}
	c := &claimHookOf{before: before, after: after, fired: make(chan struct{})}
	h.hooks[key] = c
	return c
}

func (h *peekClaimHook) ClaimActivation(ctx context.Context, p store.ClaimActivationParams) (store.Activation, error) {
	h.mu.Lock()
	c := h.hooks[p.Key]
	if c != nil && p.First != nil {
		delete(h.hooks, p.Key)
	} else {
		c = nil
	}
	h.mu.Unlock()
	if c == nil {
		return h.Store.ClaimActivation(ctx, p)
	}
	if c.before != nil {
		c.before(ctx)
	}
	c.epoch = p.First.Activation.ActorEpoch
	c.act, c.err = h.Store.ClaimActivation(ctx, p)
	if c.after != nil {
		c.after(ctx)
	}
	close(c.fired)
	return c.act, c.err
}

// echoAs answers "<name>: <message>".
func echoAs(name string) abi.TurnFunc {
	return func(_ context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
		return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: fmt.Sprintf("%s: %s", name, req.Event.Message)}}}, nil
	}
}

// TestWritesBetweenThePeekAndTheFirstTurnsClaim: whatever lands between a
// controller's PeekSession (when it looks: a cold start after this host's
// own append of an agent it knows does not) and its activation's claim
// with the first turn
// (another activation that came and went, one that is still live, a
// cancel, a destroy, a sleep, an agent update) is honoured: the first turn
// is never taken at a stale epoch, a cancelled event never runs, nothing
// runs in a destroyed or sleeping session, each event runs once at its
// first attempt, and an agent updated meanwhile runs its new binding
// (docs/DESIGN.md invariants 1 and 10).
func TestWritesBetweenThePeekAndTheFirstTurnsClaim(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		hk := &peekClaimHook{Store: st}
		f := start(t, hk, map[string]abi.TurnFunc{"old": echoAs("old"), "new": echoAs("new")}, testPolicy())
		ctx := context.Background()
		ag := f.agent("old")
		warm := f.session(ag)
		f.signal(warm, "warm")
		f.waitFor("the warm-up turn", func() bool { return f.get(warm).TurnCount == 1 })
		other := func() store.ClaimActivationParams {
			return store.ClaimActivationParams{UID: uuid.NewString(), LeaseID: uuid.NewString(), HostID: "intruder", LeaseTTL: testPolicy().LeaseTTL}
		}
		ranOnce := func(t *testing.T, key store.ActorKey, reply string) {
			t.Helper()
			f.waitFor("the turn", func() bool { return f.get(key).TurnCount >= 1 })
			ts := f.transcript(key)
			if len(ts) != 1 {
				t.Fatalf("%d turns, want 1", len(ts))
			}
			if got := ts[0].Messages[len(ts[0].Messages)-1].Content; got != reply {
				t.Errorf("replied %q, want %q", got, reply)
			}
			for _, e := range f.events(key) {
				if e.Status != store.EventDone || e.Attempts != 0 {
					t.Errorf("event %d is %s after %d failed attempts, want done after none", e.ID, e.Status, e.Attempts)
				}
			}
			wantSoundStream(t, st, key)
		}

		// Another activation came and went between the look and the
		// claim: a claim that asked its first turn at the epoch the look
		// implied takes nothing (the fences' equality), one that asked
		// none — a cold start after this host's own append, which needs
		// no look — takes it at the epoch it gives.
		for _, look := range []bool{true, false} {
			t.Run(fmt.Sprintf("AnotherActivationCameAndWent/look=%v", look), func(t *testing.T) {
				key := f.session(ag)
				c := hk.arm(key, func(ctx context.Context) {
					p := other()
					p.Key = key
					a, err := st.ClaimActivation(ctx, p)
					if err != nil {
						t.Errorf("intruder's claim: %v", err)
						return
					}
					if err := st.StopActivation(ctx, a.Ref()); err != nil {
						t.Errorf("intruder's stop: %v", err)
					}
				}, nil)
				if look {
					// Appended through the store alone: the controller has
					// no hint, so it looks first.
					payload := []byte(`{"message":"hi"}`)
					if _, _, err := st.AppendEvent(ctx, store.AppendEventParams{Key: key, Kind: abi.EventMessage, Payload: payload}); err != nil {
						t.Fatal(err)
					}
					f.h.Ensure(key)
				} else {
					f.signal(key, "hi")
				}
				recv(t, c.fired)
				if c.err != nil {
					t.Fatalf("the controller's claim: %v", c.err)
				}
				// Without look the controller still looks when the scan or
				// the echo of the append's notification started it before
				// the append's report (Appended) carried the hint.
				switch quick := c.epoch == 0; {
				case look && quick:
					t.Fatalf("a claim after a look asked its first turn without an epoch")
				case !quick && c.act.First != nil:
					t.Errorf("the claim at epoch %d took a first turn at epoch %d", c.act.ActorEpoch, c.act.First.Delivery.ActorEpoch)
				case quick && c.act.First == nil:
					t.Errorf("the claim without a look took no first turn")
				case quick && c.act.First.Delivery.ActorEpoch != c.act.ActorEpoch:
					t.Errorf("the claim at epoch %d took a first turn at epoch %d", c.act.ActorEpoch, c.act.First.Delivery.ActorEpoch)
				}
				ranOnce(t, key, "old: hi")
			})
		}

		t.Run("AnotherActivationIsLive", func(t *testing.T) {
			key := f.session(ag)
			var intruder store.Activation
			c := hk.arm(key, func(ctx context.Context) {
				p := other()
				p.Key = key
				var err error
				if intruder, err = st.ClaimActivation(ctx, p); err != nil {
					t.Errorf("intruder's claim: %v", err)
				}
			}, func(ctx context.Context) {
				// Give the session back; the scan finds it runnable.
				if err := st.StopActivation(ctx, intruder.Ref()); err != nil {
					t.Errorf("intruder's stop: %v", err)
				}
			})
			f.signal(key, "hi")
			recv(t, c.fired)
			if !errors.Is(c.err, store.ErrActivationLive) {
				t.Fatalf("the controller's claim beside a live activation: %+v, %v; want ErrActivationLive", c.act, c.err)
			}
			f.h.Ensure(key)
			ranOnce(t, key, "old: hi")
		})

		t.Run("TheEventWasCancelled", func(t *testing.T) {
			key := f.session(ag)
			es := make(chan store.Event, 1)
			c := hk.arm(key, func(ctx context.Context) {
				e := recv(t, es)
				es <- e
				if _, err := st.CancelEvent(ctx, store.CancelEventParams{Key: key, EventID: e.ID, Reason: "test"}); err != nil {
					t.Errorf("CancelEvent: %v", err)
				}
			}, nil)
			es <- f.signal(key, "cancelled")
			recv(t, c.fired)
			e := <-es
			if c.err != nil {
				t.Fatalf("the controller's claim: %v", c.err)
			}
			if c.act.First != nil {
				t.Fatalf("the claim took cancelled event %d", c.act.First.Event.ID)
			}
			f.signal(key, "next")
			f.waitFor("the next turn", func() bool { return f.get(key).TurnCount >= 1 })
			ts := f.transcript(key)
			if len(ts) != 1 || ts[0].EventID == e.ID {
				t.Fatalf("turns %+v: want one, not of the cancelled event %d", ts, e.ID)
			}
		})

		t.Run("ASteerLanded", func(t *testing.T) {
			key := f.session(ag)
			c := hk.arm(key, func(ctx context.Context) {
				if _, err := st.Steer(ctx, store.SteerParams{Key: key, Payload: []byte(`{"message":"steer"}`), DeliveryID: uuid.NewString()}); err != nil {
					t.Errorf("Steer: %v", err)
				}
			}, nil)
			f.signal(key, "hi")
			recv(t, c.fired)
			if c.err != nil {
				t.Fatalf("the controller's claim: %v", c.err)
			}
			f.waitFor("every event closed", func() bool {
				for _, e := range f.events(key) {
					if e.Status == store.EventOpen {
						return false
					}
				}
				return true
			})
			for _, e := range f.events(key) {
				if e.Attempts != 0 {
					t.Errorf("event %d (%s) closed after %d failed attempts", e.ID, e.Status, e.Attempts)
				}
			}
			wantSoundStream(t, st, key)
		})

		t.Run("TheSessionWasDestroyed", func(t *testing.T) {
			key := f.session(ag)
			c := hk.arm(key, func(ctx context.Context) {
				if _, err := st.DestroySession(ctx, key); err != nil {
					t.Errorf("DestroySession: %v", err)
				}
			}, nil)
			f.signal(key, "hi")
			recv(t, c.fired)
			if c.err == nil {
				t.Fatalf("a claim of a destroyed session: %+v (first %+v)", c.act, c.act.First)
			}
			if ts := f.transcript(key); len(ts) != 0 {
				t.Fatalf("a destroyed session ran %d turns", len(ts))
			}
		})

		t.Run("TheSessionWasPutToSleep", func(t *testing.T) {
			key := f.session(ag)
			c := hk.arm(key, func(ctx context.Context) {
				if _, err := st.SleepSession(ctx, store.SleepSessionParams{Key: key, Reason: store.SleepReasonAgent}); err != nil {
					t.Errorf("SleepSession: %v", err)
				}
			}, nil)
			f.signal(key, "hi")
			recv(t, c.fired)
			if !errors.Is(c.err, store.ErrSessionSleeping) {
				t.Fatalf("a claim of a sleeping session: %+v, %v; want ErrSessionSleeping", c.act, c.err)
			}
			if ts := f.transcript(key); len(ts) != 0 {
				t.Fatalf("a sleeping session ran %d turns", len(ts))
			}
			if _, err := st.WakeSession(ctx, key); err != nil {
				t.Fatal(err)
			}
			f.h.Ensure(key)
			ranOnce(t, key, "old: hi")
		})

		t.Run("TheAgentWasUpdated", func(t *testing.T) {
			ag2 := f.agent("old")
			warm2 := f.session(ag2)
			f.signal(warm2, "warm")
			f.waitFor("the warm-up turn", func() bool { return f.get(warm2).TurnCount == 1 })
			if _, _, err := st.PutModule(ctx, store.PutModuleParams{Digest: "new", ABIVersion: abi.Version, Bytes: []byte("new")}); err != nil {
				t.Fatal(err)
			}
			key := f.session(ag2)
			c := hk.arm(key, func(ctx context.Context) {
				if _, err := st.CreateAgent(ctx, store.CreateAgentParams{UID: uuid.NewString(), Name: ag2.Name, ModuleDigest: "new",
					CrashPolicy: store.CrashRestart, Upsert: true}); err != nil {
					t.Errorf("agent update: %v", err)
				}
			}, nil)
			f.signal(key, "hi")
			recv(t, c.fired)
			if c.err != nil {
				t.Fatalf("the controller's claim: %v", c.err)
			}
			ranOnce(t, key, "new: hi")
			if es := f.events(key); len(es) != 1 || es[0].Binding != "new" {
				t.Fatalf("events %+v: want one bound to the new module", es)
			}
		})
	})
}

// TestAFirstTurnTakenByTheClaimCarriesTheSessionsStateAndTranscript: a
// session whose activation stopped idle between its turns gets each next
// turn from the claim of a new activation (store.ClaimActivationParams.First),
// and that turn sees the state and transcript tail the turns before it
// committed, as a dispatched one would.
func TestAFirstTurnTakenByTheClaimCarriesTheSessionsStateAndTranscript(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		cs := &dispatchCounter{Store: st}
		tails := make(chan int, 16)
		fn := func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			tails <- len(req.Transcript)
			return counter(ctx, req)
		}
		f := start(t, cs, map[string]abi.TurnFunc{"c": fn}, testPolicy())
		ag := f.agent("c")
		key := f.session(ag)
		const turns = 3
		for i := range turns {
			f.signal(key, fmt.Sprintf("m%d", i))
			f.waitFor("the turn", func() bool { return f.get(key).TurnCount == int64(i+1) })
			if got := recv(t, tails); got != 2*i {
				t.Errorf("turn %d saw %d transcript messages, want %d", i+1, got, 2*i)
			}
			f.waitFor("the activation's idle stop", func() bool {
				cur, err := st.CurrentActivation(context.Background(), key)
				return err == nil && !cur.Live()
			})
		}
		ts := f.transcript(key)
		for i, tr := range ts {
			if got, want := tr.Messages[len(tr.Messages)-1].Content, fmt.Sprintf("%d: m%d", i+1, i); got != want {
				t.Errorf("turn %d replied %q, want %q (state carried)", i+1, got, want)
			}
		}
		if n := cs.first.Load(); n != turns-1 {
			t.Errorf("%d turns taken by their activation's claim, want %d", n, turns-1)
		}
	})
}

// TestTwoHostsWokenForTheSameSessionsRunEachFirstTurnOnce: two hosts over
// one store, both expecting the agent, are both told of signals to many
// idle sessions at once, so that their controllers race to claim each
// session with its first turn (store.ClaimActivationParams.First): each
// event runs on a worker exactly once, at its first attempt, under one
// epoch per session (docs/DESIGN.md invariant 1).
func TestTwoHostsWokenForTheSameSessionsRunEachFirstTurnOnce(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		var mu sync.Mutex
		runs := map[string]int{}
		fn := func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			mu.Lock()
			runs[req.Event.Message]++
			mu.Unlock()
			return echoAs("r")(ctx, req)
		}
		funcs := map[string]abi.TurnFunc{"r": fn}
		pol := testPolicy()
		pol.IdleTimeout = time.Minute // the warm activations stay, each on its host
		fa := runHost(t, host.Options{Store: st, Runner: funcRunner{funcs}, Policy: pol, Logger: quietLogger(), HostID: "a"})
		fb := runHost(t, host.Options{Store: st, Runner: funcRunner{funcs}, Policy: pol, Logger: quietLogger(), HostID: "b"})
		ag := fa.agent("r")
		// Each host runs the agent once: both expect it.
		for i, f := range []*fixture{fa, fb} {
			key := f.session(ag)
			payload := fmt.Sprintf(`{"message":"warm%d"}`, i)
			e, _, err := st.AppendEvent(context.Background(), store.AppendEventParams{Key: key, Kind: abi.EventMessage, Payload: []byte(payload)})
			if err != nil {
				t.Fatal(err)
			}
			f.h.Appended(e)
			f.waitFor("the warm-up turn", func() bool { return f.get(key).TurnCount == 1 })
		}
		const sessions = 24
		keys := make([]store.ActorKey, sessions)
		events := make([]store.Event, sessions)
		for i := range keys {
			keys[i] = fa.session(ag)
			payload := fmt.Sprintf(`{"message":"s%d"}`, i)
			e, _, err := st.AppendEvent(context.Background(), store.AppendEventParams{Key: keys[i], Kind: abi.EventMessage, Payload: []byte(payload)})
			if err != nil {
				t.Fatal(err)
			}
			events[i] = e
		}
		var wg sync.WaitGroup
		for _, f := range []*fixture{fa, fb} {
			wg.Go(func() {
				for _, e := range events {
					f.h.Appended(e)
				}
			})
		}
		wg.Wait()
		for i, key := range keys {
			fa.waitFor("each session's turn", func() bool { return fa.get(key).TurnCount == 1 })
			for _, e := range fa.events(key) {
				if e.Status != store.EventDone || e.Attempts != 0 {
					t.Errorf("session %d: event %d is %s after %d failed attempts, want done after none", i, e.ID, e.Status, e.Attempts)
				}
			}
			if ts := fa.transcript(key); len(ts) != 1 {
				t.Errorf("session %d: %d turns", i, len(ts))
			}
			wantSoundStream(t, st, key)
		}
		mu.Lock()
		defer mu.Unlock()
		for i := range sessions {
			if n := runs[fmt.Sprintf("s%d", i)]; n != 1 {
				t.Errorf("session %d's event ran %d times on a worker, want once", i, n)
			}
		}
	})
}
