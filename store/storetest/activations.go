package storetest

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

func activationCases() []testCase {
	return []testCase{
		{"Invariant1/SecondClaimIsActivationLiveAndRollsBackItsEpoch", testSecondClaim},
		{"Invariant1/ClaimRaceOf32ExactlyOneWins", testClaimRace},
		{"Invariant2/EpochsStrictlyIncreaseAcrossClaimsFailuresAndExpiries", testEpochsIncrease},
		{"Claim/UnknownSessionNotFound", testClaimUnknown},
		{"RenewLeases/RenewsOnlyMatchingLiveUnexpiredRefsOfTheHost", testRenewLeases},
		{"CommitTurn/LeaseTTLRenewsTheLeaseNeverShortensIt", testCommitRenewsLease},
		{"StopActivation/CompareAndSetOnIdleLiveActivation", testStopActivation},
		{"NextDelivery/RequiresLiveIdleUnexpiredActivation", testNextDeliveryLiveness},
	}
}

func testSecondClaim(t *testing.T, b *bundle) {
	key := b.session()
	first := b.claim(key, LongTTL)
	wantEq(t, first.ActorEpoch, int64(1), "first epoch")
	wantEq(t, first.State, store.ActivationActive, "State")
	wantEq(t, first.Revision, int64(0), "Revision")
	wantEq(t, first.CurrentEventID, int64(0), "CurrentEventID")
	wantEq(t, first.HostID, b.host, "HostID")
	wantEq(t, first.ActorKey, key, "ActorKey")
	if first.UID == "" || first.LeaseID == "" || first.LeaseExpiresAt.IsZero() {
		t.Fatalf("claim returned %+v", first)
	}

	for range 3 {
		_, err := b.s.ClaimActivation(b.ctx, store.ClaimActivationParams{
			Key: key, UID: uuid.NewString(), LeaseID: uuid.NewString(), HostID: "other-host", LeaseTTL: LongTTL,
		})
		wantIs(t, err, store.ErrActivationLive, "second claim")
	}
	wantEq(t, b.getSession(key).ActorEpoch, first.ActorEpoch, "session epoch after refused claims")

	// Another session is independent.
	b.claim(b.session(), LongTTL)

	noErr(t, b.s.StopActivation(b.ctx, first.Ref()), "StopActivation")
	second := b.claim(key, LongTTL)
	wantEq(t, second.ActorEpoch, first.ActorEpoch+1, "epoch after stop and re-claim")
}

func testClaimRace(t *testing.T, b *bundle) {
	key := b.session()
	const n = 32
	acts := make([]store.Activation, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			acts[i], errs[i] = b.s.ClaimActivation(b.ctx, store.ClaimActivationParams{
				Key: key, UID: uuid.NewString(), LeaseID: uuid.NewString(), HostID: fmt.Sprintf("host-%d", i), LeaseTTL: LongTTL,
			})
		})
	}
	close(start)
	wg.Wait()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil:
			if winner >= 0 {
				t.Fatalf("claims %d and %d both won", winner, i)
			}
			winner = i
		case errors.Is(err, store.ErrActivationLive):
		default:
			t.Fatalf("claim %d: unexpected error %v", i, err)
		}
	}
	if winner < 0 {
		t.Fatalf("no claim won")
	}
	wantEq(t, acts[winner].ActorEpoch, int64(1), "winner epoch")
	wantEq(t, b.getSession(key).ActorEpoch, int64(1), "session epoch: losers' bumps rolled back")
	// The winner really holds the key.
	b.message(key, "x")
	b.commit(b.next(acts[winner]).Delivery.TurnRef(), "ok", "")
}

func testEpochsIncrease(t *testing.T, b *bundle) {
	key := b.session()
	var epochs []int64
	see := func(a store.Activation, what string) {
		t.Helper()
		if n := len(epochs); n > 0 && a.ActorEpoch <= epochs[n-1] {
			t.Fatalf("%s: epoch %d does not exceed %d", what, a.ActorEpoch, epochs[n-1])
		}
		epochs = append(epochs, a.ActorEpoch)
		wantEq(t, b.getSession(key).ActorEpoch, a.ActorEpoch, what+": session epoch is the highest issued")
	}

	a := b.claim(key, LongTTL)
	see(a, "first claim")
	noErr(t, b.s.StopActivation(b.ctx, a.Ref()), "StopActivation")

	a = b.claim(key, LongTTL)
	see(a, "claim after stop")
	b.message(key, "poison")
	d := b.next(a)
	b.fail(d.Delivery.TurnRef(), true, 0, 10)

	a = b.claim(key, SetupTTL)
	see(a, "claim after a failed attempt")
	d = b.next(a)
	wantEq(t, d.Attempt, 2, "attempt after a failure")
	b.waitExpired(a)
	_, err := b.s.ExpireActivation(b.ctx, store.ExpireActivationParams{Ref: a.Ref(), MaxAttempts: 10})
	noErr(t, err, "ExpireActivation")

	a = b.claim(key, LongTTL)
	see(a, "claim after an expiry")
	_, err = b.s.ClaimActivation(b.ctx, store.ClaimActivationParams{
		Key: key, UID: uuid.NewString(), LeaseID: uuid.NewString(), HostID: b.host, LeaseTTL: LongTTL,
	})
	wantIs(t, err, store.ErrActivationLive, "refused claim")
	wantEq(t, b.getSession(key).ActorEpoch, a.ActorEpoch, "a refused claim does not raise the epoch")
	d = b.next(a)
	wantEq(t, d.Delivery.ActorEpoch, a.ActorEpoch, "delivery carries the activation epoch")
	wantEq(t, d.Attempt, 3, "attempt after failure and expiry")
}

func testClaimUnknown(t *testing.T, b *bundle) {
	_, err := b.s.ClaimActivation(b.ctx, store.ClaimActivationParams{
		Key: store.ActorKey{AgentUID: b.agent.UID, SessionID: "missing"}, UID: uuid.NewString(),
		LeaseID: uuid.NewString(), HostID: b.host, LeaseTTL: LongTTL,
	})
	wantIs(t, err, store.ErrNotFound, "claim of an unknown session")
}

func testRenewLeases(t *testing.T, b *bundle) {
	c := b.claim(b.session(), ShortTTL)
	other := b.claimOn(b.session(), "other-host", ShortTTL)
	aKey := b.session()
	// a's lease is long enough not to run out before the renewal on a
	// loaded machine (ShortTTL did), and short enough that its check
	// below, past its end, shows the renewal extended it.
	const aTTL = 2 * time.Second
	a := b.claim(aKey, aTTL)
	aEnd := time.Now().Add(aTTL)

	wrongLease := c.Ref()
	wrongLease.LeaseID = uuid.NewString()
	wrongEpoch := c.Ref()
	wrongEpoch.ActorEpoch++
	wrongKey := c.Ref()
	wrongKey.SessionID = other.SessionID
	unknown := a.Ref()
	unknown.UID = uuid.NewString()

	renewed, err := b.s.RenewLeases(b.ctx, store.RenewLeasesParams{
		HostID: b.host, LeaseTTL: LongTTL,
		Refs: []store.ActivationRef{wrongLease, a.Ref(), wrongEpoch, other.Ref(), wrongKey, unknown},
	})
	noErr(t, err, "RenewLeases")
	if len(renewed) != 1 || renewed[0] != a.Ref() {
		t.Fatalf("RenewLeases renewed %+v, want only %+v", renewed, a.Ref())
	}

	b.waitExpired(c, other)
	time.Sleep(time.Until(aEnd) + 100*time.Millisecond)
	expired, err := b.s.ExpiredActivations(b.ctx, 100)
	noErr(t, err, "ExpiredActivations")
	if slices.Contains(expired, a.Ref()) {
		t.Fatalf("the renewed activation expired with its old lease")
	}

	// An expired lease is not renewed: the watchdog owns it now.
	renewed, err = b.s.RenewLeases(b.ctx, store.RenewLeasesParams{HostID: b.host, LeaseTTL: LongTTL, Refs: []store.ActivationRef{c.Ref(), a.Ref()}})
	noErr(t, err, "RenewLeases of an expired lease")
	if len(renewed) != 1 || renewed[0] != a.Ref() {
		t.Fatalf("RenewLeases renewed %+v, want only %+v", renewed, a.Ref())
	}
	renewed, err = b.s.RenewLeases(b.ctx, store.RenewLeasesParams{HostID: b.host, LeaseTTL: LongTTL})
	noErr(t, err, "RenewLeases of nothing")
	wantEq(t, len(renewed), 0, "renewed of nothing")

	// A stopped activation is not renewed.
	noErr(t, b.s.StopActivation(b.ctx, a.Ref()), "StopActivation")
	renewed, err = b.s.RenewLeases(b.ctx, store.RenewLeasesParams{HostID: b.host, LeaseTTL: LongTTL, Refs: []store.ActivationRef{a.Ref()}})
	noErr(t, err, "RenewLeases of a stopped activation")
	wantEq(t, len(renewed), 0, "renewed stopped activations")
}

func testStopActivation(t *testing.T, b *bundle) {
	key := b.session()
	a := b.claim(key, LongTTL)
	b.message(key, "busy")
	d := b.next(a)
	wantIs(t, b.s.StopActivation(b.ctx, a.Ref()), store.ErrNotLive, "stop with a current event")
	b.commit(d.Delivery.TurnRef(), "done", "")

	wrong := a.Ref()
	wrong.LeaseID = uuid.NewString()
	wantIs(t, b.s.StopActivation(b.ctx, wrong), store.ErrNotLive, "stop with another lease id")
	wrong = a.Ref()
	wrong.ActorEpoch++
	wantIs(t, b.s.StopActivation(b.ctx, wrong), store.ErrNotLive, "stop with another epoch")

	noErr(t, b.s.StopActivation(b.ctx, a.Ref()), "StopActivation")
	wantIs(t, b.s.StopActivation(b.ctx, a.Ref()), store.ErrNotLive, "second stop")
	_, err := b.tryNext(a, true, "")
	wantIs(t, err, store.ErrNotLive, "NextDelivery on a stopped activation")
	renewed, err := b.s.RenewLeases(b.ctx, store.RenewLeasesParams{HostID: b.host, LeaseTTL: LongTTL, Refs: []store.ActivationRef{a.Ref()}})
	noErr(t, err, "RenewLeases")
	wantEq(t, len(renewed), 0, "renewed after stop")
	b.claim(key, LongTTL)
}

func testNextDeliveryLiveness(t *testing.T, b *bundle) {
	key := b.session()
	a := b.claim(key, LongTTL)

	_, err := b.tryNext(a, true, "")
	nd := wantNoDue(t, err, "NextDelivery without events")
	if !nd.NextDueAt.IsZero() {
		t.Fatalf("NoDueEventError.NextDueAt = %v with no open event, want zero", nd.NextDueAt)
	}

	ev := b.message(key, "hi")
	wrong := a
	wrong.LeaseID = uuid.NewString()
	_, err = b.tryNext(wrong, true, "")
	wantIs(t, err, store.ErrNotLive, "NextDelivery with another lease id")
	wrong = a
	wrong.ActorEpoch++
	_, err = b.tryNext(wrong, true, "")
	wantIs(t, err, store.ErrNotLive, "NextDelivery with another epoch")
	wrong = a
	wrong.UID = uuid.NewString()
	_, err = b.tryNext(wrong, true, "")
	wantIs(t, err, store.ErrNotLive, "NextDelivery with an unknown activation")

	d := b.next(a)
	wantEq(t, d.Event.ID, ev.ID, "Event.ID")
	wantEq(t, d.Event.Status, store.EventOpen, "Event.Status")
	wantEq(t, d.Attempt, 1, "Attempt")
	wantEq(t, d.Session.ActorKey, key, "Session key")
	wantEq(t, d.Session.ActorEpoch, a.ActorEpoch, "Session epoch")
	if d.State != nil {
		t.Fatalf("State of a new session = %q, want none", d.State)
	}
	wantEq(t, len(d.Tail), 0, "Tail of a new session")
	dl := d.Delivery
	wantEq(t, dl.State, store.DeliverySent, "Delivery.State with MarkSent")
	wantEq(t, dl.ActorKey, key, "Delivery key")
	wantEq(t, dl.ActivationUID, a.UID, "Delivery.ActivationUID")
	wantEq(t, dl.ActorEpoch, a.ActorEpoch, "Delivery.ActorEpoch")
	wantEq(t, dl.EventID, ev.ID, "Delivery.EventID")
	wantEq(t, dl.Revision, a.Revision, "Delivery.Revision")
	if dl.ID == "" {
		t.Fatalf("Delivery.ID is empty")
	}

	b.message(key, "second")
	_, err = b.tryNext(a, true, "")
	wantIs(t, err, store.ErrNotLive, "NextDelivery while a turn is in flight")

	// An expired lease delivers nothing.
	b.commit(dl.TurnRef(), "ok", "")
	noErr(t, b.s.StopActivation(b.ctx, a.Ref()), "StopActivation")
	short := b.claim(key, ShortTTL)
	b.waitExpired(short)
	_, err = b.tryNext(short, true, "")
	wantIs(t, err, store.ErrNotLive, "NextDelivery under an expired lease")
	// And nothing was taken: the event is still open and unattempted.
	for _, e := range b.events(key) {
		if e.Seq == 2 && (e.Status != store.EventOpen || e.Attempts != 0 || e.Binding != "") {
			t.Fatalf("event after refused NextDelivery: %+v", e)
		}
	}
}

// testCommitRenewsLease: a commit with LeaseTTL renews the activation's
// lease to the database clock + LeaseTTL, on both commit paths (payloads
// given or read); without it, with a TTL shorter than what is left, or
// when the commit is refused, the lease stays as it was.
func testCommitRenewsLease(t *testing.T, b *bundle) {
	key := b.session()
	for _, m := range []string{"one", "two", "three", "four"} {
		b.message(key, m)
	}
	act := b.claim(key, time.Minute)
	lease := func() (store.ActivationInfo, time.Time) {
		t.Helper()
		cur, err := b.s.CurrentActivation(b.ctx, key)
		noErr(t, err, "CurrentActivation")
		return cur, cur.LeaseExpiresAt
	}
	commit := func(d store.Dispatch, ttl time.Duration, payloads bool) error {
		p := store.CommitTurnParams{Ref: d.Delivery.TurnRef(), Outcome: abi.OutcomeOK, KeepState: true,
			Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "ok"}}, LeaseTTL: ttl}
		if payloads {
			p.Payloads = []string{string(d.Event.Payload)}
		}
		_, err := b.s.CommitTurn(b.ctx, p)
		return err
	}
	_, l0 := lease()
	noErr(t, commit(b.next(act), 0, true), "commit without LeaseTTL")
	if _, l := lease(); !l.Equal(l0) {
		t.Fatalf("a commit without LeaseTTL moved the lease from %v to %v", l0, l)
	}
	for _, payloads := range []bool{false, true} {
		d := b.next(act)
		noErr(t, commit(d, time.Hour, payloads), fmt.Sprintf("commit with LeaseTTL 1h (payloads given: %v)", payloads))
		cur, l := lease()
		if left := l.Sub(cur.Now); left < 59*time.Minute || left > time.Hour {
			t.Fatalf("lease %v after a commit with LeaseTTL 1h (payloads given: %v): %v left, want about 1h", l, payloads, left)
		}
		// Replayed: refused, and the lease is not touched.
		var fe *store.FenceError
		if err := commit(d, 10*time.Hour, payloads); !errors.As(err, &fe) {
			t.Fatalf("replayed commit: %v, want a fence refusal", err)
		}
		if _, l2 := lease(); !l2.Equal(l) {
			t.Fatalf("a refused commit moved the lease from %v to %v", l, l2)
		}
	}
	_, l1 := lease()
	noErr(t, commit(b.next(act), time.Second, true), "commit with a LeaseTTL shorter than what is left")
	if _, l := lease(); !l.Equal(l1) {
		t.Fatalf("a commit with LeaseTTL 1s moved the lease from %v to %v, want it kept", l1, l)
	}
}
