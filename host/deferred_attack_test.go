package host_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/store"
)

// partlyInProcess is a runner whose binding "remote" does not run in this
// process (a plugin or a remote pool would not): its turns must never be
// dispatched deferred (invariant 9: the delivery is written before the
// turn's bytes leave the host).
type partlyInProcess struct{ funcRunner }

func (partlyInProcess) InProcess(b string) bool { return b != "remote" }

// TestAnAgentMovedOutOfProcessIsNeverDispatchedDeferred: the agent runs an
// in-process binding, then (its activation live) is updated to one that
// does not run in this process. The next event's turn must be written
// (turn.started, its delivery sent) before the worker receives it.
func TestAnAgentMovedOutOfProcessIsNeverDispatchedDeferred(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		var unwritten, ran atomic.Int32
		remote := func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			// The bytes have "left the host": the turn must be written.
			key := store.ActorKey{AgentUID: req.TurnRef.AgentUID, SessionID: req.TurnRef.SessionID}
			pg, err := st.StreamFrames(context.Background(), store.StreamFramesParams{Key: key, Limit: 1000})
			if err != nil {
				return nil, err
			}
			found := false
			for _, fr := range pg.Frames {
				if fr.Kind == store.FrameTurnStarted && fr.EventID == req.TurnRef.ActorEventID {
					found = true
				}
			}
			if !found {
				unwritten.Add(1)
			}
			ran.Add(1)
			return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "remote"}}}, nil
		}
		pol := testPolicy()
		pol.IdleTimeout = time.Minute // the activation stays live across the update
		pol.LeaseTTL = 30 * time.Second
		f := runHost(t, host.Options{Store: st, Runner: partlyInProcess{funcRunner{map[string]abi.TurnFunc{
			"local": counter, "remote": remote}}}, Policy: pol, Logger: quietLogger()})
		a := f.agent("local")
		key := f.session(a)
		f.signal(key, "one")
		f.waitFor("the first turn", func() bool { return f.get(key).TurnCount == 1 })
		ctx := context.Background()
		if _, _, err := st.PutModule(ctx, store.PutModuleParams{Digest: "remote", ABIVersion: abi.Version, Bytes: []byte("remote")}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.CreateAgent(ctx, store.CreateAgentParams{UID: a.UID, Name: a.Name, ModuleDigest: "remote",
			CrashPolicy: store.CrashRestart, Upsert: true}); err != nil {
			t.Fatal(err)
		}
		f.signal(key, "two")
		f.waitFor("the second turn", func() bool { return f.get(key).TurnCount == 2 })
		if ran.Load() != 1 {
			t.Fatalf("remote ran %d times", ran.Load())
		}
		if n := unwritten.Load(); n != 0 {
			t.Fatalf("a turn of a binding that does not run in this process reached its worker unwritten (deferred): invariant 9")
		}
	})
}

// flakyPromoteStore fails its first Promote with a transient error (the
// store unreachable for a moment): not a refusal.
type flakyPromoteStore struct {
	store.Store
	n atomic.Int32
}

func (s *flakyPromoteStore) Promote(ctx context.Context, p store.PromoteParams) error {
	if s.n.Add(1) == 1 {
		return errors.New("transient: connection reset by peer")
	}
	return s.Store.Promote(ctx, p)
}

// TestATransientPromotionErrorIsNotChargedToTheEvent: the timer's
// promotion (PromoteAfter) fails for a moment (not a fence refusal). The
// promotion doc says the turn is aborted only when its promotion is
// refused; a store blip must not cost the event a counted attempt.
func TestATransientPromotionErrorIsNotChargedToTheEvent(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		slow := func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			select {
			case <-time.After(300 * time.Millisecond): // past PromoteAfter, no host call
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "done"}}}, nil
		}
		fs := &flakyPromoteStore{Store: st}
		pol := testPolicy()
		pol.PromoteAfter = 50 * time.Millisecond
		f := start(t, fs, map[string]abi.TurnFunc{"slow": slow}, pol)
		key := f.session(f.agent("slow"))
		warm := f.signal(key, "warm") // the first dispatch of an activation has no expectation: not deferred
		_ = warm
		f.waitFor("the warm turn", func() bool { return f.get(key).TurnCount == 1 })
		e := f.signal(key, "one")
		f.waitFor("the turn", func() bool { return f.get(key).TurnCount == 2 })
		if fs.n.Load() == 0 {
			t.Skip("the turn was not deferred")
		}
		pg, err := st.StreamFrames(context.Background(), store.StreamFramesParams{Key: key, Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		for _, fr := range pg.Frames {
			if fr.EventID == e.ID && fr.Kind == store.FrameTurnRetrying {
				t.Fatalf("a transient promotion error aborted the turn and counted a failed attempt (frame %s %s)", fr.Kind, fr.Body)
			}
		}
	})
}

// boomRunner's instances panic (a bug in a worker adapter, in the
// controller's goroutine) on the message "boom" and answer any other.
type boomRunner struct {
	funcRunner
	panics *atomic.Int32
}

func (r boomRunner) Instantiate(_ context.Context, binding string) (host.Instance, error) {
	return boomInstance{r.panics}, nil
}

type boomInstance struct{ panics *atomic.Int32 }

func (i boomInstance) Turn(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
	if req.Event.Message == "boom" {
		i.panics.Add(1)
		panic("bug in a worker adapter")
	}
	return funcInstance{counter}.Turn(ctx, req)
}

func (boomInstance) Close(context.Context) error { return nil }

// TestAPanickingDeferredTurnIsFailedLikeAnyOther: a controller panic in a
// turn is the attempt's failure, counted as a crash past the restart
// intensity ("Fault domains"), so the event ends dead-lettered after
// MaxAttempts. A deferred turn (not written when it panics) must not
// escape that: it is written before its failure is, so that every panic,
// the first included, is in the event's error chain.
func TestAPanickingDeferredTurnIsFailedLikeAnyOther(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		var panics atomic.Int32
		pol := testPolicy()
		pol.LeaseTTL = time.Second
		f := runHost(t, host.Options{Store: st, Runner: boomRunner{panics: &panics}, Policy: pol, Logger: quietLogger()})
		key := f.session(f.agent("b"))
		f.signal(key, "warm") // sets the host's expectation: the next dispatches are deferred
		f.waitFor("the warm turn", func() bool { return f.get(key).TurnCount == 1 })
		e := f.signal(key, "boom")
		event := func() store.Event {
			for _, ev := range f.events(key) {
				if ev.ID == e.ID {
					return ev
				}
			}
			t.Fatalf("event %d not found", e.ID)
			return store.Event{}
		}
		f.waitFor("the event dead-lettered", func() bool { return event().Status == store.EventDeadLetter })
		errs, err := st.EventErrors(context.Background(), key, e.ID)
		if err != nil {
			t.Fatal(err)
		}
		counted := 0
		for _, ae := range errs {
			if ae.Counted {
				counted++
			}
		}
		if n := int(panics.Load()); len(errs) != n || counted != pol.MaxAttempts {
			t.Fatalf("%d panics, %d in the error chain of which %d counted; want every panic recorded and %d counted", n, len(errs), counted, pol.MaxAttempts)
		}
	})
}
