package host

import (
	"slices"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// Dispatch from the wake-up (docs/DESIGN.md "Deferred dispatch"). When a
// turn's commit saw no other event open, the activation waits for a
// wake-up, and the wake-up of a signal appended through this host carries
// the event the append returned (Appended). The next turn is then that
// event, dispatched deferred without asking the store: the session row,
// its state and its transcript tail are what the activation's own last
// commit left (afterCommit), since only its commits change them while it
// is live. Nothing rests on the guess: the deferred commit (or the
// promotion) checks inside the database what a read would have — the
// activation live and idle at its epoch and revision with an unexpired
// lease, the event still the session's oldest open one, due, its agent
// unchanged — and a refused one drops the turn, after which the
// controller asks the store as usual. It spares the deferred read and the
// session's read, two of a deferred turn's four statements.

// offer records e, an event this host just appended, as the next wake-up's
// candidate of its session's controller (none runs: nothing to do). Only
// an event a deferred dispatch may take is kept (store.Deferrable, not a
// steer); of several, the oldest.
func (h *Host) offer(e store.Event) {
	if !offered(e) {
		return
	}
	h.mu.Lock()
	c := h.ctrls[e.ActorKey]
	h.mu.Unlock()
	if c == nil {
		return
	}
	c.hintMu.Lock()
	defer c.hintMu.Unlock()
	if c.hint == nil || e.Seq < c.hint.Seq {
		c.hint = &e
	}
}

// offered reports whether e may be a controller's hint: an open event a
// deferred dispatch may take (store.Deferrable), not a steer.
func offered(e store.Event) bool {
	return e.SteerOf == 0 && e.Status == store.EventOpen && store.Deferrable(e.Attempts, e.Binding, 0)
}

// takeHint returns the event offered since the last call (nil: none) and
// forgets it.
func (c *controller) takeHint() *store.Event {
	c.hintMu.Lock()
	defer c.hintMu.Unlock()
	e := c.hint
	c.hint = nil
	return e
}

// afterCommit is what a committed turn leaves known of its session to the
// activation that committed it: the dispatch of the next turn from a
// wake-up builds on it.
type afterCommit struct {
	// session is the session row as the turn's dispatch read it (the
	// fields a request carries never change).
	session store.Session
	// state is the committed state (store.StateFromColumn's form).
	state []byte
	// tail is the transcript's last tail messages after the commit.
	tail []abi.Message
	// revision is the activation's revision the commit was fenced at.
	revision int64
	// seq is the committed event's: an offered event at or below it was
	// seen by the commit already.
	seq int64
}

// remember records what the commit of d's turn (result res, committed as
// t) leaves known, when the activation waits for a wake-up next: the
// commit saw no other event open and took no next turn.
func (a *activationRun) remember(d store.Dispatch, res *abi.TurnResult, t store.Turn) {
	a.after = nil
	if t.NextOpen || t.Next != nil {
		return
	}
	state := d.State
	if res.State != nil {
		state = store.StateFromColumn(store.StateColumn(res.State), true)
	}
	var tail []abi.Message
	if n := a.tail(); n > 0 {
		tail = slices.Clone(d.Tail)
		for _, m := range t.Messages {
			tail = append(tail, abi.Message{Role: m.Role, Content: m.Content})
		}
		tail = tail[max(len(tail)-n, 0):]
	}
	a.after = &afterCommit{session: d.Session, state: state, tail: tail, revision: res.TurnRef.Revision, seq: d.Event.Seq}
}

// fromWakeup is the deferred dispatch of the event offered with the
// wake-up that ended the wait after a commit (afterCommit), or false when
// there is none to make: no event was offered or it was already seen, the
// agent's turns are not deferred, or the event was accepted not due (its
// first attempt set later than its acceptance). The caller then asks the
// store. Whether it is due now is the database's to say, by its clock (the
// deferred commit, the promotion): by the host's, a database clock a few
// milliseconds ahead would make every fresh event look not due yet.
func (a *activationRun) fromWakeup() (store.Dispatch, bool) {
	after, e := a.after, a.c.takeHint()
	a.after = nil
	if after == nil || e == nil || e.Seq <= after.seq || !a.defers() || e.NextAttemptAt.After(e.AcceptedAt) {
		return store.Dispatch{}, false
	}
	d := store.DeferredOf(a.act.Ref(), after.revision, uuid.NewString(), *a.expect, *e)
	d.Session, d.State, d.Tail = after.session, after.state, after.tail
	return d, true
}
