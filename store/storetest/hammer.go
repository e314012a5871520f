package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// hammerCases race claims, commits, the watchdog, lease renewal, appends and
// the lifecycle writes from many goroutines against one store, then check
// the invariants on what the storm left. Counts are bounded (a few hundred
// calls per case); nothing is timed, only outcomes are asserted. Run them
// alone with -run 'TestConformance/hammer'.
func hammerCases() []testCase {
	return []testCase{
		{"hammer/ClaimRoundsExactlyOneWinsPerKeyEpochsDense", testHammerClaimRounds},
		{"hammer/ClaimStormNeverTwoLiveActivationsWhileTurnsCommit", testHammerClaimStorm},
		{"hammer/CommitsRaceWatchdogEachEventDoneOnceAttemptsCounted", testHammerCommitsRaceWatchdog},
		{"hammer/RenewLeasesRaceWatchdogLostLeaseNeverCommits", testHammerRenewRacesWatchdog},
		{"hammer/ConcurrentAppendsSeqDenseIdempotentFirstWins", testHammerAppends},
		{"hammer/LifecycleOpsRacingTurnsReturnAndCountersAgree", testHammerLifecycle},
	}
}

// hammerDeadline bounds how long a storm may wait for another goroutine's
// progress (the watchdog expiring a lapsed lease) before it reports the
// wait as a failure instead of hanging. It is a liveness guard, not a
// timing assertion: no healthy run comes near it.
const hammerDeadline = 60 * time.Second

// unexpected reports an error no racer should see; a call that ran into
// its deadline is named as such (a lock that was never released).
func unexpected(t *testing.T, what string, err error) {
	t.Helper()
	if errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("%s did not return within the store's call timeout (deadlock?): %v", what, err)
		return
	}
	t.Errorf("%s: unexpected error: %v", what, err)
}

// isAny reports whether err is one of targets.
func isAny(err error, targets ...error) bool {
	for _, target := range targets {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

// lateFence reports whether err is the fence of a reply whose lease ran
// out: expired_lease (still live by state) or stale_epoch (the watchdog
// failed the activation first).
func lateFence(err error) bool {
	var fe *store.FenceError
	return errors.As(err, &fe) && (fe.Reason == store.FenceExpiredLease || fe.Reason == store.FenceStaleEpoch)
}

func claimParams(key store.ActorKey, host string, ttl time.Duration) store.ClaimActivationParams {
	return store.ClaimActivationParams{Key: key, UID: uuid.NewString(), LeaseID: uuid.NewString(), HostID: host, LeaseTTL: ttl}
}

func nextParams(a store.Activation) store.NextDeliveryParams {
	return store.NextDeliveryParams{Activation: a.Ref(), DeliveryID: uuid.NewString(), Binding: "sha256:hammer",
		MarkSent: true, TailMessages: 2}
}

func commitParams(ref abi.TurnRef) store.CommitTurnParams {
	return store.CommitTurnParams{Ref: ref, Outcome: abi.OutcomeOK, State: []byte(ref.DeliveryID),
		Messages: []abi.Message{{Role: abi.RoleAssistant, Content: fmt.Sprintf("reply to %d", ref.ActorEventID)}}}
}

// testHammerClaimRounds: in each round eight racers claim three free keys
// at once, each key in its own random order. Per key exactly one claim wins
// and the others get ErrActivationLive; the winner's epoch is the previous
// winner's + 1 (refused claims roll their epoch back) and is the session's.
// The winner then ends its activation by a stop, a committed turn and a
// stop, or a failed attempt, so the next round races on a free key again.
func testHammerClaimRounds(t *testing.T, b *bundle) {
	const racers, rounds, nkeys = 8, 9, 3
	keys := make([]store.ActorKey, nkeys)
	for i := range keys {
		keys[i] = b.session()
	}
	last := make([]int64, nkeys)
	commits := make([]int64, nkeys)
	for r := range rounds {
		acts := make([][]store.Activation, racers)
		errs := make([][]error, racers)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range racers {
			acts[i], errs[i] = make([]store.Activation, nkeys), make([]error, nkeys)
			wg.Go(func() {
				<-start
				for _, k := range rand.Perm(nkeys) {
					acts[i][k], errs[i][k] = b.s.ClaimActivation(b.ctx, claimParams(keys[k], fmt.Sprintf("host-%d", i), LongTTL))
				}
			})
		}
		close(start)
		wg.Wait()
		for k, key := range keys {
			winner := -1
			for i := range racers {
				switch err := errs[i][k]; {
				case err == nil:
					if winner >= 0 {
						t.Fatalf("round %d key %d: racers %d and %d both claimed (epochs %d and %d)",
							r, k, winner, i, acts[winner][k].ActorEpoch, acts[i][k].ActorEpoch)
					}
					winner = i
				case errors.Is(err, store.ErrActivationLive):
				default:
					t.Fatalf("round %d key %d racer %d: ClaimActivation: %v, want nil or ErrActivationLive", r, k, i, err)
				}
			}
			if winner < 0 {
				t.Fatalf("round %d key %d: no claim of a free key won", r, k)
			}
			a := acts[winner][k]
			wantEq(t, a.ActorKey, key, "winner's key")
			wantEq(t, a.HostID, fmt.Sprintf("host-%d", winner), "winner's host")
			wantEq(t, a.ActorEpoch, last[k]+1, fmt.Sprintf("round %d key %d: winner's epoch", r, k))
			wantEq(t, b.getSession(key).ActorEpoch, a.ActorEpoch, fmt.Sprintf("round %d key %d: session epoch", r, k))
			last[k] = a.ActorEpoch
			switch r % 3 {
			case 0:
				noErr(t, b.s.StopActivation(b.ctx, a.Ref()), "StopActivation")
			case 1:
				b.message(key, fmt.Sprintf("round %d", r))
				b.commit(b.next(a).Delivery.TurnRef(), "ok", "")
				commits[k]++
				noErr(t, b.s.StopActivation(b.ctx, a.Ref()), "StopActivation after a turn")
			case 2:
				b.message(key, fmt.Sprintf("round %d", r))
				b.fail(b.next(a).Delivery.TurnRef(), true, 0, 100)
			}
		}
	}
	for k, key := range keys {
		s := b.getSession(key)
		wantEq(t, s.ActorEpoch, int64(rounds), "session epoch after the rounds")
		wantEq(t, s.TurnCount, commits[k], "TurnCount")
		wantEq(t, int64(len(b.transcript(key))), commits[k], "transcript turns")
		// Every round of kind 1 and 2 appended one event; commits took the
		// oldest open one, so the failed ones were retried and committed.
		wantEq(t, s.EventCount, int64(2*rounds/3), "EventCount")
		wantEq(t, s.OpenEvents, s.EventCount-commits[k], "OpenEvents")
	}
}

// testHammerClaimStorm: ten workers claim three keys in a loop while
// the winners append, dispatch and commit turns (or fail them) under
// long leases. A winner marks its key held right after its claim returns
// and clears the mark before it ends the activation, so a claim that wins
// while the mark is set won while another activation was live (invariant
// 1). Every other claim gets ErrActivationLive, every commit succeeds, the
// epochs of a key are issued densely in the order the key was held, and the
// session ends at the last one (no refused claim's bump survives).
func testHammerClaimStorm(t *testing.T, b *bundle) {
	const workers, claimsPer, nkeys = 10, 16, 3
	keys := make([]store.ActorKey, nkeys)
	for i := range keys {
		keys[i] = b.session()
	}
	holder := make([]atomic.Int64, nkeys)
	var mu sync.Mutex
	epochs := make([][]int64, nkeys)
	commits := make([]int64, nkeys)
	var refused atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		host := fmt.Sprintf("host-%d", w)
		wg.Go(func() {
			for range claimsPer {
				k := rand.N(nkeys)
				a, err := b.s.ClaimActivation(b.ctx, claimParams(keys[k], host, LongTTL))
				if errors.Is(err, store.ErrActivationLive) {
					refused.Add(1)
					continue
				}
				if err != nil {
					unexpected(t, "ClaimActivation", err)
					return
				}
				if !holder[k].CompareAndSwap(0, a.ActorEpoch) {
					t.Errorf("key %d: claim at epoch %d won while the activation at epoch %d was live", k, a.ActorEpoch, holder[k].Load())
					return
				}
				mu.Lock()
				epochs[k] = append(epochs[k], a.ActorEpoch)
				mu.Unlock()
				if _, _, err := b.s.AppendEvent(b.ctx, store.AppendEventParams{Key: keys[k], Kind: abi.EventMessage,
					Payload: json.RawMessage(`{"message":"storm"}`)}); err != nil {
					unexpected(t, "AppendEvent", err)
					return
				}
				d, err := b.s.NextDelivery(b.ctx, nextParams(a))
				if err != nil {
					unexpected(t, "NextDelivery", err)
					return
				}
				if rand.N(4) == 0 {
					holder[k].Store(0) // FailAttempt ends the activation
					if _, err := b.s.FailAttempt(b.ctx, store.FailAttemptParams{Ref: d.Delivery.TurnRef(), Error: "storm",
						Counted: true, MaxAttempts: 1000}); err != nil {
						unexpected(t, "FailAttempt", err)
						return
					}
					continue
				}
				if _, err := b.s.CommitTurn(b.ctx, commitParams(d.Delivery.TurnRef())); err != nil {
					unexpected(t, "CommitTurn of a live activation", err)
					return
				}
				mu.Lock()
				commits[k]++
				mu.Unlock()
				holder[k].Store(0)
				if err := b.s.StopActivation(b.ctx, a.Ref()); err != nil {
					unexpected(t, "StopActivation", err)
					return
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	total := 0
	for k, key := range keys {
		for i, e := range epochs[k] {
			wantEq(t, e, int64(i+1), fmt.Sprintf("key %d: epoch of claim %d", k, i+1))
		}
		total += len(epochs[k])
		s := b.getSession(key)
		wantEq(t, s.ActorEpoch, int64(len(epochs[k])), fmt.Sprintf("key %d: session epoch", k))
		wantEq(t, s.TurnCount, commits[k], fmt.Sprintf("key %d: TurnCount", k))
		wantEq(t, int64(len(b.transcript(key))), commits[k], fmt.Sprintf("key %d: transcript turns", k))
		evs := b.events(key)
		wantEq(t, s.EventCount, int64(len(evs)), fmt.Sprintf("key %d: EventCount", k))
		wantEq(t, s.OpenEvents, int64(countEvents(evs, store.EventOpen)), fmt.Sprintf("key %d: OpenEvents", k))
		wantEq(t, int64(countEvents(evs, store.EventDone)), commits[k], fmt.Sprintf("key %d: done events", k))
	}
	wantEq(t, int64(total)+refused.Load(), int64(workers*claimsPer), "claims won + refused")
	t.Logf("%d claims won, %d refused with ErrActivationLive", total, refused.Load())
}

func countEvents(evs []store.Event, status store.EventStatus) int {
	n := 0
	for _, e := range evs {
		if e.Status == status {
			n++
		}
	}
	return n
}

// ledger records what a storm's racers saw succeed, by activation uid, for
// the checks afterwards.
type ledger struct {
	mu       sync.Mutex
	commits  map[string]store.Delivery   // activation → the delivery it committed
	fenced   map[string]store.Delivery   // activation → its delivery whose commit was fenced
	expiries map[string]store.FailResult // activation → what the watchdog's expiry did
	stopped  map[string]bool
	// dead are the refs known ended (stop or expiry returned), in order.
	dead []store.ActivationRef
}

func newLedger() *ledger {
	return &ledger{commits: map[string]store.Delivery{}, fenced: map[string]store.Delivery{},
		expiries: map[string]store.FailResult{}, stopped: map[string]bool{}}
}

// watchdog expires leases until ctx ends, like every host's watchdog.
func (l *ledger) watchdog(ctx context.Context, t *testing.T, b *bundle) {
	for ctx.Err() == nil {
		refs, err := b.s.ExpiredActivations(b.ctx, 100)
		if err != nil {
			unexpected(t, "ExpiredActivations", err)
			return
		}
		for _, r := range refs {
			fr, err := b.s.ExpireActivation(b.ctx, store.ExpireActivationParams{Ref: r, MaxAttempts: 1000})
			if errors.Is(err, store.ErrNotLive) {
				continue // another watchdog won, or a transaction held the row
			}
			if err != nil {
				unexpected(t, "ExpireActivation", err)
				return
			}
			l.mu.Lock()
			if _, dup := l.expiries[r.UID]; dup {
				t.Errorf("activation %s expired twice", r.UID)
			}
			l.expiries[r.UID] = fr
			l.dead = append(l.dead, r)
			l.mu.Unlock()
		}
		time.Sleep(ShortTTL / 20)
	}
}

// waitLapsed waits until the store's clock agrees that a's lease ran out:
// ExpiredActivations lists it, or a watchdog expired it already.
func (l *ledger) waitLapsed(t *testing.T, b *bundle, a store.Activation) bool {
	deadline := time.Now().Add(hammerDeadline)
	for {
		l.mu.Lock()
		_, gone := l.expiries[a.UID]
		l.mu.Unlock()
		if gone {
			return true
		}
		expired, err := b.s.ExpiredActivations(b.ctx, 1000)
		if err != nil {
			unexpected(t, "ExpiredActivations", err)
			return false
		}
		if slices.Contains(expired, a.Ref()) {
			return true
		}
		if time.Now().After(deadline) {
			t.Errorf("activation %s: lease of %v not expired by the store's clock after %v", a.UID, ShortTTL, hammerDeadline)
			return false
		}
		time.Sleep(ShortTTL / 20)
	}
}

// stop ends an idle activation after its commit; the watchdog may have
// expired it first (its lease is short).
func (l *ledger) stop(t *testing.T, b *bundle, a store.Activation) {
	err := b.s.StopActivation(b.ctx, a.Ref())
	switch {
	case err == nil:
		l.mu.Lock()
		l.stopped[a.UID] = true
		l.dead = append(l.dead, a.Ref())
		l.mu.Unlock()
	case errors.Is(err, store.ErrNotLive):
	default:
		unexpected(t, "StopActivation", err)
	}
}

// claimLive claims key with a short lease, waiting while the previous
// activation is still live (the watchdog has yet to expire it).
func claimLive(t *testing.T, b *bundle, key store.ActorKey) (store.Activation, bool) {
	deadline := time.Now().Add(hammerDeadline)
	for {
		a, err := b.s.ClaimActivation(b.ctx, claimParams(key, b.host, ShortTTL))
		if err == nil {
			return a, true
		}
		if !errors.Is(err, store.ErrActivationLive) {
			unexpected(t, "ClaimActivation", err)
			return a, false
		}
		if time.Now().After(deadline) {
			t.Errorf("%s: still ErrActivationLive after %v: the lapsed activation was never expired", key, hammerDeadline)
			return a, false
		}
		time.Sleep(ShortTTL / 20)
	}
}

// check asserts what a storm of turns on short leases must leave: every
// event done by exactly one commit, under the delivery and activation it was
// issued to, attempts equal to the watchdog's expiries of it; no activation
// both committed-then-expired with its event current, stopped and expired,
// or fenced without the watchdog having expired it with its event.
func (l *ledger) check(t *testing.T, b *bundle, keys []store.ActorKey, eventsPer int) {
	t.Helper()
	committed := map[int64]store.Delivery{}
	for uid, d := range l.commits {
		if prev, dup := committed[d.EventID]; dup {
			t.Fatalf("event %d committed twice: deliveries %s and %s", d.EventID, prev.ID, d.ID)
		}
		committed[d.EventID] = d
		if fr, ok := l.expiries[uid]; ok && fr.EventID != 0 {
			t.Fatalf("activation %s committed event %d, and its expiry failed event %d: "+
				"a commit passed the fences of an expired activation",
				uid, d.EventID, fr.EventID)
		}
	}
	for uid := range l.stopped {
		if _, ok := l.expiries[uid]; ok {
			t.Fatalf("activation %s was both stopped and expired", uid)
		}
	}
	expiredOf := map[int64]int{}
	for uid, fr := range l.expiries {
		if fr.EventID == 0 {
			continue
		}
		expiredOf[fr.EventID]++
		if _, ok := l.fenced[uid]; !ok {
			// The worker commits every dispatched turn, so an expiry with a
			// current event must have fenced that commit.
			t.Fatalf("activation %s expired with event %d current, yet its worker's commit was not fenced", uid, fr.EventID)
		}
	}
	for uid, d := range l.fenced {
		if fr, ok := l.expiries[uid]; !ok || fr.EventID != d.EventID {
			t.Fatalf("activation %s: commit of event %d fenced, but the watchdog's expiry was %+v (found %v)", uid, d.EventID, fr, ok)
		}
	}
	for _, key := range keys {
		s := b.getSession(key)
		evs := b.events(key)
		turns := b.transcript(key)
		wantEq(t, len(evs), eventsPer, "events")
		wantEq(t, s.EventCount, int64(eventsPer), "EventCount")
		wantEq(t, s.OpenEvents, int64(0), "OpenEvents")
		wantEq(t, s.TurnCount, int64(eventsPer), "TurnCount")
		wantEq(t, len(turns), eventsPer, "transcript turns")
		for i, e := range evs {
			wantEq(t, e.Status, store.EventDone, fmt.Sprintf("event %d status", e.ID))
			wantEq(t, e.Attempts, expiredOf[e.ID], fmt.Sprintf("event %d attempts (expiries that found it sent)", e.ID))
			chain, err := b.s.EventErrors(b.ctx, key, e.ID)
			noErr(t, err, "EventErrors")
			wantEq(t, len(chain), expiredOf[e.ID], fmt.Sprintf("event %d error chain", e.ID))
			// Invariant 5: turns commit in acceptance order.
			tr := turns[i]
			wantEq(t, tr.TurnNo, int64(i+1), "TurnNo")
			wantEq(t, tr.EventID, e.ID, fmt.Sprintf("turn %d event", tr.TurnNo))
			d, ok := committed[e.ID]
			if !ok {
				t.Fatalf("event %d is done but no racer's commit of it succeeded", e.ID)
			}
			wantEq(t, tr.DeliveryID, d.ID, fmt.Sprintf("turn %d delivery", tr.TurnNo))
			wantEq(t, tr.ActorEpoch, d.ActorEpoch, fmt.Sprintf("turn %d epoch", tr.TurnNo))
			wantMessages(t, tr.Messages, abi.RoleUser, fmt.Sprintf("m%d", i), abi.RoleAssistant, fmt.Sprintf("reply to %d", e.ID))
		}
	}
	wantEq(t, len(committed), len(keys)*eventsPer, "successful commits")
	// Each worker's last activation was stopped (or expired) and every
	// earlier one ended before its next claim won: nothing is left.
	expired, err := b.s.ExpiredActivations(b.ctx, 100)
	noErr(t, err, "ExpiredActivations")
	wantEq(t, len(expired), 0, "activations left expired after the storm")
}

// sessionsWith creates n sessions with eventsPer messages "m0".. each.
func (b *bundle) sessionsWith(n, eventsPer int) []store.ActorKey {
	b.t.Helper()
	keys := make([]store.ActorKey, n)
	for i := range keys {
		keys[i] = b.session()
		for j := range eventsPer {
			b.message(keys[i], fmt.Sprintf("m%d", j))
		}
	}
	return keys
}

// testHammerCommitsRaceWatchdog: one worker per session runs its events
// under ShortTTL leases, committing each dispatched turn at once, near the
// end of the lease, or once the store reports the lease expired (that
// commit must be refused), or twice at once (a duplicated reply: at most
// one copy commits); two watchdogs expire lapsed leases meanwhile.
// Each event ends done exactly once with one transcript turn under the
// delivery and epoch whose commit succeeded; a commit is refused
// (expired_lease or stale_epoch, nothing else) exactly when the watchdog
// failed its activation with the event current, and each such expiry
// counted one attempt (invariants 3 and 4).
func testHammerCommitsRaceWatchdog(t *testing.T, b *bundle) {
	const sessions, eventsPer = 5, 3
	keys := b.sessionsWith(sessions, eventsPer)
	l := newLedger()
	ctx, cancel := context.WithCancel(b.ctx)
	var dogs, workers sync.WaitGroup
	for range 2 {
		dogs.Go(func() { l.watchdog(ctx, t, b) })
	}
	for w, key := range keys {
		workers.Go(func() {
			for turn := w; ; {
				a, ok := claimLive(t, b, key)
				if !ok {
					return
				}
				d, err := b.s.NextDelivery(b.ctx, nextParams(a))
				var nd *store.NoDueEventError
				switch {
				case errors.As(err, &nd) && nd.NextDueAt.IsZero():
					l.stop(t, b, a)
					return // every event is closed
				case errors.Is(err, store.ErrNotLive), errors.As(err, &nd):
					continue // the lease lapsed before the dispatch (or a backoff): the watchdog ends it
				case err != nil:
					unexpected(t, "NextDelivery", err)
					return
				}
				lapsed := false
				switch turn % 4 {
				case 2: // commit racing the end of the lease
					time.Sleep(ShortTTL - time.Duration(rand.N(40))*time.Millisecond)
				case 3: // commit racing the watchdog after the lease
					time.Sleep(ShortTTL + time.Duration(rand.N(40))*time.Millisecond)
					if lapsed = l.waitLapsed(t, b, a); !lapsed {
						return
					}
				}
				if turn%4 == 0 {
					err = duplicateReplies(t, b, d.Delivery.TurnRef())
				} else {
					_, err = b.s.CommitTurn(b.ctx, commitParams(d.Delivery.TurnRef()))
				}
				turn++
				switch {
				case err == nil && lapsed:
					t.Errorf("activation %s committed event %d after the store reported its lease expired", a.UID, d.Event.ID)
					return
				case err == nil:
					l.mu.Lock()
					l.commits[a.UID] = d.Delivery
					l.mu.Unlock()
					l.stop(t, b, a)
				case lateFence(err):
					l.mu.Lock()
					l.fenced[a.UID] = d.Delivery
					l.mu.Unlock()
				default:
					unexpected(t, "CommitTurn", err)
					return
				}
			}
		})
	}
	workers.Wait()
	cancel()
	dogs.Wait()
	if t.Failed() {
		return
	}
	t.Logf("%d commits, %d fenced, %d expiries", len(l.commits), len(l.fenced), len(l.expiries))
	if len(l.fenced) == 0 {
		t.Fatalf("no commit was fenced: the storm never let a lease lapse")
	}
	l.check(t, b, keys, eventsPer)
}

// duplicateReplies sends the same reply twice at once, as a worker's retry
// of a reply whose answer was lost would: at most one commits, the other is
// fenced. It returns nil when one committed, else the first one's error.
func duplicateReplies(t *testing.T, b *bundle, ref abi.TurnRef) error {
	var errs [2]error
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range errs {
		wg.Go(func() {
			<-start
			_, errs[i] = b.s.CommitTurn(b.ctx, commitParams(ref))
		})
	}
	close(start)
	wg.Wait()
	switch {
	case errs[0] == nil && errs[1] == nil:
		t.Errorf("event %d: both copies of one reply committed", ref.ActorEventID)
		return errs[0]
	case errs[0] == nil || errs[1] == nil:
		if err := errors.Join(errs[0], errs[1]); !errors.Is(err, store.ErrFence) {
			t.Errorf("event %d: the duplicate of a committed reply got %v, want a *store.FenceError", ref.ActorEventID, err)
		}
		return nil
	case !lateFence(errs[1]):
		return errs[1] // both refused: the caller judges the error
	}
	return errs[0]
}

// testHammerRenewRacesWatchdog: one worker per session holds each turn for
// two lease renewals (RenewLeases of its ref with the refs already ended
// mixed in), sometimes pausing past the lease, while two watchdogs expire
// lapsed leases. A renewal never reports held a ref whose stop or expiry
// had returned before the renewal began, nor any ref it was not given; a
// ref reported lost never commits (its commit is fenced expired_lease or
// stale_epoch); and the events end as in the commit race: done once,
// attempts equal to the expiries that found them sent.
func testHammerRenewRacesWatchdog(t *testing.T, b *bundle) {
	const sessions, eventsPer, renewals = 5, 2, 2
	keys := b.sessionsWith(sessions, eventsPer)
	l := newLedger()
	var lostFenced atomic.Int64
	ctx, cancel := context.WithCancel(b.ctx)
	var dogs, workers sync.WaitGroup
	for range 2 {
		dogs.Go(func() { l.watchdog(ctx, t, b) })
	}
	for w, key := range keys {
		workers.Go(func() {
			for turn := w; ; turn++ {
				a, ok := claimLive(t, b, key)
				if !ok {
					return
				}
				d, err := b.s.NextDelivery(b.ctx, nextParams(a))
				var nd *store.NoDueEventError
				switch {
				case errors.As(err, &nd) && nd.NextDueAt.IsZero():
					l.stop(t, b, a)
					return
				case errors.Is(err, store.ErrNotLive), errors.As(err, &nd):
					continue
				case err != nil:
					unexpected(t, "NextDelivery", err)
					return
				}
				held := true
				for r := range renewals {
					pause := ShortTTL / 6
					if turn%3 == 2 && r == renewals-1 {
						pause = ShortTTL + time.Duration(rand.N(40))*time.Millisecond // let it lapse
					}
					time.Sleep(pause)
					l.mu.Lock()
					dead := slices.Clone(l.dead[max(0, len(l.dead)-8):])
					l.mu.Unlock()
					refs := append(dead, a.Ref())
					rand.Shuffle(len(refs), func(i, j int) { refs[i], refs[j] = refs[j], refs[i] })
					got, err := b.s.RenewLeases(b.ctx, store.RenewLeasesParams{HostID: b.host, LeaseTTL: ShortTTL, Refs: refs})
					if err != nil {
						unexpected(t, "RenewLeases", err)
						return
					}
					for _, g := range got {
						if slices.Contains(dead, g) {
							t.Errorf("RenewLeases reported held activation %s, which had ended before the call", g.UID)
							return
						}
						if g != a.Ref() {
							t.Errorf("RenewLeases reported held %+v, a ref it was not given", g)
							return
						}
					}
					if len(got) == 0 {
						held = false
						break
					}
				}
				_, err = b.s.CommitTurn(b.ctx, commitParams(d.Delivery.TurnRef()))
				switch {
				case err == nil && !held:
					t.Errorf("activation %s committed event %d after RenewLeases reported its lease lost", a.UID, d.Event.ID)
					return
				case err == nil:
					l.mu.Lock()
					l.commits[a.UID] = d.Delivery
					l.mu.Unlock()
					l.stop(t, b, a)
				case lateFence(err):
					if !held {
						lostFenced.Add(1)
					}
					l.mu.Lock()
					l.fenced[a.UID] = d.Delivery
					l.mu.Unlock()
				default:
					unexpected(t, "CommitTurn", err)
					return
				}
			}
		})
	}
	workers.Wait()
	cancel()
	dogs.Wait()
	if t.Failed() {
		return
	}
	t.Logf("%d commits, %d fenced (%d after a lost renewal), %d expiries", len(l.commits), len(l.fenced),
		lostFenced.Load(), len(l.expiries))
	if lostFenced.Load() == 0 {
		t.Fatalf("no renewal reported a lease lost: the storm never let one lapse")
	}
	l.check(t, b, keys, eventsPer)
}

// testHammerAppends: ten appenders send twelve signals each to one
// session, every other one with an idempotency key all appenders share,
// while a worker dispatches and commits the events as they arrive. Seq is
// dense 1..N in id order with no duplicate (invariant 5's order); each
// idempotency key made one event, which every racer got back with the
// payload of the racer that created it (invariant 7); keyless signals each
// made their own; the turns committed in seq order and the session's
// counters equal what ListEvents and Transcript show.
func testHammerAppends(t *testing.T, b *bundle) {
	const appenders, perAppender = 10, 12
	key := b.session()
	type result struct {
		ev      store.Event
		created bool
		payload string
	}
	results := make([][]result, appenders)
	var appending sync.WaitGroup
	var appended atomic.Bool
	start := make(chan struct{})
	for i := range appenders {
		results[i] = make([]result, perAppender)
		appending.Go(func() {
			<-start
			for j := range perAppender {
				p := store.AppendEventParams{Key: key, Kind: abi.EventMessage,
					Payload: json.RawMessage(fmt.Sprintf(`{"message":"a%d-%d"}`, i, j))}
				if j%2 == 0 {
					p.IdempotencyKey = fmt.Sprintf("k%d", j)
				}
				ev, created, err := b.s.AppendEvent(b.ctx, p)
				if err != nil {
					unexpected(t, "AppendEvent", err)
					return
				}
				results[i][j] = result{ev: ev, created: created, payload: string(p.Payload)}
			}
		})
	}
	var consumer sync.WaitGroup
	var turns atomic.Int64
	consumer.Go(func() {
		a, err := b.s.ClaimActivation(b.ctx, claimParams(key, b.host, LongTTL))
		if err != nil {
			unexpected(t, "ClaimActivation", err)
			return
		}
		for {
			last := appended.Load()
			d, err := b.s.NextDelivery(b.ctx, nextParams(a))
			var nd *store.NoDueEventError
			if errors.As(err, &nd) {
				if last {
					return
				}
				time.Sleep(time.Millisecond)
				continue
			}
			if err != nil {
				unexpected(t, "NextDelivery", err)
				return
			}
			if _, err := b.s.CommitTurn(b.ctx, commitParams(d.Delivery.TurnRef())); err != nil {
				unexpected(t, "CommitTurn", err)
				return
			}
			turns.Add(1)
		}
	})
	close(start)
	appending.Wait()
	appended.Store(true)
	consumer.Wait()
	if t.Failed() {
		return
	}

	byID := map[int64]store.Event{}
	for _, ev := range b.events(key) {
		byID[ev.ID] = ev
	}
	wantKeyless := 0
	for j := range perAppender {
		if j%2 == 1 {
			for i := range appenders {
				r := results[i][j]
				if !r.created {
					t.Fatalf("appender %d signal %d without an idempotency key: created = false", i, j)
				}
				if !jsonEqual(byID[r.ev.ID].Payload, []byte(r.payload)) {
					t.Fatalf("event %d payload %s, want %s", r.ev.ID, byID[r.ev.ID].Payload, r.payload)
				}
				wantKeyless++
			}
			continue
		}
		var first *result
		for i := range appenders {
			if results[i][j].created {
				if first != nil {
					t.Fatalf("idempotency key k%d created events %d and %d", j, first.ev.ID, results[i][j].ev.ID)
				}
				first = &results[i][j]
			}
		}
		if first == nil {
			t.Fatalf("idempotency key k%d: no racer created its event", j)
		}
		listed, ok := byID[first.ev.ID]
		if !ok {
			t.Fatalf("event %d of key k%d not listed", first.ev.ID, j)
		}
		wantEq(t, listed.IdempotencyKey, fmt.Sprintf("k%d", j), "listed idempotency key")
		wantEq(t, listed.Seq, first.ev.Seq, "listed seq")
		if !jsonEqual(listed.Payload, []byte(first.payload)) {
			t.Fatalf("event of key k%d has payload %s, want the creator's %s", j, listed.Payload, first.payload)
		}
		for i := range appenders {
			r := results[i][j]
			wantEq(t, r.ev.ID, first.ev.ID, fmt.Sprintf("appender %d key k%d: event", i, j))
			wantEq(t, r.ev.Seq, first.ev.Seq, fmt.Sprintf("appender %d key k%d: seq", i, j))
			if !jsonEqual(r.ev.Payload, []byte(first.payload)) {
				t.Fatalf("appender %d key k%d got payload %s, want the first event's %s", i, j, r.ev.Payload, first.payload)
			}
		}
	}
	evs := b.events(key)
	want := wantKeyless + perAppender/2
	wantEq(t, len(evs), want, "events (one per idempotency key, one per keyless signal)")
	seqOf := map[int64]int64{}
	for i, ev := range evs {
		wantEq(t, ev.Seq, int64(i+1), fmt.Sprintf("seq of event %d (in id order)", ev.ID))
		wantEq(t, ev.Status, store.EventDone, fmt.Sprintf("event %d status", ev.ID))
		seqOf[ev.ID] = ev.Seq
	}
	tr := b.transcript(key)
	wantEq(t, len(tr), want, "transcript turns")
	for i, turn := range tr {
		wantEq(t, turn.TurnNo, int64(i+1), "TurnNo")
		wantEq(t, seqOf[turn.EventID], int64(i+1), fmt.Sprintf("seq of the event of turn %d", turn.TurnNo))
	}
	s := b.getSession(key)
	wantEq(t, s.EventCount, int64(want), "EventCount")
	wantEq(t, s.OpenEvents, int64(0), "OpenEvents")
	wantEq(t, s.TurnCount, int64(want), "TurnCount")
	wantEq(t, turns.Load(), int64(want), "commits")
}

// testHammerLifecycle runs every lifecycle write at once on six sessions
// (crash policies restart, sleep and destroy): per session a worker claims,
// dispatches and commits turns that set alarms (one in five it fails
// counted, dead-lettering at the second failure; fenced by a steer or a
// cancel, it retries with the newest delivery); three chaos goroutines
// steer, cancel the current or a queued event, redrive dead letters, sleep
// and wake, append, and destroy two sessions (twice); a firer fires the
// alarms. Every call returns nil or an error its race explains (a call that
// runs into the store's call timeout fails as a deadlock). Afterwards each
// session's counters equal what ListEvents and Transcript show, seq and
// turn numbers are dense, each turn closed its event (ok → done, cancelled
// → cancelled) under an epoch the worker claimed, each event is in at most
// one turn, a done event has its turn unless it was a steer attached to a
// done event, a destroyed session has no open event, and each in-flight
// cancellation left exactly one cancelled turn.
func testHammerLifecycle(t *testing.T, b *bundle) {
	policies := []store.CrashPolicy{store.CrashRestart, store.CrashRestart, store.CrashRestart, store.CrashSleep,
		store.CrashSleep, store.CrashDestroy}
	keys := make([]store.ActorKey, len(policies))
	for i, p := range policies {
		keys[i] = b.sessionWith(p)
		b.message(keys[i], "first")
	}
	const chaosOps, maxTurns = 16, 30
	var chaosDone atomic.Bool
	claimed := make([][]int64, len(keys))
	var commits, failed, fenced, steered, cancelled, cancelledInFlight, redriven, fired atomic.Int64
	payload := json.RawMessage(`{"message":"m"}`)

	var workers sync.WaitGroup
	for i, key := range keys {
		workers.Go(func() {
			var act store.Activation
			live := false
			for n := 0; n < maxTurns && !chaosDone.Load(); n++ {
				if !live {
					a, err := b.s.ClaimActivation(b.ctx, claimParams(key, b.host, LongTTL))
					switch {
					case errors.Is(err, store.ErrSessionDestroyed):
						return
					case errors.Is(err, store.ErrSessionSleeping):
						if _, err := b.s.WakeSession(b.ctx, key); err != nil && !errors.Is(err, store.ErrSessionDestroyed) {
							unexpected(t, "WakeSession", err)
							return
						}
						continue
					case err != nil:
						unexpected(t, "ClaimActivation", err)
						return
					}
					act, live = a, true
					claimed[i] = append(claimed[i], a.ActorEpoch)
				}
				d, err := b.s.NextDelivery(b.ctx, nextParams(act))
				var nd *store.NoDueEventError
				switch {
				case errors.As(err, &nd):
					if _, _, err := b.s.AppendEvent(b.ctx, store.AppendEventParams{Key: key, Kind: abi.EventMessage,
						Payload: payload}); err != nil {
						if errors.Is(err, store.ErrSessionDestroyed) {
							return
						}
						unexpected(t, "AppendEvent", err)
						return
					}
					continue
				case errors.Is(err, store.ErrNotLive): // destroyed under it
					live = false
					continue
				case err != nil:
					unexpected(t, "NextDelivery", err)
					return
				}
				ref := d.Delivery.TurnRef()
				failIt := rand.N(5) == 0
				for !chaosDone.Load() {
					time.Sleep(time.Duration(rand.N(3)) * time.Millisecond) // the turn runs
					if failIt {
						_, err = b.s.FailAttempt(b.ctx, store.FailAttemptParams{Ref: ref, Error: "hammer", Counted: true,
							MaxAttempts: 2})
						if err == nil {
							failed.Add(1)
							live = false
							break
						}
					} else {
						past := time.Now().Add(-time.Second).Truncate(time.Millisecond)
						p := commitParams(ref)
						p.Alarms = []abi.AlarmOp{{Name: "a", At: &past}, {Name: "b", InMs: 1}, {Name: "c", Clear: true}}
						_, err = b.s.CommitTurn(b.ctx, p)
						if err == nil {
							commits.Add(1)
							break
						}
					}
					if !errors.Is(err, store.ErrFence) {
						unexpected(t, fmt.Sprintf("CommitTurn/FailAttempt (fail %v)", failIt), err)
						return
					}
					fenced.Add(1)
					in, err := b.s.InFlight(b.ctx, act.Ref())
					if errors.Is(err, store.ErrNotLive) {
						break // cancelled (idle again) or destroyed: NextDelivery tells which
					}
					if err != nil {
						unexpected(t, "InFlight", err)
						return
					}
					ref = in.Delivery.TurnRef() // steered: reply to the newest revision
				}
			}
		})
	}
	var chaos sync.WaitGroup
	for c := range 3 {
		chaos.Go(func() {
			for n := range chaosOps {
				key := keys[rand.N(len(keys))]
				r, err := b.s.Steer(b.ctx, store.SteerParams{Key: key, DeliveryID: uuid.NewString(),
					Payload: json.RawMessage(`{"message":"steer"}`)})
				switch {
				case err == nil && r.InFlight:
					steered.Add(1)
				case err == nil, errors.Is(err, store.ErrSessionDestroyed):
				default:
					unexpected(t, "Steer", err)
					return
				}
				cr, err := b.s.CancelEvent(b.ctx, store.CancelEventParams{Key: keys[rand.N(len(keys))], Reason: "hammer"})
				switch {
				case err == nil:
					cancelled.Add(1)
					if cr.InFlight {
						cancelledInFlight.Add(1)
					}
				case isAny(err, store.ErrNotFound, store.ErrConflict):
				default:
					unexpected(t, "CancelEvent of the current event", err)
					return
				}
				key = keys[rand.N(len(keys))]
				open, err := b.s.ListEvents(b.ctx, store.ListEventsParams{Key: key, Status: store.EventOpen, Limit: 5})
				if err != nil {
					unexpected(t, "ListEvents", err)
					return
				}
				if len(open) > 0 {
					ev := open[rand.N(len(open))]
					cr, err := b.s.CancelEvent(b.ctx, store.CancelEventParams{Key: key, EventID: ev.ID, Reason: "queued"})
					switch {
					case err == nil:
						cancelled.Add(1)
						if cr.InFlight {
							cancelledInFlight.Add(1)
						}
					case errors.Is(err, store.ErrConflict): // closed meanwhile
					default:
						unexpected(t, "CancelEvent by id", err)
						return
					}
				}
				dls, err := b.s.ListDeadLetters(b.ctx, store.ListDeadLettersParams{AgentUID: b.agent.UID, Limit: 5})
				if err != nil {
					unexpected(t, "ListDeadLetters", err)
					return
				}
				for _, dl := range dls {
					_, err := b.s.RedriveEvent(b.ctx, dl.Event.ActorKey, dl.Event.ID)
					switch {
					case err == nil:
						redriven.Add(1)
					case isAny(err, store.ErrConflict, store.ErrSessionDestroyed):
					default:
						unexpected(t, "RedriveEvent", err)
						return
					}
				}
				key = keys[rand.N(len(keys))]
				if _, err := b.s.SleepSession(b.ctx, store.SleepSessionParams{Key: key, Reason: "capacity"}); err != nil &&
					!isAny(err, store.ErrActivationLive, store.ErrSessionDestroyed) {
					unexpected(t, "SleepSession", err)
					return
				}
				if _, err := b.s.WakeSession(b.ctx, key); err != nil && !errors.Is(err, store.ErrSessionDestroyed) {
					unexpected(t, "WakeSession", err)
					return
				}
				if _, _, err := b.s.AppendEvent(b.ctx, store.AppendEventParams{Key: keys[rand.N(len(keys))],
					Kind: abi.EventMessage, Payload: payload}); err != nil && !errors.Is(err, store.ErrSessionDestroyed) {
					unexpected(t, "AppendEvent", err)
					return
				}
				if n == chaosOps/2 || n == chaosOps-1 {
					// Two goroutines destroy the same sessions at once.
					for _, key := range []store.ActorKey{keys[c%2], keys[4]} {
						s, err := b.s.DestroySession(b.ctx, key)
						if err != nil {
							unexpected(t, "DestroySession", err)
							return
						}
						if s.Status != store.SessionDestroyed || s.DestroyTS == nil {
							t.Errorf("DestroySession returned %+v", s)
							return
						}
					}
				}
			}
		})
	}
	var firer sync.WaitGroup
	firer.Go(func() {
		for !chaosDone.Load() {
			got, err := b.s.FireDueAlarms(b.ctx, 10)
			if err != nil {
				unexpected(t, "FireDueAlarms", err)
				return
			}
			fired.Add(int64(len(got)))
			time.Sleep(5 * time.Millisecond)
		}
	})
	chaos.Wait()
	chaosDone.Store(true)
	workers.Wait()
	firer.Wait()
	t.Logf("commits %d, counted failures %d, fenced replies %d, steers in flight %d, cancels %d, redrives %d, alarm keys %d",
		commits.Load(), failed.Load(), fenced.Load(), steered.Load(), cancelled.Load(), redriven.Load(), fired.Load())
	if t.Failed() {
		return
	}
	if commits.Load() == 0 {
		t.Fatalf("no turn committed during the storm")
	}

	var cancelTurns, cancelledEvents int64
	for i, key := range keys {
		what := func(s string) string { return fmt.Sprintf("session %d (%s): %s", i, policies[i], s) }
		for j := 1; j < len(claimed[i]); j++ {
			if claimed[i][j] <= claimed[i][j-1] {
				t.Fatalf("%s", what(fmt.Sprintf("claim epochs %v do not strictly increase", claimed[i])))
			}
		}
		s := b.getSession(key)
		evs := b.events(key)
		turns := b.transcript(key)
		wantEq(t, s.EventCount, int64(len(evs)), what("EventCount"))
		wantEq(t, s.OpenEvents, int64(countEvents(evs, store.EventOpen)), what("OpenEvents"))
		wantEq(t, s.DeadLetters, int64(countEvents(evs, store.EventDeadLetter)), what("DeadLetters"))
		wantEq(t, s.TurnCount, int64(len(turns)), what("TurnCount"))
		if i == 0 || i == 1 || i == 4 {
			wantEq(t, s.Status, store.SessionDestroyed, what("status"))
		}
		byID := map[int64]store.Event{}
		for j, ev := range evs {
			wantEq(t, ev.Seq, int64(j+1), what(fmt.Sprintf("seq of event %d", ev.ID)))
			byID[ev.ID] = ev
			if s.Status == store.SessionDestroyed && ev.Status == store.EventOpen {
				t.Fatalf("%s", what(fmt.Sprintf("destroyed, yet event %d is open", ev.ID)))
			}
		}
		turnOf := map[int64]store.Turn{}
		for j, tr := range turns {
			wantEq(t, tr.TurnNo, int64(j+1), what("TurnNo"))
			ev, ok := byID[tr.EventID]
			if !ok {
				t.Fatalf("%s", what(fmt.Sprintf("turn %d names event %d, not of this session", tr.TurnNo, tr.EventID)))
			}
			if prev, dup := turnOf[tr.EventID]; dup {
				t.Fatalf("%s", what(fmt.Sprintf("event %d closed by turns %d and %d", tr.EventID, prev.TurnNo, tr.TurnNo)))
			}
			turnOf[tr.EventID] = tr
			switch tr.Outcome {
			case abi.OutcomeOK:
				wantEq(t, ev.Status, store.EventDone, what(fmt.Sprintf("status of event %d of ok turn %d", ev.ID, tr.TurnNo)))
			case store.OutcomeCancelled:
				cancelTurns++
				wantEq(t, ev.Status, store.EventCancelled, what(fmt.Sprintf("status of event %d of cancelled turn %d", ev.ID, tr.TurnNo)))
			default:
				t.Fatalf("%s", what(fmt.Sprintf("turn %d outcome %q", tr.TurnNo, tr.Outcome)))
			}
			if !slices.Contains(claimed[i], tr.ActorEpoch) {
				t.Fatalf("%s", what(fmt.Sprintf("turn %d under epoch %d, which no claim issued (claims %v)",
					tr.TurnNo, tr.ActorEpoch, claimed[i])))
			}
		}
		cancelledEvents += int64(countEvents(evs, store.EventCancelled))
		for _, ev := range evs {
			if ev.Status != store.EventDone {
				continue
			}
			_, has := turnOf[ev.ID]
			switch {
			case ev.SteerOf == 0 && !has:
				t.Fatalf("%s", what(fmt.Sprintf("event %d is done without a turn", ev.ID)))
			case ev.SteerOf != 0 && has:
				t.Fatalf("%s", what(fmt.Sprintf("steer %d attached to %d has a turn of its own", ev.ID, ev.SteerOf)))
			case ev.SteerOf != 0 && byID[ev.SteerOf].Status != store.EventDone:
				t.Fatalf("%s", what(fmt.Sprintf("steer %d is done but its event %d is %s", ev.ID, ev.SteerOf, byID[ev.SteerOf].Status)))
			}
		}
	}
	// Each in-flight cancellation recorded one cancelled turn; every
	// successful cancellation closed an event as cancelled (its steers may
	// have gone with it).
	wantEq(t, cancelTurns, cancelledInFlight.Load(), "cancelled turns (CancelEvent results in flight)")
	if cancelledEvents < cancelled.Load() {
		t.Fatalf("%d events cancelled, but %d CancelEvent calls succeeded", cancelledEvents, cancelled.Load())
	}
}
