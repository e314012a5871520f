package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/pgtest"
	"github.com/paddock-dev/paddock/store/postgres"
)

// TestGroupedActivationClaimsWithMixedOutcomes: claims released at once,
// each asking for its first turn, of sessions in every state a claim can
// meet — due, sleeping, destroyed, claimed meanwhile at another epoch,
// with nothing open — each get their own answer whatever shares their
// batch: a refused claim raises no epoch and takes nothing, a claim at an
// epoch other than its First's takes nothing, and no event is taken
// twice (invariant 1; store.ClaimActivationParams.First).
func TestGroupedActivationClaimsWithMixedOutcomes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := postgres.Open(ctx, pgtest.DSN(t))
	must(t, err, "Open")
	t.Cleanup(func() { _ = s.Close() })
	f := newFixtureOn(t, s)
	f.key = f.session(f.key.AgentUID)
	f.append("warm")
	warm := f.claim(time.Hour)
	d, err := s.NextDelivery(ctx, store.NextDeliveryParams{Activation: warm.Ref(), DeliveryID: uuid.NewString(),
		Binding: "sha256:test", MarkSent: true})
	must(t, err, "NextDelivery")
	expect := &store.ExpectedBinding{Agent: d.Agent, Binding: "sha256:test"}
	const (
		due = iota
		sleeping
		destroyed
		staleEpoch
		empty
		kinds
	)
	const rounds = 4
	for round := range rounds {
		const n = 5 * kinds
		keys := make([]store.ActorKey, n)
		epochs := make([]int64, n)
		for i := range keys {
			keys[i] = f.session(f.key.AgentUID)
			f.key = keys[i]
			if i%kinds != empty {
				f.append(fmt.Sprintf("r%d-s%d", round, i))
			}
			switch i % kinds {
			case sleeping:
				_, err := s.SleepSession(ctx, store.SleepSessionParams{Key: keys[i], Reason: store.SleepReasonAgent})
				must(t, err, "SleepSession")
			case destroyed:
				_, err := s.DestroySession(ctx, keys[i])
				must(t, err, "DestroySession")
			case staleEpoch:
				// Claimed and stopped since the caller's peek.
				a := f.claim(time.Hour)
				must(t, s.StopActivation(ctx, a.Ref()), "StopActivation")
			}
			sess, err := s.GetSession(ctx, keys[i])
			must(t, err, "GetSession")
			epochs[i] = sess.ActorEpoch
		}
		type result struct {
			a   store.Activation
			err error
		}
		results := make([]result, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range keys {
			wg.Go(func() {
				p := store.ClaimActivationParams{Key: keys[i], UID: uuid.NewString(), LeaseID: uuid.NewString(),
					HostID: "host", LeaseTTL: time.Hour}
				peek := epochs[i]
				if i%kinds == staleEpoch {
					peek-- // the caller read the session before the other claim
				}
				p.First = &store.NextDeliveryParams{Activation: store.ActivationRef{UID: p.UID, ActorKey: keys[i],
					ActorEpoch: peek + 1, LeaseID: p.LeaseID}, DeliveryID: uuid.NewString(), MarkSent: true, TailMessages: 10,
					ExpectDue: true, Expect: expect}
				<-start
				a, err := s.ClaimActivation(ctx, p)
				results[i] = result{a, err}
			})
		}
		close(start)
		wg.Wait()
		for i, r := range results {
			sess, err := s.GetSession(ctx, keys[i])
			must(t, err, "GetSession")
			switch i % kinds {
			case due:
				want := fmt.Sprintf(`{"message": "r%d-s%d"}`, round, i)
				if r.err != nil || r.a.ActorEpoch != epochs[i]+1 || r.a.First == nil ||
					string(r.a.First.Event.Payload) != want || r.a.First.Attempt != 1 {
					t.Errorf("round %d session %d (due): %+v, %v; want epoch %d and its event", round, i, r.a, r.err, epochs[i]+1)
				}
			case sleeping:
				if !errors.Is(r.err, store.ErrSessionSleeping) || sess.ActorEpoch != epochs[i] {
					t.Errorf("round %d session %d (sleeping): %+v, %v, epoch %d → %d; want ErrSessionSleeping", round, i, r.a, r.err, epochs[i], sess.ActorEpoch)
				}
			case destroyed:
				if !errors.Is(r.err, store.ErrSessionDestroyed) && !errors.Is(r.err, store.ErrNotFound) || sess.ActorEpoch != epochs[i] {
					t.Errorf("round %d session %d (destroyed): %+v, %v, epoch %d → %d; want a refusal", round, i, r.a, r.err, epochs[i], sess.ActorEpoch)
				}
			case staleEpoch:
				if r.err != nil || r.a.ActorEpoch != epochs[i]+1 || r.a.First != nil {
					t.Errorf("round %d session %d (stale epoch): %+v (first %+v), %v; want claimed at %d, nothing taken", round, i, r.a, r.a.First, r.err, epochs[i]+1)
				}
			case empty:
				if r.err != nil || r.a.ActorEpoch != epochs[i]+1 || r.a.First != nil {
					t.Errorf("round %d session %d (nothing open): %+v, %v; want claimed, nothing taken", round, i, r.a, r.err)
				}
			}
			if i%kinds == sleeping || i%kinds == destroyed {
				continue
			}
			// No event was taken but by a due session's First.
			evs, err := s.ListEvents(ctx, store.ListEventsParams{Key: keys[i], Limit: 10})
			must(t, err, "ListEvents")
			for _, e := range evs {
				if i%kinds != due && e.Binding != "" {
					t.Errorf("round %d session %d: event %d bound (%q) by a claim that took nothing", round, i, e.ID, e.Binding)
				}
			}
		}
	}
}
