package host

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/paddock-dev/paddock/store"
)

// Deferred dispatch (docs/DESIGN.md "Deferred dispatch"). A turn of an
// in-process worker (a wasm module run by this host) is dispatched by a
// read: nothing of it is written until something of the turn must be —
// a host call (its journal row, invariant 12, and the bytes it sends),
// a stream chunk, a wait, a failed attempt — or it has run
// Policy.PromoteAfter. Then it is promoted (store.Promote: the delivery,
// binding, current event and turn.started, exactly as NextDelivery writes
// them). A turn that ends first is written whole by its commit
// (store.CommitTurnParams.Deferred): one transaction per turn, with fewer
// rows, instead of two. Until it is promoted the turn is not in flight for
// anyone else: a steer queues as a message, a cancel or a redrive makes
// its commit fail the checks, and a crash loses nothing but the work.

// errCommitting answers a promotion asked after the commit took the
// deferred turn over.
var errCommitting = errors.New("host: the deferred turn is being committed")

// promotion is one deferred dispatch's promotion: at most once, by
// whichever comes first — a host call, a stream write, a failure, the
// timer — or never, when the commit writes it.
type promotion struct {
	h   *Host
	p   store.PromoteParams
	key store.ActorKey

	mu         sync.Mutex
	done       bool  // Promote ran (err is its answer)
	err        error // Promote's refusal
	committing bool  // the commit writes it: no promotion now
	timer      *time.Timer
}

// newPromotion returns the promotion of d (dispatched with np under
// ref), or nil when d was not deferred.
func (h *Host) newPromotion(ref store.ActivationRef, np store.NextDeliveryParams, d store.Dispatch) *promotion {
	if !d.Deferred {
		return nil
	}
	return &promotion{h: h, p: store.PromoteOf(ref, np, d), key: d.Session.ActorKey}
}

// start promotes the turn after it has run for after (the worker starts
// now); abort is called when that promotion is refused (a
// *store.FenceError): the turn can no longer commit, so it stops. A nil
// promotion does nothing.
func (pr *promotion) start(after time.Duration, abort func()) {
	if pr == nil {
		return
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.timer != nil || pr.done {
		return
	}
	pr.timer = time.AfterFunc(after, func() {
		// Only a refusal stops the turn; a store error leaves it deferred
		// (the next host call, chunk frame or failure tries again, and its
		// commit writes it).
		var fe *store.FenceError
		if err := pr.ensure(context.Background()); errors.As(err, &fe) {
			abort()
		}
	})
}

// ensure promotes the turn unless it was already: nil once it is
// promoted, the store's refusal (a *store.FenceError: the turn must not go
// on) or errCommitting. A nil promotion (a dispatch that was not
// deferred) is always promoted.
func (pr *promotion) ensure(ctx context.Context) error {
	if pr == nil {
		return nil
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.done {
		return pr.err
	}
	if pr.committing {
		return errCommitting
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := pr.h.st.Promote(ctx, pr.p)
	var fe *store.FenceError
	switch {
	case err == nil:
		pr.done = true
		pr.h.metrics.Promotions.Inc()
		pr.h.notifyStream(pr.key) // turn.started
	case errors.As(err, &fe):
		pr.done, pr.err = true, err
		pr.h.metrics.FenceRejections.WithLabelValues(string(fe.Reason)).Inc()
	}
	// Another error (the store unreachable) is returned and the next ask
	// tries again.
	return err
}

// promoted reports whether the turn is written (promoted, or never
// deferred).
func (pr *promotion) promoted() bool {
	if pr == nil {
		return true
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return pr.done && pr.err == nil
}

// forCommit stops the timer and hands the turn to its commit: the
// PromoteParams to commit it with (CommitTurnParams.Deferred) when it was
// never promoted, nil when it was (or never deferred), or the promotion's
// refusal. Until release, no promotion runs.
func (pr *promotion) forCommit() (*store.PromoteParams, error) {
	if pr == nil {
		return nil, nil
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.timer != nil {
		pr.timer.Stop()
	}
	if pr.done {
		return nil, pr.err
	}
	pr.committing = true
	p := pr.p
	return &p, nil
}

// release ends forCommit's hold after a commit that did not decide (it
// failed for another reason than the fences): the failure path promotes
// (and a commit that did happen makes that promotion refused).
func (pr *promotion) release() {
	if pr == nil {
		return
	}
	pr.mu.Lock()
	pr.committing = false
	pr.mu.Unlock()
}

// stop stops the timer (the turn is over).
func (pr *promotion) stop() {
	if pr == nil {
		return
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.timer != nil {
		pr.timer.Stop()
	}
}

// defers reports whether this activation's next dispatch may be deferred
// (docs/DESIGN.md "Deferred dispatch"): promotion is on, and what the agent
// ran at the last dispatch runs in this process.
func (a *activationRun) defers() bool {
	if a.h.set.PromoteAfter <= 0 || a.expect == nil {
		return false
	}
	return a.inProcess(a.expect.Binding)
}

// inProcess reports whether binding's turns run in this process
// (InProcessRunner).
func (a *activationRun) inProcess(binding string) bool {
	r, ok := a.h.runner.(InProcessRunner)
	return ok && r.InProcess(binding)
}

// settle promotes a deferred turn before its failure or hold is recorded
// (a failed attempt is written under its delivery). false: the promotion
// was refused — the event moved on (cancelled, preceded, its agent
// updated) or the activation was lost — or the store failed; nothing of
// the attempt is recorded, and the loop asks the store again.
func (a *activationRun) settle(pr *promotion) bool {
	err := pr.ensure(context.Background())
	if err == nil {
		return true
	}
	a.log.Info("deferred turn not written: its attempt is not recorded", "err", err)
	a.nothingOpen, a.nextOpen, a.backlog = false, true, false
	return false
}
