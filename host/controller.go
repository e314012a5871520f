package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
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
	// inflight is the turn being run, for cleanup after a panic.
	inflight *abi.TurnRef
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
			if now.Sub(t) < c.h.pol.RestartPeriod {
				recent = append(recent, t)
			}
		}
		c.panics = append(recent, now)
		crash := len(c.panics) > c.h.pol.RestartIntensity
		c.log.Error("controller panic recovered", "panic", fmt.Sprint(p), "crash", crash, "stack", string(debug.Stack()))
		if ref := c.inflight; ref != nil {
			c.inflight = nil
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c.fail(ctx, *ref, 1, fmt.Errorf("controller panic: %v", p), crash, "panic")
		}
		retryIn = 100 * time.Millisecond
	}()
	return c.activation(runCtx, turnCtx)
}

// activation claims one activation and runs turns under it until idle,
// lease loss, shutdown or a failed attempt. It returns how long to wait
// before trying again (0 = look at the store again only if woken).
func (c *controller) activation(runCtx, turnCtx context.Context) time.Duration {
	h := c.h
	ctx, cancel := context.WithTimeout(runCtx, 10*time.Second)
	agent, err := h.st.GetAgent(ctx, c.key.AgentUID)
	cancel()
	if err != nil {
		if !errors.Is(err, store.ErrNotFound) && runCtx.Err() == nil {
			c.log.Warn("load agent", "err", err)
			return time.Second
		}
		return 0
	}
	ctx, cancel = context.WithTimeout(runCtx, 10*time.Second)
	act, err := h.st.ClaimActivation(ctx, store.ClaimActivationParams{
		Key: c.key, UID: uuid.NewString(), LeaseID: uuid.NewString(), HostID: h.id, LeaseTTL: h.pol.LeaseTTL,
	})
	cancel()
	switch {
	case err == nil:
	case errors.Is(err, store.ErrActivationLive), errors.Is(err, store.ErrNotFound), errors.Is(err, store.ErrSessionDestroyed):
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
	log := c.log.With("activation", act.UID, "epoch", act.ActorEpoch)
	log.Debug("activation claimed")
	leaseCtx, leaseLost := context.WithCancel(turnCtx)
	defer leaseLost()
	h.holdLease(act.Ref(), leaseLost)
	defer h.dropLease(act.UID)

	var inst Instance
	var instBinding string
	defer func() {
		if inst != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = inst.Close(ctx)
			cancel()
		}
	}()
	stop := func() time.Duration {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := h.st.StopActivation(ctx, act.Ref()); err != nil && !errors.Is(err, store.ErrNotLive) {
			log.Warn("stop activation", "err", err)
		}
		return 0
	}

	idleSince := time.Now()
	for {
		if runCtx.Err() != nil || leaseCtx.Err() != nil {
			return stop()
		}
		ctx, cancel := context.WithTimeout(leaseCtx, 10*time.Second)
		d, err := h.st.NextDelivery(ctx, store.NextDeliveryParams{
			Activation: act.Ref(), DeliveryID: uuid.NewString(), Binding: agent.ModuleDigest,
			MarkSent: true, TailMessages: h.pol.TranscriptTail,
		})
		cancel()
		var noDue *store.NoDueEventError
		switch {
		case errors.As(err, &noDue):
			wait := h.pol.IdleTimeout - time.Since(idleSince)
			if wait <= 0 {
				log.Debug("activation idle, stopping")
				return stop()
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
			case <-time.After(wait):
				if !due {
					log.Debug("activation idle, stopping")
					return stop()
				}
			case <-runCtx.Done():
			case <-leaseCtx.Done():
			}
			continue
		case errors.Is(err, store.ErrNotLive):
			log.Info("activation no longer live")
			return 0
		case err != nil:
			if leaseCtx.Err() == nil {
				log.Warn("next delivery", "err", err)
			}
			stop()
			return time.Second
		}

		// One turn.
		ref := d.Delivery.TurnRef()
		if inst == nil || instBinding != d.Delivery.Binding {
			if inst != nil {
				_ = inst.Close(leaseCtx)
				inst = nil
			}
			inst, err = h.runner.Instantiate(leaseCtx, d.Delivery.Binding)
			if err != nil {
				inst = nil
				return c.fail(context.Background(), ref, d.Attempt, fmt.Errorf("instantiate %s: %w", d.Delivery.Binding, err), true, "instantiate")
			}
			instBinding = d.Delivery.Binding
		}
		req := c.request(agent, d)
		c.inflight = &ref
		tctx, tcancel := context.WithTimeout(leaseCtx, h.pol.TurnTimeout)
		start := time.Now()
		res, err := inst.Turn(tctx, req)
		tcancel()
		h.metrics.TurnSeconds.Observe(time.Since(start).Seconds())
		if err != nil {
			_ = inst.Close(context.Background())
			inst = nil
			c.inflight = nil
			cause := "worker"
			if leaseCtx.Err() != nil {
				cause = "aborted"
			}
			return c.fail(context.Background(), ref, d.Attempt, err, true, cause)
		}
		if res.Outcome == abi.OutcomeError {
			c.inflight = nil
			return c.fail(context.Background(), ref, d.Attempt, fmt.Errorf("agent error: %s", res.Error), true, "agent_error")
		}
		if err := res.Validate(); err != nil {
			c.inflight = nil
			return c.fail(context.Background(), ref, d.Attempt, err, true, "invalid_result")
		}
		ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
		turn, err := h.Commit(ctx, res)
		cancel()
		c.inflight = nil
		var fe *store.FenceError
		switch {
		case errors.As(err, &fe):
			if res.TurnRef != ref {
				// The worker echoed a ref it was not given: fail the attempt
				// under the real one (which may itself be fenced off by now).
				return c.fail(context.Background(), ref, d.Attempt, fmt.Errorf("worker echoed a wrong turn_ref: %w", err), true, "wrong_ref")
			}
			return 0
		case err != nil:
			log.Error("commit turn", "err", err)
			// The commit may or may not have happened; the fences decide on
			// the retry. Drop the activation and look again.
			return time.Second
		}
		log.Debug("turn committed", "turn", turn.TurnNo, "event", turn.EventID, "outcome", turn.Outcome)
		idleSince = time.Now()
		if turn.Outcome == abi.OutcomeSleep || turn.Outcome == abi.OutcomeFinish {
			// The agent has nothing more to do until someone speaks: run what
			// is already due, then stop without the idle wait.
			idleSince = time.Now().Add(-h.pol.IdleTimeout)
		}
		if r, ok := inst.(Recycler); ok && r.ShouldRecycle() {
			_ = inst.Close(context.Background())
			inst = nil
		}
	}
}

// Commit submits a worker's reply through the store's fences (DESIGN
// invariant 3). A rejected reply is counted by reason and logged, and the
// *store.FenceError is returned; nothing was written. Every worker kind's
// replies, late ones included, come through here.
func (h *Host) Commit(ctx context.Context, res *abi.TurnResult) (store.Turn, error) {
	turn, err := h.st.CommitTurn(ctx, store.CommitTurnParams{
		Ref: res.TurnRef, Messages: res.Messages, State: res.State, KeepState: res.State == nil, Outcome: res.Outcome,
	})
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
	h.signalCommit()
	return turn, nil
}

// request builds the TurnRequest of a dispatch.
func (c *controller) request(agent store.Agent, d store.Dispatch) *abi.TurnRequest {
	var payload struct {
		Message string          `json:"message"`
		Data    json.RawMessage `json:"data"`
	}
	_ = json.Unmarshal(d.Event.Payload, &payload) // validated at acceptance
	tail := d.Tail
	if tail == nil {
		tail = []abi.Message{}
	}
	return &abi.TurnRequest{
		ABIVersion: abi.Version,
		TurnRef:    d.Delivery.TurnRef(),
		Session: abi.Session{
			AgentName: agent.Name, SessionID: d.Session.SessionID, Key: d.Session.Key, Input: d.Session.Input,
		},
		Event: abi.Event{
			ID: d.Event.ID, Kind: d.Event.Kind, Message: payload.Message, Data: payload.Data, AcceptedAt: d.Event.AcceptedAt,
		},
		State:      d.State,
		Transcript: tail,
		Attempt:    d.Attempt,
	}
}

// fail records a failed attempt through the fences and returns the backoff
// to wait before the next attempt (0 after a dead letter: go on at once).
func (c *controller) fail(ctx context.Context, ref abi.TurnRef, attempt int, cause error, counted bool, kind string) time.Duration {
	h := c.h
	backoff := h.backoff(attempt)
	if !counted {
		backoff = h.pol.BackoffMin
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := h.st.FailAttempt(ctx, store.FailAttemptParams{
		Ref: ref, Error: cause.Error(), Counted: counted, Backoff: backoff, MaxAttempts: h.pol.MaxAttempts,
	})
	var fe *store.FenceError
	switch {
	case errors.As(err, &fe):
		h.metrics.FenceRejections.WithLabelValues(string(fe.Reason)).Inc()
		c.log.Warn("failed attempt fenced off", "reason", fe.Reason, "cause", cause)
		return 0
	case err != nil:
		c.log.Error("record failed attempt", "err", err, "cause", cause)
		return time.Second
	}
	h.metrics.FailedAttempts.WithLabelValues(kind).Inc()
	if res.DeadLettered {
		h.metrics.DeadLetters.Inc()
		c.log.Warn("event dead-lettered", "event", res.EventID, "attempts", res.Attempts, "cause", cause)
		return time.Millisecond // go on with the next event at once
	}
	c.log.Warn("turn attempt failed", "event", res.EventID, "attempt", attempt, "counted", counted,
		"retry_in", backoff.Round(time.Millisecond), "cause", cause)
	return backoff
}
