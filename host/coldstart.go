package host

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/store"
)

// A cold start: the claim of a session's activation on this host — the
// look at the session (PeekSession) or, after this host's own append, the
// claim alone (quickStart) — a slot of the agent's pool, the claim with
// its first turn, then the activation's run (runClaimed, activationRun's
// loop in controller.go). And the agent knowledge that makes the first
// turn one round trip: the expectations and the agents this host read.

// activation claims one activation and runs turns under it until idle,
// lease loss, shutdown or a failed attempt. It returns how long to wait
// before trying again (0 = look at the store again only if woken).
func (c *controller) activation(runCtx, turnCtx context.Context) time.Duration {
	h := c.h
	looked := time.Now()
	if retry, done := c.quickStart(runCtx, turnCtx, looked); done {
		return retry
	}
	ctx, cancel := context.WithTimeout(runCtx, 10*time.Second)
	peek, err := h.st.PeekSession(ctx, c.key)
	sess, agent := peek.Session, peek.Agent
	cancel()
	if err != nil {
		if !errors.Is(err, store.ErrNotFound) && runCtx.Err() == nil {
			c.log.Warn("load agent and session", "err", err)
			return time.Second
		}
		return 0
	}
	h.setKnownAgent(agent)
	forCapacity := store.WaitsForCapacity(sess)
	if sess.Status != store.SessionActive && !forCapacity {
		return 0 // sleeping or destroyed: a signal, a wake or a redrive resumes it
	}
	if !peek.AnyOpen {
		// Nothing to run: neither a slot nor a claim (an activation that
		// yielded its slot must not queue for one again, marked pending,
		// with nothing due). The append of the next event wakes it.
		return 0
	}
	pol := h.Policy().ForAgent(agent)
	c.pol = pol
	if !h.placeable(runCtx, agent, pol.Pool) {
		// Remote pool without a live worker here: leave the session to a
		// host that has one (docs/DESIGN.md "Remote pools across hosts").
		c.log.Debug("pool not runnable on this host: session left alone", "pool", pol.Pool)
		return 0
	}

	// Capacity (docs/DESIGN.md "Capacity"): a slot of the agent's pool on this host.
	slots := h.pool(pol.Pool)
	if forCapacity {
		// Asleep for lack of capacity with a due event (the scan listed it,
		// docs/DESIGN.md invariant 11): take a slot if one frees within a scan
		// interval — idle holders yield to a waiter — then the claim wakes
		// the session in its own transaction (WakeForCapacity), so one
		// slept meanwhile for another reason (the crash policy's sleep)
		// stays asleep. Without a slot it stays asleep and the next scan
		// tries again.
		if !c.slotForCapacity(runCtx, slots) {
			return 0
		}
	} else if !slots.tryAcquire() {
		if retry, ok := c.waitForCapacity(runCtx, slots, pol, sess); !ok {
			return retry
		}
	}
	var a *activationRun
	defer func() { slots.release(a != nil && a.yielded) }()
	h.consumeForce(c.key)

	// The claim takes the first turn in its transaction when this host
	// knows what the agent ran last (an expectation, for the one-statement
	// claim), at the epoch the peek implies: a claim that gives another
	// takes nothing, and the loop asks NextDelivery as usual. A turn that
	// runs in this process is taken deferred (read, nothing written) and
	// runs as any deferred dispatch: its commit writes it whole.
	run := &activationRun{c: c, h: h, agent: agent, pol: pol, runCtx: runCtx, slots: slots,
		nextOpen: true, // peek.AnyOpen
		expect:   h.expected(expectKey{agent.UID, pol.Pool})}
	claim := c.newClaim()
	claim.WakeForCapacity = forCapacity
	if run.expect != nil {
		run.askFirst(&claim, sess.ActorEpoch+1, run.defers())
	}
	ctx, cancel = context.WithTimeout(runCtx, 10*time.Second)
	sent := time.Now()
	act, err := h.st.ClaimActivation(ctx, claim)
	cancel()
	switch {
	case err == nil:
		h.metrics.ActivationStartSeconds.Observe(time.Since(looked).Seconds())
		if forCapacity {
			c.log.Info("capacity free: session asleep for capacity woken")
		}
	case errors.Is(err, store.ErrActivationLive), errors.Is(err, store.ErrNotFound),
		errors.Is(err, store.ErrSessionDestroyed), errors.Is(err, store.ErrSessionSleeping):
		// Another controller (here or on another host) owns the session, or
		// there is nothing to run. The watchdog frees expired leases.
		return 0
	default:
		if runCtx.Err() == nil {
			c.log.Warn("claim activation", "err", err)
			return time.Second
		}
		return 0
	}
	a = run
	return c.runClaimed(runCtx, turnCtx, a, act, sent)
}

// newClaim is the claim of a new activation of c's session by this host.
func (c *controller) newClaim() store.ClaimActivationParams {
	h := c.h
	return store.ClaimActivationParams{
		Key: c.key, UID: uuid.NewString(), LeaseID: uuid.NewString(), HostID: h.id, LeaseTTL: h.set.LeaseTTL,
	}
}

// askFirst makes claim read (deferred) or take the activation's first
// turn in its transaction, at epoch (0: the claim's, for a deferred one;
// store.ClaimActivationParams.First). A wake-up pending now is answered
// by that read, as by NextDelivery's in the loop, so it is dropped.
func (a *activationRun) askFirst(claim *store.ClaimActivationParams, epoch int64, deferred bool) {
	a.act = store.Activation{UID: claim.UID, ActorKey: claim.Key, ActorEpoch: epoch, LeaseID: claim.LeaseID}
	first := a.nextParams()
	first.Defer = deferred
	claim.First = &first
	select {
	case <-a.c.wake:
	default:
	}
}

// runClaimed runs the claimed activation act (its claim sent at sent) as
// a until it ends; see activation.
func (c *controller) runClaimed(runCtx, turnCtx context.Context, a *activationRun, act store.Activation, sent time.Time) time.Duration {
	h := c.h
	log := c.log.With("activation", act.UID, "epoch", act.ActorEpoch)
	log.Debug("activation claimed")
	leaseCtx, leaseLost := context.WithCancel(turnCtx)
	defer leaseLost()
	h.holdLease(act.Ref(), leaseLost, sent)
	defer h.dropLease(act.UID)

	a.act, a.log, a.leaseCtx = act, log, leaseCtx
	if first := act.First; first != nil {
		a.nextOpen = false
		if first.Deferred {
			a.hinted = first
		} else {
			a.taken = first
		}
	}
	a.act.First = nil
	defer a.closeInstance()
	// A hint left when the activation ends (its event maybe run by it,
	// cancelled or taken by a commit) must not make the next cold start
	// claim without a look: only a hint given since then does.
	defer c.takeHint()
	return a.loop(runCtx)
}

// quickStart is a cold start without a look at the session (PeekSession)
// nor a round trip for it: when the controller holds the hint of an event
// this host just appended (Host.ensure, offer) and this host knows the
// session's agent (Host.agents) and that its turns run in this process
// (a deferred first turn, activationRun.defers), the claim alone starts
// the activation and reads its first turn, at the epoch the claim gives
// (store.ClaimActivationParams.First without an epoch). What the look
// would have said the claim checks itself — the session active, and an
// event open (the hint's, unless another host ran it meanwhile: the
// activation then idles as after any turn) — or matters only when the
// pool is full (the crash policy's choice), for which the look decides.
// done is false when the cold start needs the look: no hint, an unknown
// agent, a pool not runnable here, a worker not in this process, a full
// pool, or a claim refused for a session not active (asleep, destroyed,
// unknown), which the look then explains. Else it returns like
// activation.
func (c *controller) quickStart(runCtx, turnCtx context.Context, looked time.Time) (retry time.Duration, done bool) {
	h := c.h
	hint := c.takeHint()
	if hint == nil {
		return 0, false
	}
	agent, ok := h.knownAgent(c.key.AgentUID)
	if !ok {
		return 0, false
	}
	pol := h.Policy().ForAgent(agent)
	run := &activationRun{c: c, h: h, agent: agent, pol: pol, runCtx: runCtx, nextOpen: true,
		expect: h.expected(expectKey{agent.UID, pol.Pool})}
	// defers first: it rules out plugin and remote pools without the
	// placement check's store read.
	if !run.defers() || !h.placeable(runCtx, agent, pol.Pool) {
		return 0, false
	}
	slots := h.pool(pol.Pool)
	if !slots.tryAcquire() {
		return 0, false
	}
	claimed := false
	defer func() { slots.release(claimed && run.yielded) }()
	run.slots = slots
	c.pol = pol
	claim := c.newClaim()
	run.askFirst(&claim, 0, true) // no epoch: the claim's (ClaimActivationParams.First)
	ctx, cancel := context.WithTimeout(runCtx, 10*time.Second)
	sent := time.Now()
	act, err := h.st.ClaimActivation(ctx, claim)
	cancel()
	switch {
	case err == nil:
	case errors.Is(err, store.ErrActivationLive):
		return 0, true
	case errors.Is(err, store.ErrNotFound), errors.Is(err, store.ErrSessionDestroyed),
		errors.Is(err, store.ErrSessionSleeping):
		return 0, false
	default:
		if runCtx.Err() == nil {
			c.log.Warn("claim activation", "err", err)
			return time.Second, true
		}
		return 0, true
	}
	claimed = true
	// A forced allocation is spent once a slot served a claim; a refused
	// claim leaves the mark to the look.
	h.consumeForce(c.key)
	h.metrics.ActivationStartSeconds.Observe(time.Since(looked).Seconds())
	h.metrics.QuickStarts.Inc()
	return c.runClaimed(runCtx, turnCtx, run, act, sent), true
}

// slotForCapacity takes a slot for a session asleep for lack of capacity
// (store.WaitsForCapacity), waiting at most one scan interval; it reports
// whether a slot is held. The claim that follows wakes the session.
func (c *controller) slotForCapacity(runCtx context.Context, slots *pool) bool {
	if slots.tryAcquire() {
		return true
	}
	wctx, cancel := context.WithTimeout(runCtx, c.h.set.ScanInterval)
	defer cancel()
	return slots.acquire(wctx) == nil
}

// waitForCapacity handles a full pool: a sleep-policy session sleeps at
// once unless allocation is forced; the others wait FIFO, recorded as
// pending, and a restart-policy session sleeps after RestartPendingTimeout.
// ok is true when a slot was acquired.
func (c *controller) waitForCapacity(runCtx context.Context, slots *pool, pol AgentPolicy, sess store.Session) (retry time.Duration, ok bool) {
	h := c.h
	sleep := func(reason string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := h.st.SleepSession(ctx, store.SleepSessionParams{Key: c.key, Reason: reason}); err != nil && !errors.Is(err, store.ErrActivationLive) {
			c.log.Warn("sleep session for capacity", "err", err)
		}
		c.log.Info("no capacity: session sleeps", "pool", pol.Pool, "reason", reason)
	}
	if sess.CrashPolicy == store.CrashSleep && !h.isForced(c.key) {
		sleep(store.SleepReasonCapacity)
		if h.isForced(c.key) {
			// Forced while we put it to sleep: the forcing signal may have
			// landed before our sleep and found the session still active.
			// Wake it and try again, now waiting for a slot.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := h.st.WakeSession(ctx, c.key)
			cancel()
			if err != nil {
				c.log.Warn("wake a forced session", "err", err)
				return time.Second, false
			}
			return 10 * time.Millisecond, false
		}
		return 0, false
	}
	setPending := func(on bool) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := h.st.SetPending(ctx, c.key, on); err != nil {
			c.log.Warn("record pending", "err", err)
		}
	}
	setPending(true)
	h.metrics.PendingSessions.Inc()
	defer h.metrics.PendingSessions.Dec()
	wctx, cancel := context.WithCancel(runCtx)
	if sess.CrashPolicy == store.CrashRestart {
		wctx, cancel = context.WithTimeout(runCtx, pol.RestartPendingTimeout)
	}
	defer cancel()
	err := slots.acquire(wctx)
	setPending(false)
	if err == nil {
		return 0, true
	}
	if runCtx.Err() == nil {
		sleep(store.SleepReasonPendingTimeout)
	}
	return 0, false
}

// expectKey names an agent in a pool (Host.expects).
type expectKey struct{ agentUID, pool string }

// expected is the expectation of the agent's last dispatch in the pool on
// this host, for an activation's first dispatch (nil: none yet). It is a
// hint only: a dispatch whose agent row no longer matches it binds anew.
func (h *Host) expected(k expectKey) *store.ExpectedBinding {
	h.expectMu.Lock()
	defer h.expectMu.Unlock()
	if x, ok := h.expects[k]; ok {
		return &x
	}
	return nil
}

// knownAgent is agent uid as this host last read it (setKnownAgent). An
// agent's name and namespace never change; what it runs may have, which
// the claim's read checks (store.ExpectedBinding).
func (h *Host) knownAgent(uid string) (store.Agent, bool) {
	h.expectMu.Lock()
	defer h.expectMu.Unlock()
	a, ok := h.agents[uid]
	return a, ok
}

// setKnownAgent records a as read by a look at one of its sessions.
func (h *Host) setKnownAgent(a store.Agent) {
	h.expectMu.Lock()
	defer h.expectMu.Unlock()
	if h.agents == nil {
		h.agents = map[string]store.Agent{}
	}
	h.agents[a.UID] = a
}

func (h *Host) setExpected(k expectKey, x store.ExpectedBinding) {
	h.expectMu.Lock()
	defer h.expectMu.Unlock()
	if h.expects == nil {
		h.expects = map[expectKey]store.ExpectedBinding{}
	}
	h.expects[k] = x
}
