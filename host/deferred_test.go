package host_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// Deferred dispatch at the host's level (docs/DESIGN.md "Deferred
// dispatch"), on both drivers.

// sampleCount is the number of observations of h.
func sampleCount(t *testing.T, h prometheus.Histogram) uint64 {
	t.Helper()
	var d dto.Metric
	if err := h.Write(&d); err != nil {
		t.Fatalf("read histogram: %v", err)
	}
	return d.GetHistogram().GetSampleCount()
}

// TestAQuickTurnIsWrittenByItsCommitAlone: once the activation knows what
// its agent runs, a turn that only computes is dispatched by a read and
// written whole by its commit: never promoted, its stream still
// turn.started then turn.committed, its event done and bound.
func TestAQuickTurnIsWrittenByItsCommitAlone(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		fn := func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "re: " + req.Event.Message}}}, nil
		}
		pol := testPolicy()
		pol.IdleTimeout = time.Minute // one activation for every turn
		// No promotion by time: a quick turn that a loaded machine keeps
		// past the default 50 ms (a CI run saw one) would be promoted.
		pol.PromoteAfter = time.Hour
		f := start(t, st, map[string]abi.TurnFunc{"q": fn}, pol)
		ag := f.agent("q")
		key := f.session(ag)
		for i, msg := range []string{"one", "two", "three"} {
			f.signal(key, msg)
			f.waitFor("the turn of "+msg, func() bool { return f.get(key).TurnCount == int64(i+1) })
		}
		m := f.h.Metrics()
		// The first dispatch of an activation is written (it learns what
		// the agent runs); the next two are deferred.
		if n := testutil.ToFloat64(m.Deferred); n != 2 {
			t.Errorf("deferred turns = %v, want 2", n)
		}
		if n := testutil.ToFloat64(m.Promotions); n != 0 {
			t.Errorf("promotions = %v, want 0 (the turns only compute)", n)
		}
		if n := sampleCount(t, m.ActivationStartSeconds); n != 1 {
			t.Errorf("cold starts observed = %d, want 1 (one activation for the three turns)", n)
		}
		for i, tr := range f.transcript(key) {
			want := "re: " + []string{"one", "two", "three"}[i]
			if got := tr.Messages[len(tr.Messages)-1].Content; got != want {
				t.Errorf("turn %d reply %q, want %q", tr.TurnNo, got, want)
			}
		}
		for _, e := range f.events(key) {
			if e.Status != store.EventDone || e.Binding != "q" || e.Attempts != 0 {
				t.Errorf("event %d: status %s binding %q attempts %d, want done, q, 0", e.ID, e.Status, e.Binding, e.Attempts)
			}
		}
		frames := wantSoundStream(t, st, key)
		if len(frames) != 6 {
			t.Errorf("frames %d, want 6 (turn.started and turn.committed per turn)", len(frames))
		}
	})
}

// TestALongDeferredTurnIsInFlightAfterPromoteAfter: a turn that runs
// longer than promote_after is written while it runs — its turn.started is
// on the stream before it ends, and a steer reaches it — then commits as
// any turn does.
func TestALongDeferredTurnIsInFlightAfterPromoteAfter(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		release := make(chan struct{})
		fn := func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			if req.Event.Message == "long" {
				select {
				case <-release:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			reply := "re: " + req.Event.Message
			if len(req.Steers) > 0 {
				reply = "steered by " + req.Steers[0].Message
			}
			return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: reply}}}, nil
		}
		pol := testPolicy()
		pol.IdleTimeout = time.Minute
		f := start(t, st, map[string]abi.TurnFunc{"l": fn}, pol)
		ag := f.agent("l")
		key := f.session(ag)
		f.signal(key, "warm")
		f.waitFor("the warm turn", func() bool { return f.get(key).TurnCount == 1 })
		f.signal(key, "long")
		f.waitStarted(key, 2) // written while it runs
		payload := []byte(`{"message":"left"}`)
		r, err := st.Steer(context.Background(), store.SteerParams{Key: key, Payload: payload, DeliveryID: "steer-" + key.SessionID})
		if err != nil {
			t.Fatal(err)
		}
		if !r.InFlight {
			t.Fatalf("steer of a promoted turn: in_flight false")
		}
		f.h.Ensure(key)
		close(release)
		f.waitFor("the steered turn", func() bool { return f.get(key).TurnCount == 2 })
		tr := f.transcript(key)[1]
		if got := tr.Messages[len(tr.Messages)-1].Content; got != "steered by left" {
			t.Errorf("the long turn's reply %q, want the steered rerun's", got)
		}
		// Counted once Promote returned (its frame may be read before).
		if n := testutil.ToFloat64(f.h.Metrics().Promotions); n != 1 {
			t.Errorf("promotions = %v, want 1", n)
		}
		wantSoundStream(t, st, key)
	})
}

// TestADeferredTurnCancelledBeforeItIsWrittenIsDropped: a turn's event is
// cancelled while the turn is deferred (a queued cancel: nothing was in
// flight); its promotion is then refused, the turn is stopped and nothing
// of it is recorded — no transcript turn, no attempt, no error — and the
// next event runs.
func TestADeferredTurnCancelledBeforeItIsWrittenIsDropped(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		stopped := make(chan struct{}, 1)
		fn := func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			if req.Event.Message == "doomed" {
				key := store.ActorKey{AgentUID: req.TurnRef.AgentUID, SessionID: req.TurnRef.SessionID}
				cr, err := st.CancelEvent(ctx, store.CancelEventParams{Key: key, EventID: req.TurnRef.ActorEventID, Reason: "no"})
				if err != nil {
					return nil, err
				}
				if cr.InFlight {
					t.Errorf("a deferred turn's cancel: in_flight true")
				}
				<-ctx.Done() // stopped when its promotion is refused
				stopped <- struct{}{}
				return nil, ctx.Err()
			}
			return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "re: " + req.Event.Message}}}, nil
		}
		pol := testPolicy()
		pol.IdleTimeout = time.Minute
		// The promotion that finds the event cancelled is the timer's: not
		// before the cancel (a store call that took over 50 ms on a loaded
		// CI machine let the timer promote the turn first, in flight).
		pol.PromoteAfter = time.Second
		f := start(t, st, map[string]abi.TurnFunc{"d": fn}, pol)
		ag := f.agent("d")
		key := f.session(ag)
		f.signal(key, "warm")
		f.waitFor("the warm turn", func() bool { return f.get(key).TurnCount == 1 })
		doomed := f.signal(key, "doomed")
		f.signal(key, "after")
		recv(t, stopped)
		f.waitFor("the event after the cancelled one", func() bool { return f.get(key).TurnCount == 2 })
		tr := f.transcript(key)
		if got := tr[1].Messages[len(tr[1].Messages)-1].Content; got != "re: after" {
			t.Errorf("second turn %q, want the next event's", got)
		}
		for _, e := range f.events(key) {
			if e.ID == doomed.ID && (e.Status != store.EventCancelled || e.Attempts != 0) {
				t.Errorf("the cancelled event: status %s attempts %d, want cancelled, 0", e.Status, e.Attempts)
			}
		}
		if chain, err := st.EventErrors(context.Background(), key, doomed.ID); err != nil || len(chain) != 0 {
			t.Errorf("the cancelled event's error chain: %+v %v, want none (no attempt was recorded)", chain, err)
		}
		if n := testutil.ToFloat64(f.h.Metrics().FenceRejections.WithLabelValues(string(store.FenceSupersededDelivery))); n < 1 {
			t.Errorf("superseded_delivery rejections = %v, want the refused promotion", n)
		}
		wantSoundStream(t, st, key)
	})
}

// peekCounter counts the looks at a session before a claim (PeekSession).
type peekCounter struct {
	store.Store
	peeks atomic.Int64
}

func (c *peekCounter) PeekSession(ctx context.Context, key store.ActorKey) (store.SessionPeek, error) {
	c.peeks.Add(1)
	return c.Store.PeekSession(ctx, key)
}

// TestAColdStartAfterThisHostsAppendNeedsNoLook: once the host knows an
// agent (its first cold start looked) and what it runs in-process, a
// session of it woken by this host's own append is claimed without a look
// at the session, its first turn read by the claim at the epoch the claim
// gives, and run deferred like any; a session woken otherwise (another
// host's append: no hint) still looks first (docs/DESIGN.md "Deferred
// dispatch", the quick start).
func TestAColdStartAfterThisHostsAppendNeedsNoLook(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		pc := &peekCounter{Store: st}
		fn := func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "re: " + req.Event.Message}}}, nil
		}
		pol := testPolicy()
		pol.IdleTimeout = time.Minute
		f := start(t, pc, map[string]abi.TurnFunc{"q": fn}, pol)
		m := f.h.Metrics()
		ag := f.agent("q")
		first := f.session(ag)
		f.signal(first, "one")
		f.waitFor("the first session's turn", func() bool { return f.get(first).TurnCount == 1 })
		if n := pc.peeks.Load(); n != 1 {
			t.Fatalf("looks after the agent's first cold start = %d, want 1", n)
		}
		// A controller may still look: one the scan or the echo of the
		// append's notification started before the append's report
		// (Appended) carried the hint. Each cold start either looks or
		// starts quick, and within a few sessions one starts quick.
		var quick store.ActorKey
		for i := 0; i < 8 && testutil.ToFloat64(m.QuickStarts) == 0; i++ {
			quick = f.session(ag)
			f.signal(quick, "two")
			f.waitFor("the session's turn", func() bool { return f.get(quick).TurnCount == 1 })
			if looks, quicks := pc.peeks.Load(), int64(testutil.ToFloat64(m.QuickStarts)); looks+quicks != int64(i+2) {
				t.Fatalf("after %d cold starts: %d looks and %d quick starts", i+2, looks, quicks)
			}
		}
		if n := testutil.ToFloat64(m.QuickStarts); n != 1 {
			t.Fatalf("quick starts = %v in 8 cold starts woken by this host's appends, want 1", n)
		}
		starts := int(pc.peeks.Load()) + 1
		if n := sampleCount(t, m.ActivationStartSeconds); n != uint64(starts) {
			t.Errorf("cold starts observed = %d, want %d", n, starts)
		}
		if ts := f.transcript(quick); len(ts) != 1 || ts[0].Messages[len(ts[0].Messages)-1].Content != "re: two" {
			t.Fatalf("transcript of the quick start: %+v, want one turn answering two", ts)
		}
		sess := f.get(quick)
		for _, e := range f.events(quick) {
			if e.Status != store.EventDone || e.Binding != "q" || e.Attempts != 0 {
				t.Errorf("event %d: status %s binding %q attempts %d, want done, q, 0", e.ID, e.Status, e.Binding, e.Attempts)
			}
		}
		if sess.ActorEpoch != 1 {
			t.Errorf("the quick start's session epoch = %d, want 1 (one claim)", sess.ActorEpoch)
		}
		wantSoundStream(t, st, quick)

		// Appended elsewhere (no hint for this host): the look as before.
		other := f.session(ag)
		looks := pc.peeks.Load()
		if _, _, err := st.AppendEvent(context.Background(), store.AppendEventParams{Key: other, Kind: abi.EventMessage,
			Payload: []byte(`{"message":"three"}`)}); err != nil {
			t.Fatal(err)
		}
		f.h.Ensure(other)
		f.waitFor("the last session's turn", func() bool { return f.get(other).TurnCount == 1 })
		if n := pc.peeks.Load(); n != looks+1 {
			t.Errorf("looks after a cold start without this host's append = %d, want %d", n, looks+1)
		}
		if n := testutil.ToFloat64(m.QuickStarts); n != 1 {
			t.Errorf("quick starts = %v, want still 1", n)
		}
	})
}
