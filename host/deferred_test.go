package host_test

import (
	"context"
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
