package fabric

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/fabric/internal/workerkind"
	"github.com/paddock-dev/paddock/fabric/wire"
	"github.com/paddock-dev/paddock/tracing"
)

// Instance runs turns of one binding on the workers of one pool. It holds
// no worker: each Turn picks the live worker of the pool that announces
// the binding's kind and has the most free capacity. It is cheap and safe
// for concurrent use.
type Instance struct {
	b       *Broker
	pool    string
	binding string
	kind    string
	closed  atomic.Bool
}

// Instance returns a handle that runs turns of binding (a module digest
// or "plugin:<name>@<sha256>") on pool's workers. It does not need a
// worker to exist yet. Errors: ErrBadBinding, ErrClosed (wrapped).
func (b *Broker) Instance(pool, binding string) (*Instance, error) {
	kind, err := workerkind.Of(binding)
	if err != nil {
		return nil, err
	}
	if pool == "" {
		return nil, fmt.Errorf("fabric: instance of %s: empty pool name", binding)
	}
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	return &Instance{b: b, pool: pool, binding: binding, kind: kind}, nil
}

// Pool returns the instance's pool.
func (i *Instance) Pool() string { return i.pool }

// Binding returns the instance's binding.
func (i *Instance) Binding() string { return i.binding }

// Close marks the instance closed. Calling it again returns nil.
func (i *Instance) Close(context.Context) error {
	i.closed.Store(true)
	return nil
}

// laneEvent is a turn-lane message routed to a waiting turn.
type laneEvent struct {
	kind wire.Kind
	body []byte
}

// call is one dispatch of a turn to one worker session.
type call struct {
	deliveryID string
	events     chan laneEvent
	// ctx is the ctx of the turn's Instance.Turn, ended when the dispatch
	// does: the worker's host calls are answered under it (its
	// abi.Caller). Set before the call is registered on its session.
	ctx    context.Context
	cancel context.CancelFunc
	// accepted is set once the worker's ACCEPTED arrived (WorkerStatus).
	accepted atomic.Bool
}

// Turn runs one turn on a worker of the pool and returns its result after
// checking it: size (abi.MaxResultBytes), abi.TurnResult.Validate, and the
// echoed turn_ref (the request's or that of a steer sent to the turn). An
// "error" outcome is a valid result, not an error.
//
// The worker with the most free capacity gets the TURN; one that answers
// BUSY is skipped and the next is tried, until none is left (KindBusy). A
// worker that does not answer within AcceptTimeout fails the turn with
// KindAcceptTimeout. After ACCEPTED, the turn waits for the RESULT; if the
// worker's session ends meanwhile (heartbeat or ping timeout, GOODBYE,
// supersede, stalled send) the turn fails at once with KindWorkerLost —
// within HeartbeatTimeout of the worker going silent, whatever ctx's
// deadline. ctx's deadline is sent with the turn; when ctx ends the
// broker sends CANCEL and Turn returns KindTimeout or KindCanceled, also
// when a RESULT is read after ctx ended (a result is used only while the
// caller still waits for it). Steers
// from abi.WithSteers go out as STEER messages. The worker's host calls
// (CALL) are answered through ctx's abi.Caller (abi.WithCaller; none:
// not_configured) under ctx, so the turn's end aborts them.
//
// Errors: a *TurnError (TurnSent reports whether the worker accepted the
// turn), or, before anything was sent, ErrInstanceClosed,
// ErrRequestTooLarge or a JSON encoding error of req.
func (i *Instance) Turn(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
	if i.closed.Load() {
		return nil, ErrInstanceClosed
	}
	reqJSON, err := abi.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("fabric: encode turn request: %w", err)
	}
	if len(reqJSON) > abi.MaxRequestBytes {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrRequestTooLarge, len(reqJSON), abi.MaxRequestBytes)
	}
	tried := map[*session]bool{}
	for {
		if err := ctx.Err(); err != nil {
			return nil, i.fail(nil, ctxKind(ctx), "", false, err, req)
		}
		s, c, kind := i.b.reserve(ctx, i.pool, i.kind, req.TurnRef.DeliveryID, tried)
		if s == nil {
			var err error
			switch kind {
			case KindNoWorker:
				err = fmt.Errorf("no live worker in pool %q runs %s", i.pool, i.kind)
			case KindBusy:
				err = fmt.Errorf("every worker of pool %q running %s is busy", i.pool, i.kind)
			default:
				kind, err = KindWorkerLost, ErrClosed
			}
			return nil, i.fail(nil, kind, "", false, err, req)
		}
		res, busy, err := i.run(ctx, s, c, req, reqJSON)
		if busy {
			tried[s] = true
			continue
		}
		return res, err
	}
}

func ctxKind(ctx context.Context) string {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return KindTimeout
	}
	return KindCanceled
}

// reserve picks the live worker session of pool announcing kind with the
// most free capacity (ties: the one picked least recently), not in tried
// and not already running deliveryID, and registers a call on it, whose
// host calls are answered under ctx. kind is KindNoWorker or KindBusy
// when none fits, "closed" when the broker is.
func (b *Broker) reserve(ctx context.Context, pool, kind, deliveryID string, tried map[*session]bool) (*session, *call, string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, nil, "closed"
	}
	var (
		best     *session
		bestFree int
		matching int
	)
	for _, p := range b.peers {
		s := p.cur
		if s == nil || s.state != stateLive || !slices.Contains(s.hello.Pools, pool) || !slices.Contains(s.hello.Kinds, kind) {
			continue
		}
		matching++
		if tried[s] || s.turns[deliveryID] != nil {
			continue
		}
		free := s.hello.Capacity - s.inflight
		if free <= 0 {
			continue
		}
		if best == nil || free > bestFree || (free == bestFree && s.lastPick.Before(best.lastPick)) {
			best, bestFree = s, free
		}
	}
	if best == nil {
		if matching == 0 {
			return nil, nil, KindNoWorker
		}
		return nil, nil, KindBusy
	}
	c := &call{deliveryID: deliveryID, events: make(chan laneEvent, 8)}
	c.ctx, c.cancel = context.WithCancel(ctx)
	best.turns[deliveryID] = c
	best.inflight++
	best.lastPick = time.Now()
	return best, c, ""
}

// release unregisters c from s: later lane messages for it are late, and
// later CALLs for it are answered cancelled.
func (b *Broker) release(s *session, c *call) {
	b.mu.Lock()
	if s.turns[c.deliveryID] == c {
		delete(s.turns, c.deliveryID)
		s.inflight--
	}
	b.mu.Unlock()
}

// run dispatches the turn to s and waits for its end. busy reports a BUSY
// answer (try another worker).
func (i *Instance) run(ctx context.Context, s *session, c *call, req *abi.TurnRequest, reqJSON []byte) (res *abi.TurnResult, busy bool, err error) {
	b := i.b
	defer b.release(s, c)
	defer c.cancel() // the turn's host calls end with it
	var deadlineMs int64
	if dl, ok := ctx.Deadline(); ok {
		deadlineMs = max(1, time.Until(dl).Milliseconds())
	}
	done := make(chan error, 1)
	turn := wire.Turn{DeliveryID: c.deliveryID, TurnRef: req.TurnRef, Binding: i.binding, DeadlineMs: deadlineMs, Request: reqJSON,
		Traceparent: tracing.Traceparent(ctx)}
	if err := b.enqueue(s, wire.KindTurn, turn, done, false); err != nil {
		return nil, false, i.fail(s, KindSendFailed, "", false, err, req)
	}
	b.st.turns.Add(1)
	// The receipt is due AcceptTimeout after the TURN left; until it has
	// left, the queue's SendTimeout bounds the wait too.
	acceptT := time.NewTimer(b.cfg.AcceptTimeout + b.cfg.SendTimeout)
	defer acceptT.Stop()
	accepted := false
	latest := req.TurnRef
	allowed := []abi.TurnRef{req.TurnRef}
	steers := abi.SteersOf(ctx)
	for {
		select {
		case err := <-done:
			done = nil
			if err != nil {
				return nil, false, i.fail(s, KindSendFailed, "", false, err, req)
			}
			if !accepted {
				acceptT.Reset(b.cfg.AcceptTimeout)
			}
		case ev := <-c.events:
			switch ev.kind {
			case wire.KindAccepted:
				accepted = true
				c.accepted.Store(true)
				acceptT.Stop()
			case wire.KindBusy:
				if accepted {
					continue // a worker contradicting itself: wait for the result
				}
				b.st.busy.Add(1)
				return nil, true, nil
			case wire.KindResult:
				if err := ctx.Err(); err != nil {
					// The turn's context ended before its result was read:
					// the caller has given up on this turn (a cancel or its
					// deadline), so the result is not used, whichever of
					// the two the select saw first. The worker has already
					// ended the turn; no CANCEL is due.
					return nil, false, i.fail(s, ctxKind(ctx), "", accepted, err, req)
				}
				return i.result(s, ev.body, req, allowed)
			case wire.KindError:
				var e wire.Error
				_ = json.Unmarshal(ev.body, &e)
				if e.Code == "" {
					e.Code = wire.ErrCodeInternal
				}
				return nil, false, i.fail(s, KindRemote, e.Code, accepted, errors.New(e.Message), req)
			}
		case <-acceptT.C:
			if accepted {
				continue
			}
			b.st.acc.Add(1)
			b.cancelTurn(s, c.deliveryID, latest, KindAcceptTimeout)
			return nil, false, i.fail(s, KindAcceptTimeout, "", false,
				fmt.Errorf("no ACCEPTED or BUSY within %s", b.cfg.AcceptTimeout), req)
		case <-s.dead:
			b.mu.Lock()
			reason := s.reason
			b.mu.Unlock()
			return nil, false, i.fail(s, KindWorkerLost, reason, accepted, errors.New("the worker's session ended during the turn"), req)
		case st, ok := <-steers:
			if !ok {
				steers = nil
				continue
			}
			body, err := json.Marshal(st)
			if err != nil {
				continue
			}
			if err := b.enqueue(s, wire.KindSteer, wire.Steer{DeliveryID: c.deliveryID, TurnRef: st.TurnRef, Steer: body}, nil, false); err != nil {
				b.log.LogAttrs(ctx, slog.LevelWarn, "fabric steer not sent", slog.String("turn_ref", st.TurnRef.String()),
					slog.String("error", err.Error()))
				continue
			}
			allowed = append(allowed, st.TurnRef)
			latest = st.TurnRef
		case <-ctx.Done():
			b.cancelTurn(s, c.deliveryID, latest, ctxKind(ctx))
			return nil, false, i.fail(s, ctxKind(ctx), "", accepted, ctx.Err(), req)
		}
	}
}

// cancelTurn sends CANCEL for a turn, best effort.
func (b *Broker) cancelTurn(s *session, deliveryID string, ref abi.TurnRef, reason string) {
	_ = b.enqueue(s, wire.KindCancel, wire.Cancel{DeliveryID: deliveryID, TurnRef: ref, Reason: reason}, nil, false)
}

// result decodes and checks a worker's TurnResult.
func (i *Instance) result(s *session, body []byte, req *abi.TurnRequest, allowed []abi.TurnRef) (*abi.TurnResult, bool, error) {
	if len(body) > abi.MaxResultBytes {
		return nil, false, i.fail(s, KindInvalidResult, "", true, fmt.Errorf("result is %d bytes, limit %d", len(body), abi.MaxResultBytes), req)
	}
	res := new(abi.TurnResult)
	if err := json.Unmarshal(body, res); err != nil {
		return nil, false, i.fail(s, KindInvalidResult, "", true, fmt.Errorf("malformed result JSON: %w", err), req)
	}
	if err := res.Validate(); err != nil {
		return nil, false, i.fail(s, KindInvalidResult, "", true, err, req)
	}
	if !slices.Contains(allowed, res.TurnRef) {
		return nil, false, i.fail(s, KindInvalidResult, "", true, fmt.Errorf("result turn_ref %s echoes neither the request's %s nor a steer's",
			res.TurnRef, req.TurnRef), req)
	}
	return res, false, nil
}

// fail builds, logs and returns a TurnError.
func (i *Instance) fail(s *session, kind, code string, accepted bool, err error, req *abi.TurnRequest) *TurnError {
	te := &TurnError{Kind: kind, Pool: i.pool, Binding: i.binding, TurnRef: req.TurnRef.String(), Accepted: accepted, Code: code, Err: err}
	if s != nil {
		te.Worker, te.Incarnation = s.worker, s.key.incarnation.String()
	}
	level := slog.LevelWarn
	if kind == KindCanceled || kind == KindBusy || kind == KindNoWorker {
		level = slog.LevelInfo
	}
	i.b.log.LogAttrs(context.Background(), level, "fabric turn failed", slog.String("turn_ref", te.TurnRef),
		slog.String("kind", kind), slog.String("code", code), slog.String("worker", te.Worker),
		slog.Bool("accepted", accepted), slog.String("error", fmt.Sprint(err)))
	return te
}
