package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// controller serialises one session's turns on this host: it claims an
// activation, takes the oldest due event, runs it on a worker, commits or
// fails it through the store's fences, and stops when the session is idle.
type controller struct {
	h    *Host
	key  store.ActorKey
	log  *slog.Logger
	wake chan struct{}

	// panics records recent recovered panics (restart intensity).
	panics []time.Time
	// inflight is the turn being run, for cleanup after a panic, and
	// inflightPr its promotion (nil: written at its dispatch).
	inflight   *abi.TurnRef
	inflightPr *promotion
	// pol is the agent policy of the current activation.
	pol AgentPolicy
	// notCharged counts failures in a row that consumed no attempt (the
	// worker never got the turn, or no instance could be made): their
	// retries back off like counted ones, up to BackoffMax.
	notCharged int
	// attempt is the span of the attempt being run (tracing.go).
	attempt *attemptTrace

	// hint is the oldest event this host appended since the controller
	// last took it (Host.offer, wakedispatch.go); hintMu guards it.
	hintMu sync.Mutex
	hint   *store.Event
}

func newController(h *Host, key store.ActorKey) *controller {
	return &controller{h: h, key: key, log: h.log.With("session", key.String()), wake: make(chan struct{}, 1)}
}

// poke wakes the controller if it waits for work.
func (c *controller) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// run loops over activations until the session has nothing due, then exits
// through Host.exit so that no wake-up is lost.
func (c *controller) run(runCtx, turnCtx context.Context) {
	for {
		retryIn := c.runSafely(runCtx, turnCtx)
		if retryIn > 0 {
			select {
			case <-runCtx.Done():
			case <-c.wake:
				// A new signal does not shorten a backoff; the store decides
				// what is due. Re-arm the wake for after the wait.
				c.poke()
				select {
				case <-runCtx.Done():
				case <-time.After(retryIn):
				}
			case <-time.After(retryIn):
			}
			if runCtx.Err() == nil {
				continue
			}
		}
		if c.h.exit(c) {
			return
		}
	}
}

// runSafely runs one activation and recovers a panic in it: the panic is
// logged, the in-flight attempt (if any) is failed — counted as a crash only
// past the restart intensity — and the controller restarts from the store's
// truth. No other controller is touched (OTP one_for_one).
func (c *controller) runSafely(runCtx, turnCtx context.Context) (retryIn time.Duration) {
	defer func() {
		p := recover()
		if p == nil {
			return
		}
		c.h.metrics.ControllerPanics.Inc()
		now := time.Now()
		recent := c.panics[:0]
		for _, t := range c.panics {
			if now.Sub(t) < c.h.set.RestartPeriod {
				recent = append(recent, t)
			}
		}
		c.panics = append(recent, now)
		crash := len(c.panics) > c.h.set.RestartIntensity
		c.log.Error("controller panic recovered", "panic", fmt.Sprint(p), "crash", crash, "stack", string(debug.Stack()))
		if ref, pr := c.inflight, c.inflightPr; ref != nil {
			c.inflight, c.inflightPr = nil, nil
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			// A deferred turn is written first (promoted), so that its
			// failure is recorded as any turn's: fenced off unwritten, a
			// panic that recurs would never be counted. A refused
			// promotion means the turn was superseded: nothing to record.
			if err := pr.ensure(ctx); err != nil {
				c.log.Info("deferred turn not written: its panic is not recorded", "err", err)
			} else {
				c.fail(ctx, *ref, 1, c.pol, fmt.Errorf("controller panic: %v", p), crash, "panic")
			}
		}
		retryIn = 100 * time.Millisecond
	}()
	return c.activation(runCtx, turnCtx)
}

// activationRun is one claimed activation and its turns.
type activationRun struct {
	c        *controller
	h        *Host
	act      store.Activation
	agent    store.Agent
	pol      AgentPolicy
	log      *slog.Logger
	runCtx   context.Context // ends when the host begins to stop
	leaseCtx context.Context // ends when the lease is lost or turns must abort

	inst        Instance
	instBinding string
	// nothingOpen: the last commit saw no other open event, so the next
	// look at the store waits for a wake-up (Turn.NextOpen); nextOpen: an
	// event is open or was likely just written — the last commit saw one,
	// the claim's PeekSession saw one, or a wake-up ended an idle wait —
	// so the next look goes straight to the dispatch
	// (NextDeliveryParams.ExpectDue).
	nothingOpen, nextOpen bool
	// expect is what the agent ran at the last dispatch and its binding:
	// the next dispatch's NextDeliveryParams.Expect.
	expect *store.ExpectedBinding
	// taken is the next turn the last commit took in its transaction
	// (store.Turn.Next): the loop runs it without a dispatch of its own.
	// backlog: the last commit saw another event open after its own, so
	// the next commit asks for the next turn (CommitTurnParams.Next).
	taken   *store.Dispatch
	backlog bool
	// after is what the last commit left known of the session while the
	// activation waits for a wake-up, and hinted the deferred dispatch
	// made from that wake-up's event: the loop runs it without asking the
	// store (wakedispatch.go).
	after  *afterCommit
	hinted *store.Dispatch
	// hintedWakeup: hinted came from a wake-up (else from the claim, a
	// deferred first turn: ClaimActivationParams.First).
	hintedWakeup bool
	// slots is the pool whose slot the activation holds; yielded records
	// that it stopped idle to give the slot to a waiting session.
	slots   *pool
	yielded bool
}

// tail is how many transcript messages the agent's requests carry.
func (a *activationRun) tail() int {
	if a.pol.TranscriptTail != nil {
		return *a.pol.TranscriptTail
	}
	return a.h.set.TranscriptTail
}

func (a *activationRun) closeInstance() {
	if a.inst != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = a.inst.Close(ctx)
		cancel()
		a.inst = nil
	}
}

func (a *activationRun) stop() time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.h.st.StopActivation(ctx, a.act.Ref()); err != nil && !errors.Is(err, store.ErrNotLive) {
		a.log.Warn("stop activation", "err", err)
	}
	return 0
}

// bind is NextDelivery's Bind: what the agent runs now (read by the store
// with the candidate event), in the activation's pool. An update of the
// agent thus binds its next new event, which then runs on a fresh instance
// (turn), while events that started keep their recorded binding
// (docs/DESIGN.md invariant 10).
func (a *activationRun) bind(b store.AgentBinding) (string, error) {
	return a.h.runner.Binding(b, a.pol.Pool)
}

// expectNext keeps what the agent ran at a dispatch, and its binding, for
// the next dispatch (store.NextDeliveryParams.Expect); an agent Bind
// refuses is not expected.
func (a *activationRun) expectNext(ab store.AgentBinding) {
	if a.expect != nil && a.expect.Agent == ab {
		return
	}
	a.expect = nil
	if b, err := a.bind(ab); err == nil {
		a.expect = &store.ExpectedBinding{Agent: ab, Binding: b}
		a.h.setExpected(expectKey{a.agent.UID, a.pol.Pool}, *a.expect)
	}
}

// nextParams are the NextDelivery parameters of this activation's next
// dispatch (a fresh delivery id), asked of NextDelivery or of the commit
// before it (store.CommitTurnParams.Next).
func (a *activationRun) nextParams() store.NextDeliveryParams {
	return store.NextDeliveryParams{
		Activation: a.act.Ref(), DeliveryID: uuid.NewString(), Bind: a.bind,
		BlockOnDeadLetter: a.pol.BlockOnDeadLetter, MarkSent: true, TailMessages: a.tail(),
		ExpectDue: a.nextOpen, Expect: a.expect,
	}
}

// woken reports whether a wake-up is pending, and takes it.
func (a *activationRun) woken() bool {
	select {
	case <-a.c.wake:
		return true
	default:
		return false
	}
}

// runnable reports whether the activation may take its next event: the
// host is not stopping, the lease holds and the agent's pool still runs
// here.
func (a *activationRun) runnable(runCtx context.Context) bool {
	return runCtx.Err() == nil && a.leaseCtx.Err() == nil && a.h.placeable(a.leaseCtx, a.agent, a.pol.Pool)
}

// errActivationStopped is the cause of a failed attempt whose event the
// last commit took while its activation was stopping: given back unsent
// and uncounted.
var errActivationStopped = errors.New("activation stopped before the turn was sent")

// loop takes due events one at a time until idle, lease loss or shutdown.
func (a *activationRun) loop(runCtx context.Context) time.Duration {
	h, c := a.h, a.c
	idleSince := time.Now()
	for {
		if a.hinted != nil && !a.runnable(runCtx) {
			a.hinted = nil // nothing of it was written
		}
		switch taken := a.taken; {
		case taken != nil && !a.runnable(runCtx):
			// The last commit took the next event, but the activation
			// stops: give it back unsent and uncounted (its worker never
			// had it), which ends the activation.
			a.taken = nil
			return c.fail(context.Background(), taken.Delivery.TurnRef(), taken.Attempt, a.pol,
				errActivationStopped, false, "not_sent")
		case taken != nil:
			// Runnable: it runs below, without a dispatch.
		case runCtx.Err() != nil || a.leaseCtx.Err() != nil:
			return a.stop()
		case !h.placeable(a.leaseCtx, a.agent, a.pol.Pool):
			// The remote pool's last worker here left: let go of the session
			// before taking its next event, for a host that has one.
			a.log.Info("pool no longer runnable on this host: activation stopped", "pool", a.pol.Pool)
			return a.stop()
		}
		var d store.Dispatch
		var pr *promotion
		var err error
		if a.taken != nil {
			d, a.taken = *a.taken, nil
			a.expectNext(d.Agent)
		} else if a.hinted != nil {
			np := a.nextParams()
			np.DeliveryID = a.hinted.Delivery.ID
			d, a.hinted = *a.hinted, nil
			pr = h.newPromotion(a.act.Ref(), np, d)
			h.metrics.Deferred.Inc()
			if a.hintedWakeup {
				h.metrics.WakeupDispatches.Inc()
			}
		} else if a.nothingOpen {
			// Nothing was open when the last turn committed: wait for the
			// wake-up of the next signal instead of asking now.
			a.nothingOpen = false
			err = &store.NoDueEventError{}
		} else {
			// A wake-up already pending is answered by this look (it sees
			// every write committed before it): drop it, so that it does
			// not make the coming turn read its in-flight state (run) or
			// the next idle wait look again for nothing. Wake-ups from now
			// on stay.
			select {
			case <-c.wake:
			default:
			}
			c.takeHint()
			a.after = nil
			np := a.nextParams()
			np.Defer = a.defers()
			// The only store call of this step that needs a deadline: the
			// taken and hinted dispatches above are already in hand.
			ctx, cancel := context.WithTimeout(a.leaseCtx, 10*time.Second)
			d, err = h.st.NextDelivery(ctx, np)
			cancel()
			a.nextOpen = false
			if err == nil {
				a.expectNext(d.Agent)
				if pr = h.newPromotion(a.act.Ref(), np, d); pr != nil {
					h.metrics.Deferred.Inc()
					if !a.inProcess(d.Delivery.Binding) {
						// Deferred for a binding that does not run here
						// (invariant 9): written before anything is sent.
						if !a.settle(pr) {
							continue
						}
					}
				}
			}
		}
		var noDue *store.NoDueEventError
		switch {
		case errors.As(err, &noDue):
			wait := a.pol.IdleTimeout - time.Since(idleSince)
			if wait <= 0 {
				a.log.Debug("activation idle, stopping")
				return a.stop()
			}
			due := false
			if !noDue.NextDueAt.IsZero() {
				// The due time is by the database's clock; the wait is only a
				// hint, NextDelivery decides again when it ends.
				if until := time.Until(noDue.NextDueAt) + 10*time.Millisecond; until < wait {
					wait, due = max(until, 10*time.Millisecond), true
				}
			}
			select {
			case <-c.wake:
				// Woken after a look that found nothing: an event was
				// appended, released or redriven for this session (a
				// wake-up for nothing is rare since a host's own appends
				// wake it once, host/wakeups.go), so dispatch at once. The
				// dispatch answers "nothing due" too, at one round trip
				// more than the probe it skips. After a commit that saw
				// nothing else open, the event this host appended is the
				// dispatch (wakedispatch.go).
				a.nextOpen = true
				if hd, ok := a.fromWakeup(); ok {
					a.hinted, a.hintedWakeup = &hd, true
				}
			case <-time.After(wait):
				if !due {
					a.log.Debug("activation idle, stopping")
					return a.stop()
				}
			case <-a.slots.contended():
				// A session waits for a slot of this pool: an idle
				// activation gives its slot up (docs/DESIGN.md invariant 11). A
				// later event of this session queues for a slot like any.
				if a.slots.claimYield() {
					a.yielded = true
					a.log.Debug("activation idle, yielding its slot to a waiting session")
					return a.stop()
				}
			case <-runCtx.Done():
			case <-a.leaseCtx.Done():
			}
			continue
		case errors.Is(err, store.ErrNotLive):
			a.log.Info("activation no longer live")
			return 0
		case err != nil:
			if a.leaseCtx.Err() == nil {
				a.log.Warn("next delivery", "err", err)
			}
			a.stop()
			return time.Second
		}
		if pr == nil {
			h.notifyStream(c.key) // turn.started
		}

		outcome, retry, done := a.turn(d, pr)
		if done {
			return retry
		}
		idleSince = time.Now()
		if outcome == abi.OutcomeSleep || outcome == abi.OutcomeFinish || outcome == abi.OutcomeWait {
			// The agent has nothing more to do until someone speaks: run what
			// is already due, then stop without the idle wait.
			idleSince = time.Now().Add(-a.pol.IdleTimeout)
		}
	}
}

// turn runs one event's turn — again with the newest revision if it was
// steered and the worker answered the older one — and commits or fails it.
// done means the activation is over (retry is then what loop returns).
func (a *activationRun) turn(d store.Dispatch, pr *promotion) (outcome abi.Outcome, retry time.Duration, done bool) {
	h, c := a.h, a.c
	at := a.startAttempt(d)
	defer func() { at.end(c, string(outcome), done) }()
	defer pr.stop()
	// One stream buffer for the attempt, kept when a steer reruns it: the
	// rerun restarts its stream (offsets from 0 after turn.retrying). A
	// deferred turn is promoted before its first chunk frame.
	sb := newStreamBuf(h, d.Session.ActorKey, d.Delivery.TurnRef(), d.Attempt, a.log)
	sb.promote = pr.ensure
	for {
		ref := d.Delivery.TurnRef()
		if a.inst == nil || a.instBinding != d.Delivery.Binding {
			a.closeInstance()
			inst, err := h.runner.Instantiate(WithInstanceScope(a.leaseCtx, a.pol.InstanceReuse), d.Delivery.Binding)
			if err != nil {
				// No instance: the agent never ran, and nothing in the event
				// can have caused it (a plugin binary that no longer matches
				// its checksum, a worker start failure, a full machine). Not
				// charged to the event — that would dead-letter events or
				// destroy sessions for an operator's problem — but retried
				// with backoff until it is fixed; last_error says why.
				if !a.settle(pr) {
					return "", 0, false
				}
				return "", c.fail(context.Background(), ref, d.Attempt, a.pol, fmt.Errorf("instantiate %s: %w", d.Delivery.Binding, err), false, "instantiate"), true
			}
			a.inst, a.instBinding = inst, d.Delivery.Binding
		}
		c.inflight, c.inflightPr = &ref, pr
		res, latest, cancelled, hold, err := a.run(d, sb, pr)
		c.inflight, c.inflightPr = nil, nil
		// The worker is done: its chunks are written before the commit or
		// the failed attempt (chunk frames precede turn.committed).
		sb.end()
		last := latest.Delivery.TurnRef()
		switch {
		case hold != nil && !cancelled:
			// A call waits for an approver: whatever the worker made of its
			// cancelled turn is dropped, and the attempt ends as a hold.
			if err != nil {
				a.closeInstance()
			}
			if !a.settle(pr) {
				return "", 0, false
			}
			return "", c.hold(last, a.pol, hold), true
		case cancelled:
			// The event was cancelled: the store closed it and recorded it;
			// the worker's reply (if any) is dropped unsubmitted.
			h.metrics.Cancelled.Inc()
			a.log.Info("turn cancelled", "event", d.Event.ID)
			if err != nil {
				a.closeInstance()
			}
			return "", 0, false
		case err != nil:
			a.closeInstance()
			cause, counted := "worker", true
			var sa SendAware
			if errors.As(err, &sa) && !sa.TurnSent() {
				cause, counted = "not_sent", false
			}
			if a.leaseCtx.Err() != nil && a.runCtx.Err() != nil {
				// The host is shutting down and ran out of patience: not the
				// event's fault, so no attempt is consumed.
				cause, counted = "shutdown", false
				if !pr.promoted() {
					// Nothing of a deferred turn was written: there is
					// nothing to record either. Let the session go.
					return "", a.stop(), true
				}
			} else if a.leaseCtx.Err() != nil {
				cause = "aborted"
			}
			if !a.settle(pr) {
				return "", 0, false
			}
			return "", c.fail(context.Background(), last, d.Attempt, a.pol, err, counted, cause), true
		case res.Outcome == abi.OutcomeError:
			if !a.settle(pr) {
				return "", 0, false
			}
			return "", c.fail(context.Background(), last, d.Attempt, a.pol, fmt.Errorf("agent error: %s", res.Error), true, "agent_error"), true
		}
		if err := res.Validate(); err != nil {
			if !a.settle(pr) {
				return "", 0, false
			}
			return "", c.fail(context.Background(), last, d.Attempt, a.pol, err, true, "invalid_result"), true
		}
		if res.TurnRef != last || res.Wait != nil {
			// A wrong echoed ref is failed under the real one, and a wait
			// is opened under the delivery: both need it written.
			if !a.settle(pr) {
				return "", 0, false
			}
		}
		deferred, perr := pr.forCommit()
		if perr != nil {
			// Promoted and refused meanwhile (a cancel, a redrive, a lost
			// lease): the turn can no longer commit. Ask the store again.
			a.log.Info("deferred turn superseded before its commit", "event", d.Event.ID, "err", perr)
			a.nothingOpen, a.nextOpen, a.backlog = false, true, false
			return "", 0, false
		}
		ctx, cancel := context.WithTimeout(at.with(context.Background()), 10*time.Second)
		var payloads []string
		if res.TurnRef == last && len(latest.Steers) == 0 {
			// What this turn carried, at the ref's revision: the store
			// need not read it back (CommitTurnParams.Payloads).
			payloads = []string{string(d.Event.Payload)}
		}
		var next *store.NextDeliveryParams
		if !a.runnable(a.runCtx) {
			// Stopping: the loop lets go of the session after this commit.
		} else if woken := a.woken(); woken || a.backlog {
			// Another event is likely open (the last commit saw one after
			// this turn's, or a wake-up came since the dispatch): take the
			// next turn in the commit's transaction. Without that hint the
			// claim would mostly find nothing, at the cost of its
			// statement. The commit sees every write committed before it,
			// so the wake-up is answered by it and dropped (as before a
			// dispatch); the wake-up of a steer of this turn may be one of
			// them, which is why a stale revision below reads the turn in
			// flight again.
			np := a.nextParams()
			next = &np
		}
		c.takeHint() // the commit sees the events appended before it
		turn, err := h.commit(ctx, res, payloads, next, deferred)
		var fe *store.FenceError
		if errors.As(err, &fe) && fe.Reason == store.FenceStaleRevision && latest.Delivery.Revision <= res.TurnRef.Revision {
			// Steered after the worker answered, unseen so far: read the
			// newest revision and its steers.
			if cur, ierr := h.st.InFlight(ctx, a.act.Ref()); ierr == nil && cur.Event.ID == d.Event.ID {
				latest.Delivery, latest.Steers = cur.Delivery, cur.Steers
			}
		}
		cancel()
		switch {
		case errors.As(err, &fe) && fe.Reason == store.FenceStaleRevision && latest.Delivery.Revision > res.TurnRef.Revision:
			// Steered while running, and the worker answered the older
			// revision: run the turn again with the steers in the request.
			a.log.Info("turn steered: running it again with the steers", "event", d.Event.ID, "revision", latest.Delivery.Revision)
			d.Delivery, d.Steers = latest.Delivery, latest.Steers
			sb.restart(latest.Delivery.TurnRef())
			continue
		case errors.As(err, &fe):
			if res.TurnRef != last {
				// The worker echoed a ref it was not given: fail the attempt
				// under the real one (which may itself be fenced off by now).
				return "", c.fail(context.Background(), last, d.Attempt, a.pol, fmt.Errorf("worker echoed a wrong turn_ref: %w", err), true, "wrong_ref"), true
			}
			// Refused: the event was closed meanwhile (a cancel whose
			// wake-up has not come yet clears the current event and leaves
			// the activation live and idle) or the activation was lost. Ask
			// the store again, as after a cancelled turn: NextDelivery takes
			// the next event, or answers that the activation is no longer
			// live. Ending here would leave a live activation nobody runs,
			// and the events behind it waiting for its lease to lapse.
			a.nothingOpen, a.nextOpen, a.backlog = false, true, false
			return "", 0, false
		case err != nil:
			// The commit failed for another reason (the database refused the
			// data, or the connection broke). Record a failed attempt through
			// the same fences: if the commit did happen after all, its
			// delivery is accepted and this write is fenced off (a deferred
			// turn's promotion is refused: its event is closed).
			a.log.Error("commit turn", "err", err)
			pr.release()
			if !a.settle(pr) {
				return "", 0, false
			}
			return "", c.fail(context.Background(), last, d.Attempt, a.pol, fmt.Errorf("commit: %w", err), true, "commit"), true
		}
		c.notCharged = 0
		a.nothingOpen, a.nextOpen, a.backlog, a.taken = !turn.NextOpen, turn.NextOpen, turn.NextOpen, turn.Next
		a.remember(d, res, turn)
		a.log.Debug("turn committed", "turn", turn.TurnNo, "event", turn.EventID, "outcome", turn.Outcome)
		if r, ok := a.inst.(Recycler); ok && r.ShouldRecycle() {
			a.closeInstance()
		}
		return turn.Outcome, 0, false
	}
}

// steerBuffer is the capacity of a turn's steer channel (abi.WithSteers):
// the steers that can wait for the worker to take them in. A steer that
// finds it full is not lost: it is in the store, and the turn runs again
// with it in TurnRequest.Steers. A channel is made per turn, so its size
// is paid per turn: at 64 (8.5 KiB of abi.Steer) it was a third of the
// bytes a turn allocated in paddock bench (--memprofile).
const steerBuffer = 8

// run runs the worker for d, watching for steers and cancellation while it
// runs: a wake-up during the turn makes the controller look at the store
// (InFlight); a newer revision hands the worker its steers, a cancelled
// event aborts it. latest is d with the newest delivery and steers.
func (a *activationRun) run(d store.Dispatch, sb *streamBuf, pr *promotion) (res *abi.TurnResult, latest store.Dispatch, cancelled bool, hold *store.WaitParams, err error) {
	h, c := a.h, a.c
	latest = d
	steers := make(chan abi.Steer, steerBuffer)
	tctx, tcancel := context.WithTimeout(a.leaseCtx, a.pol.TurnTimeout)
	defer tcancel()
	tctx = abi.WithSteers(tctx, steers)
	tctx = WithInstanceScope(tctx, a.pol.InstanceReuse)
	tctx = c.attempt.with(tctx) // plugins and remote workers get its traceparent
	// Capabilities as configured now: a revoked grant holds from the next
	// attempt, not from the next activation. Without an executor, every
	// call but emit answers not_configured.
	caps := h.Policy().ForAgent(a.agent).Capabilities
	caps.Namespace = a.agent.Namespace
	jc := newJournalCaller(h, h.calls, a.agent, d.Session.ActorKey, caps, d.Delivery.TurnRef(), sb, a.log)
	jc.onHold = tcancel
	jc.promote = pr.ensure
	if c.attempt != nil {
		jc.span = c.attempt.sc
	}
	tctx = abi.WithCaller(tctx, jc)
	type reply struct {
		res   *abi.TurnResult
		err   error
		panic any
	}
	done := make(chan reply, 1)
	req := c.request(a.agent, d)
	inst := a.inst
	start := time.Now()
	// A deferred turn is promoted once it has run PromoteAfter; refused,
	// it can no longer commit, so it stops.
	pr.start(h.set.PromoteAfter, tcancel)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				done <- reply{panic: p}
			}
		}()
		r, err := inst.Turn(tctx, req)
		done <- reply{res: r, err: err}
	}()
	sent := map[int64]bool{}
	for _, s := range d.Steers {
		sent[s.ID] = true
	}
	// heldBack is set once a steer did not fit the channel: from then on
	// no steer of this turn is handed over. A later one would carry a
	// newer turn_ref than the steer held back, and a worker echoing it
	// would commit a transcript with a steer it never saw.
	heldBack := false
	woken := false
	defer func() {
		if woken {
			// A wake-up may also have been for a new event: keep it.
			c.poke()
		}
	}()
	for {
		select {
		case r := <-done:
			h.metrics.TurnSeconds.Observe(time.Since(start).Seconds())
			if r.panic != nil {
				// A worker adapter panicked: it is this controller's fault
				// domain, so re-raise it here for runSafely to recover.
				panic(r.panic)
			}
			tcancel() // calls still in flight (a plugin's) end now
			return r.res, latest, cancelled, jc.takeHold(), r.err
		case <-c.wake:
			woken = true
			if !pr.promoted() {
				// Nothing is in flight for the store yet: no steer can be
				// attached to the turn, and a cancel or a redrive makes its
				// promotion or its commit refused.
				continue
			}
			ctx, cancel := context.WithTimeout(a.leaseCtx, 10*time.Second)
			cur, err := h.st.InFlight(ctx, a.act.Ref())
			cancel()
			switch {
			case errors.Is(err, store.ErrNotLive) || (err == nil && cur.Event.ID != d.Event.ID):
				if !cancelled {
					cancelled = true
					tcancel()
				}
			case err != nil:
				a.log.Warn("look for steers", "err", err)
			case cur.Delivery.Revision > latest.Delivery.Revision:
				var fresh []store.Event
				for _, s := range cur.Steers {
					if !sent[s.ID] {
						sent[s.ID] = true
						fresh = append(fresh, s)
					}
				}
				// Only the newest steer carries the newest turn_ref: a worker
				// that takes in some steers but not the last answers an older
				// ref, is fenced off (stale revision) and the turn reruns with
				// every steer in its request — none is committed unseen. So
				// once one steer is held back, every later one is too.
				older := latest.Delivery.TurnRef()
				latest.Delivery, latest.Steers = cur.Delivery, cur.Steers
				jc.setRef(cur.Delivery.TurnRef())
				for i, s := range fresh {
					ref := older
					if i == len(fresh)-1 {
						ref = cur.Delivery.TurnRef()
					}
					if heldBack {
						h.metrics.SteersHeldBack.Inc()
						continue
					}
					select {
					case steers <- steerOf(ref, s):
						h.metrics.Steers.Inc()
					default: // the worker does not read steers (fast enough); it reruns
						heldBack = true
						h.metrics.SteersHeldBack.Inc()
					}
				}
			}
		}
	}
}

// steerOf converts a steer event to the abi form handed to a worker.
func steerOf(ref abi.TurnRef, e store.Event) abi.Steer {
	var p struct {
		Message string          `json:"message"`
		Data    json.RawMessage `json:"data"`
	}
	_ = json.Unmarshal(e.Payload, &p)
	return abi.Steer{TurnRef: ref, EventID: e.ID, Message: p.Message, Data: p.Data}
}

// Commit submits a worker's reply through the store's fences (docs/DESIGN.md
// invariant 3). A rejected reply is counted by reason and logged, and the
// *store.FenceError is returned; nothing was written. Every worker kind's
// replies, late ones included, come through here.
func (h *Host) Commit(ctx context.Context, res *abi.TurnResult) (turn store.Turn, err error) {
	return h.commit(ctx, res, nil, nil, nil)
}

// commit is Commit with the payloads the turn carried when the caller
// dispatched it (store.CommitTurnParams.Payloads; nil: the store reads
// them), the caller's next dispatch (CommitTurnParams.Next; nil: none)
// and, for a deferred turn never promoted, its dispatch
// (CommitTurnParams.Deferred).
func (h *Host) commit(ctx context.Context, res *abi.TurnResult, payloads []string, next *store.NextDeliveryParams,
	deferred *store.PromoteParams) (turn store.Turn, err error) {
	ctx, span := h.startCommit(ctx, res.TurnRef)
	defer func() { endCommit(span, turn, err) }()
	// The commit renews the lease of an activation this host holds, which
	// spares its renewal at the next round (renewLoop).
	var ttl time.Duration
	if h.holdsLease(res.TurnRef.ActivationUID) {
		ttl = h.set.LeaseTTL
	}
	sent := time.Now()
	turn, err = h.st.CommitTurn(ctx, store.CommitTurnParams{
		Ref: res.TurnRef, Messages: res.Messages, State: res.State, KeepState: res.State == nil,
		Outcome: res.Outcome, Alarms: res.Alarms, Wait: store.WaitFromSpec(res.Wait, res.TurnRef.ActorEventID),
		Payloads: payloads, Next: next, LeaseTTL: ttl, Deferred: deferred,
	})
	if err == nil && ttl > 0 {
		h.leaseRenewed(res.TurnRef.ActivationUID, sent)
	}
	var fe *store.FenceError
	if errors.As(err, &fe) {
		h.metrics.FenceRejections.WithLabelValues(string(fe.Reason)).Inc()
		h.log.Warn("reply rejected by fence", "reason", fe.Reason, "detail", fe.Detail, "turn_ref", res.TurnRef.String())
		return turn, err
	}
	if err != nil {
		return turn, fmt.Errorf("host: commit turn %s: %w", res.TurnRef, err)
	}
	h.metrics.Turns.WithLabelValues(string(turn.Outcome)).Inc()
	h.notifyStream(store.ActorKey{AgentUID: res.TurnRef.AgentUID, SessionID: res.TurnRef.SessionID}) // turn.committed (and wait.opened)
	h.signalCommit()
	if h.onCommit != nil {
		h.onCommit(turn)
	}
	return turn, nil
}

// request builds the TurnRequest of a dispatch.
func (c *controller) request(agent store.Agent, d store.Dispatch) *abi.TurnRequest {
	var payload struct {
		Message string          `json:"message"`
		Data    json.RawMessage `json:"data"`
		Alarm   *abi.AlarmFired `json:"alarm"`
	}
	var wait *abi.WaitEvent
	switch d.Event.Kind {
	case abi.EventWaitResolved, abi.EventWaitExpired:
		// The payload is the wait (store.WaitEventPayload): its data is
		// the resolver's, not the event's.
		wait = new(abi.WaitEvent)
		_ = json.Unmarshal(d.Event.Payload, wait) // written by the store
	default:
		_ = json.Unmarshal(d.Event.Payload, &payload) // validated at acceptance
	}
	sized := payload.Data
	if wait != nil {
		sized = d.Event.Payload
	}
	tail := trimTail(d.Tail, tailBudget(d, payload.Message, sized))
	req := &abi.TurnRequest{
		ABIVersion: abi.Version,
		TurnRef:    d.Delivery.TurnRef(),
		Session: abi.Session{
			AgentName: agent.Name, SessionID: d.Session.SessionID, Key: d.Session.Key, Input: d.Session.Input,
		},
		Event: abi.Event{
			ID: d.Event.ID, Kind: d.Event.Kind, Message: payload.Message, Data: payload.Data,
			AcceptedAt: d.Event.AcceptedAt, Alarm: payload.Alarm, Wait: wait,
		},
		State:      d.State,
		Transcript: tail,
		Attempt:    d.Attempt,
	}
	for _, s := range d.Steers {
		req.Steers = append(req.Steers, steerOf(req.TurnRef, s))
	}
	return req
}

// tailBudget is how many bytes of JSON the transcript tail may take in a
// TurnRequest: half of abi.MaxRequestBytes, less what the state (base64),
// the event and its steers take. The tail is context, not input: it is
// trimmed so that a session with long messages can never build a request
// over the limit (which would fail every later turn of the session).
func tailBudget(d store.Dispatch, msg string, data json.RawMessage) int {
	b := abi.MaxRequestBytes/2 - (len(d.State)*4/3 + 2*len(msg) + len(data) + 1024)
	for _, s := range d.Steers {
		b -= len(s.Payload) + 512
	}
	return max(b, 0)
}

// trimTail keeps the newest messages of tail whose JSON fits in budget
// bytes, oldest first (never nil).
func trimTail(tail []abi.Message, budget int) []abi.Message {
	used, first := 0, len(tail)
	for i := len(tail) - 1; i >= 0; i-- {
		b, _ := json.Marshal(tail[i])
		if used+len(b)+1 > budget {
			break
		}
		used += len(b) + 1
		first = i
	}
	return append([]abi.Message{}, tail[first:]...)
}

// hold ends an attempt whose host call waits for an approver
// (docs/DESIGN.md "Waits and approvals"): FailAttempt with the approval's
// wait as Hold — not counted; the event stays open but is not due until
// the wait is decided; the session sleeps (approval). It returns the
// retry wait of activation's loop (0: nothing to do until woken).
func (c *controller) hold(ref abi.TurnRef, pol AgentPolicy, w *store.WaitParams) time.Duration {
	h := c.h
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := h.st.FailAttempt(ctx, store.FailAttemptParams{
		Ref: ref, Error: abi.SafeText("waits for approval: " + w.For), Counted: false, MaxAttempts: pol.MaxAttempts, Hold: w,
	})
	var fe *store.FenceError
	switch {
	case errors.As(err, &fe):
		h.metrics.FenceRejections.WithLabelValues(string(fe.Reason)).Inc()
		c.log.Warn("approval hold fenced off", "reason", fe.Reason, "wait", w.ID)
		return 0
	case err != nil:
		// The hold could not be written (the wait id is taken, the store
		// failed): fail the attempt uncounted instead, so the event runs
		// again after a backoff rather than never.
		c.log.Error("record approval hold", "err", err, "wait", w.ID)
		return c.fail(context.Background(), ref, 0, pol, fmt.Errorf("approval hold %s: %w", w.ID, err), false, "approval_hold")
	}
	h.metrics.ApprovalHolds.Inc()
	c.attempt.failed("hold", nil)
	h.notifyStream(c.key) // turn.retrying (approval), wait.opened
	c.log.Info("turn holds for an approval", "event", ref.ActorEventID, "wait", w.ID, "for", w.For)
	return 0
}

// fail records a failed attempt through the fences and returns the backoff
// to wait before the next attempt (0 when the session stops here: the crash
// policy put it to sleep or destroyed it; 1 ms after a dead letter: go on
// with the next event at once).
func (c *controller) fail(ctx context.Context, ref abi.TurnRef, attempt int, pol AgentPolicy, cause error, counted bool, kind string) time.Duration {
	h := c.h
	c.attempt.failed(kind, cause)
	n := attempt
	if counted {
		c.notCharged = 0
	} else {
		c.notCharged++
		n = c.notCharged
	}
	backoff := Backoff(n, pol.BackoffMin, pol.BackoffMax, rand.Float64())
	if errors.Is(cause, errActivationStopped) && n == 1 {
		// Never sent, given back by a stopping activation (a host's stop
		// in a rolling restart): due at once for the next activation, as
		// a turn a lost lease never sent is (store.LeaseLost), not after
		// a retry's backoff. A second in a row backs off as usual.
		backoff = 0
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := h.st.FailAttempt(ctx, store.FailAttemptParams{
		// The cause may quote a guest or worker (its stderr, its error
		// text): make it storable, or the failure could not be recorded and
		// the turn would run again and again (PostgreSQL refuses NUL and
		// invalid UTF-8 in text).
		Ref: ref, Error: abi.SafeText(cause.Error()), Counted: counted, Backoff: backoff, MaxAttempts: pol.MaxAttempts,
	})
	var fe *store.FenceError
	switch {
	case errors.As(err, &fe):
		h.metrics.FenceRejections.WithLabelValues(string(fe.Reason)).Inc()
		c.log.Warn("failed attempt fenced off", "reason", fe.Reason, "cause", cause)
		c.attempt.fenced(fe.Reason)
		return 0
	case err != nil:
		c.log.Error("record failed attempt", "err", err, "cause", cause)
		return time.Second
	}
	h.metrics.FailedAttempts.WithLabelValues(kind).Inc()
	h.notifyStream(c.key) // turn.retrying or turn.failed
	if res.DeadLettered {
		h.metrics.DeadLetters.Inc()
		c.log.Warn("event dead-lettered", "event", res.EventID, "attempts", res.Attempts, "cause", cause)
	}
	switch {
	case res.SessionStatus == store.SessionSleeping:
		c.log.Warn("turn attempt failed: crash policy put the session to sleep", "event", res.EventID, "attempt", attempt, "cause", cause)
		return 0
	case res.SessionStatus == store.SessionDestroyed:
		c.log.Warn("turn attempt failed: crash policy destroyed the session", "event", res.EventID, "attempt", attempt, "cause", cause)
		return 0
	case res.DeadLettered:
		return time.Millisecond
	}
	// An event given back unsent because its activation stopped (a
	// shutdown; a lost lease is logged on its own) is no failure of the
	// agent nor of the worker: one line per live activation at a host's
	// stop is not worth a warning. A turn a worker's transport could not
	// send (also not_sent) is.
	level := slog.LevelWarn
	if errors.Is(cause, errActivationStopped) {
		level = slog.LevelInfo
	}
	c.log.Log(ctx, level, "turn attempt failed", "event", res.EventID, "attempt", attempt, "counted", counted,
		"retry_in", backoff.Round(time.Millisecond), "cause", cause)
	return backoff
}
