package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/tracing"
)

// The signal kinds besides abi.EventMessage and abi.EventSteer.
const (
	// SignalCancel cancels the turn in flight, or a queued event by id.
	SignalCancel = "cancel"
	// SignalWake wakes a sleeping session.
	SignalWake = "wake"
)

// SignalParams is a signal as a client sends it (docs/DESIGN.md "Steering and
// cancellation").
type SignalParams struct {
	// Kind is abi.EventMessage (when empty), abi.EventSteer, SignalCancel
	// or SignalWake.
	Kind string
	// Message and Data are a message's or steer's payload (one of them
	// at least); Data is JSON, and JSON null counts as absent. Encoded
	// together they take at most MaxEventPayloadBytes.
	Message string
	Data    json.RawMessage
	// IdempotencyKey (messages and steers): a signal re-sent with the
	// same key returns the first event (docs/DESIGN.md invariant 7). 1–200
	// printable ASCII characters without spaces.
	IdempotencyKey string
	// EventID names the event a cancel aims at (0: the one in flight).
	EventID int64
	// MidTurn (message signals only) overrides the agent's mid_turn policy
	// for this message: what it does when the session has a turn in
	// flight (docs/DESIGN.md "Messages that arrive mid-turn"). Empty: the
	// agent's policy (host.AgentPolicy.MidTurn; queue by default).
	MidTurn host.MidTurn
	// ForceAllocation: a sleep-policy session waits for capacity instead
	// of sleeping at once when its pool is full (docs/DESIGN.md "Capacity").
	ForceAllocation bool
}

// SignalResult is what accepting a signal did.
type SignalResult struct {
	// Kind is the signal's kind (the default filled in).
	Kind string
	// Event is the message's, steer's or cancelled event (zero for a wake).
	Event store.Event
	// Created is false when an idempotent re-send returned the first event.
	Created bool
	// InFlight (steer, cancel, and a message under mid_turn steer or
	// interrupt): the signal reached a turn in flight — steered it, or
	// cancelled it.
	InFlight bool
	// MidTurn (messages): the mid_turn policy the message was accepted
	// under (the signal's, else the agent's).
	MidTurn host.MidTurn
	// Interrupted (a message under mid_turn interrupt): the event whose
	// turn in flight was cancelled (0: none was in flight, or it closed
	// before the cancel).
	Interrupted int64
	// Status is, for a wake, the session's status after it.
	Status store.SessionStatus
}

// Signal accepts a signal for agent a's (as GetAgent returned it) session
// sessionID, persists it and wakes the runtime (Host.Ensure; Host.Force
// first when p.ForceAllocation). Refusals: *InvalidError (kind, message,
// idempotency_key, event_id), *TooLargeError (message) past
// MaxEventPayloadBytes, a *ConflictError ConflictIdempotencyKeyReused when
// the key was used for another signal, a *ConflictError
// ConflictTurnInFlight for a message under mid_turn reject while a turn is
// in flight, a *NotFoundError for an unknown session, and
// store.ErrSessionDestroyed for a destroyed one; a cancel's refusals are
// CancelEvent's. A caller whose role is below the signal's op (SignalOp)
// is refused with a *ForbiddenError before anything is written. A message's mid_turn (p.MidTurn, else the agent's policy)
// decides what it does while a turn is in flight: see midTurnMessage.
//
// The acceptance is a span (tracing.SpanSignal), a child of ctx's span
// or remote span context (a request's traceparent, tracing.Middleware); a
// message is stored with the traceparent of that span, so that its turns
// join the trace (docs/DESIGN.md "Tracing").
func (s *Service) Signal(ctx context.Context, a store.Agent, sessionID string, p SignalParams) (SignalResult, error) {
	ctx, span := s.h.Tracer().Start(ctx, tracing.SpanSignal, trace.WithAttributes(
		tracing.AttrAgent.String(a.Name), tracing.AttrSession.String(sessionID), tracing.AttrSignalKind.String(p.Kind)))
	res, err := s.signal(ctx, a, sessionID, p)
	if err == nil && res.Event.ID != 0 {
		span.SetAttributes(tracing.AttrEventID.Int64(res.Event.ID), tracing.AttrCreated.Bool(res.Created))
	}
	tracing.End(span, err)
	return res, err
}

func (s *Service) signal(ctx context.Context, a store.Agent, sessionID string, p SignalParams) (SignalResult, error) {
	if p.Kind == "" {
		p.Kind = abi.EventMessage
	}
	// A message is a client's; a steer, cancel, wake, forced allocation
	// or mid_turn override that steers or cancels, an operator's.
	if err := s.Authorize(ctx, SignalOp(p)); err != nil {
		return SignalResult{}, err
	}
	if string(p.Data) == "null" {
		p.Data = nil
	}
	if err := abi.ValidText(p.Message); err != nil {
		return SignalResult{}, invalid("message", "message %v", err)
	}
	if p.IdempotencyKey != "" && !keyRE.MatchString(p.IdempotencyKey) {
		return SignalResult{}, invalid("idempotency_key", "idempotency_key must be 1–200 printable ASCII characters without spaces")
	}
	if pre, ok := reservedKeyPrefix(p.IdempotencyKey); ok {
		return SignalResult{}, invalid("idempotency_key", "idempotency_key %q: keys starting with %q are the host's own (wait resolutions, alarms); choose another", p.IdempotencyKey, pre)
	}
	if p.MidTurn != "" {
		if !p.MidTurn.Valid() {
			return SignalResult{}, invalid("mid_turn", "mid_turn %q must be queue, steer, interrupt or reject", string(p.MidTurn))
		}
		if p.Kind != abi.EventMessage {
			return SignalResult{}, invalid("mid_turn", "mid_turn is only for message signals, not %s", p.Kind)
		}
	}
	if p.Kind == abi.EventMessage || p.Kind == abi.EventSteer {
		// Only signals that bring work count against a quota: a cancel
		// or a wake stays possible over it (the stop button must work
		// when the budget is spent).
		if err := s.checkSignal(ctx, a.Namespace); err != nil {
			return SignalResult{}, err
		}
	}
	key := store.ActorKey{AgentUID: a.UID, SessionID: sessionID}
	var payload json.RawMessage
	switch p.Kind {
	case abi.EventMessage, abi.EventSteer:
		if p.Message == "" && len(p.Data) == 0 {
			return SignalResult{}, missing("message", "a %s signal needs a message (or data)", p.Kind)
		}
		if p.EventID != 0 {
			return SignalResult{}, invalid("event_id", "event_id is only for cancel signals")
		}
		var err error
		payload, err = abi.Marshal(struct {
			Message string          `json:"message,omitempty"`
			Data    json.RawMessage `json:"data,omitempty"`
		}{p.Message, p.Data})
		if err != nil {
			return SignalResult{}, wrap("encode signal", err)
		}
		if len(payload) > MaxEventPayloadBytes {
			// Refused now rather than accepted and failed at every attempt
			// (a turn request too large for a worker is not retryable).
			return SignalResult{}, &TooLargeError{Field: "message", Size: len(payload), Limit: MaxEventPayloadBytes,
				Message: fmt.Sprintf("message and data encode to %d bytes; a signal may carry at most %d (a quarter of a turn request, abi.MaxRequestBytes)", len(payload), MaxEventPayloadBytes)}
		}
	case SignalCancel:
		if p.IdempotencyKey != "" {
			return SignalResult{}, invalid("idempotency_key", "a cancel signal takes no idempotency_key, only event_id (0 or absent: the turn in flight)")
		}
		if p.Message != "" || len(p.Data) > 0 {
			return SignalResult{}, invalid("message", "a cancel signal takes only event_id (0 or absent: the turn in flight)")
		}
		if p.EventID < 0 {
			return SignalResult{}, invalid("event_id", "event_id %d must be a positive event id (0 or absent: the turn in flight)", p.EventID)
		}
		if p.ForceAllocation {
			return SignalResult{}, invalid("force_allocation", "a cancel signal allocates nothing: force_allocation is for signals that bring work or wake the session")
		}
	case SignalWake:
		if p.Message != "" || len(p.Data) > 0 || p.EventID != 0 {
			return SignalResult{}, invalid("message", "a wake signal takes no message, data or event_id")
		}
	default:
		return SignalResult{}, invalid("kind", "kind %q must be message, steer, cancel or wake", p.Kind)
	}
	if p.ForceAllocation {
		// Marked before the store write, so that the controller its
		// wake-up starts already sees it (Host.Force).
		s.h.Force(key)
	}
	notFound := func(err error) error {
		if errors.Is(err, store.ErrNotFound) {
			return notFoundSession(a, sessionID)
		}
		return wrap("signal "+p.Kind, err)
	}
	switch p.Kind {
	case SignalCancel:
		return s.CancelEvent(ctx, a, key, p.EventID)
	case SignalWake:
		x, err := s.st.WakeSession(ctx, key)
		if err != nil {
			return SignalResult{}, notFound(err)
		}
		s.h.Ensure(key)
		return SignalResult{Kind: SignalWake, Status: x.Status}, nil
	}
	res := SignalResult{Kind: p.Kind}
	if p.Kind == abi.EventSteer {
		st, err := s.st.Steer(ctx, store.SteerParams{Key: key, Payload: payload, IdempotencyKey: p.IdempotencyKey, DeliveryID: uuid.NewString(),
			Traceparent: tracing.Traceparent(ctx)})
		if err != nil {
			return SignalResult{}, notFound(err)
		}
		res.Event, res.Created, res.InFlight = st.Event, st.Created, st.InFlight
	} else {
		res.MidTurn = p.MidTurn
		if res.MidTurn == "" {
			res.MidTurn = s.h.Policy().ForAgent(a).MidTurn
		}
		if res.MidTurn == "" {
			res.MidTurn = host.MidTurnQueue
		}
		if err := s.midTurnMessage(ctx, key, payload, p.IdempotencyKey, &res); err != nil {
			var tif *store.TurnInFlightError
			if errors.As(err, &tif) {
				return SignalResult{}, &ConflictError{Reason: ConflictTurnInFlight, Field: "mid_turn",
					Message: fmt.Sprintf("session %q has a turn in flight (event %d) and mid_turn is reject: nothing was written; send it again after the turn, or with mid_turn queue, steer or interrupt", sessionID, tif.EventID)}
			}
			return SignalResult{}, notFound(err)
		}
	}
	if !res.Created && !sameSignal(res.Event, p.Kind, payload) {
		// The key was used for another signal: refuse rather than drop
		// this one silently (the first one stays as it was).
		return SignalResult{}, &ConflictError{Reason: ConflictIdempotencyKeyReused, Field: "idempotency_key",
			Message: fmt.Sprintf("idempotency_key %q was used for a different signal (event %d); use a new key", p.IdempotencyKey, res.Event.ID)}
	}
	if res.Created {
		s.h.Appended(res.Event)
	}
	return res, nil
}

// sameSignal is store.SameSignal, where a message re-sent matches its
// first event also when that was delivered as a steer (mid_turn steer).
func sameSignal(e store.Event, kind string, payload []byte) bool {
	if kind == abi.EventMessage && e.Kind == abi.EventSteer {
		kind = abi.EventSteer
	}
	return store.SameSignal(e, kind, payload)
}

// midTurnMessage persists a message under res.MidTurn, filling res.Event,
// res.Created, res.InFlight and res.Interrupted:
//
//   - queue: appended; it runs after the turn in flight.
//   - steer: store.Steer — attached to the turn in flight (InFlight), or
//     queued like a message when none is.
//   - reject: appended with RefuseIfInFlight; a turn in flight refuses it
//     in the append's transaction (*store.TurnInFlightError), nothing
//     written.
//   - interrupt: first appended with RefuseIfInFlight (nothing in flight,
//     or an idempotent re-send: done, nothing cancelled); refused, the
//     event in flight it names is cancelled (store.CancelEvent by id: a
//     cancelled transcript turn, its delivery superseded so the worker's
//     late reply is fenced off; the controller is poked to abort the
//     worker), then the message is appended. A turn that committed first
//     stays committed (the cancel finds it closed). The message runs
//     after the events queued before it, as any message.
func (s *Service) midTurnMessage(ctx context.Context, key store.ActorKey, payload json.RawMessage, idem string, res *SignalResult) error {
	p := store.AppendEventParams{Key: key, Kind: abi.EventMessage, Payload: payload, IdempotencyKey: idem,
		Traceparent: tracing.Traceparent(ctx)}
	// The call's audit row goes with the event it creates (one commit). A
	// created event is an accepted signal (only a re-send is refused
	// after its append), so the row is marked written at once.
	var carried *CallAudit
	p.Audit, carried = carriedAudit(ctx)
	appendEvent := func() (err error) {
		res.Event, res.Created, err = s.st.AppendEvent(ctx, p)
		if err == nil && res.Created && p.Audit != nil {
			carried.written.Store(true)
		}
		return err
	}
	var err error
	switch res.MidTurn {
	case host.MidTurnSteer:
		st, err := s.st.Steer(ctx, store.SteerParams{Key: key, Payload: payload, IdempotencyKey: idem, DeliveryID: uuid.NewString(),
			Traceparent: p.Traceparent})
		if err != nil {
			return err
		}
		res.Event, res.Created, res.InFlight = st.Event, st.Created, st.InFlight
		return nil
	case host.MidTurnReject:
		p.RefuseIfInFlight = true
	case host.MidTurnInterrupt:
		p.RefuseIfInFlight = true
		err = appendEvent()
		var tif *store.TurnInFlightError
		if !errors.As(err, &tif) {
			return err
		}
		c, cerr := s.st.CancelEvent(ctx, store.CancelEventParams{Key: key, EventID: tif.EventID, Reason: "interrupted by a message"})
		switch {
		case cerr == nil:
			res.Interrupted, res.InFlight = c.Event.ID, c.InFlight
			if c.InFlight {
				s.h.Ensure(key) // the controller aborts the worker
				s.poke(key)     // frame turn.failed (cancelled)
			}
		case errors.Is(cerr, store.ErrConflict) || errors.Is(cerr, store.ErrNotFound):
			// Closed meanwhile (committed, or cancelled by another
			// signal): nothing left to interrupt.
		default:
			return cerr
		}
		p.RefuseIfInFlight = false
	}
	return appendEvent()
}

// CancelEvent cancels event eventID of agent a's session key (0: the turn
// in flight) and pokes the owning controller, which aborts the worker; its
// late reply is fenced off. Refusals: a *NotFoundError for an unknown
// session or event (field "event_id"); a *ConflictError
// ConflictNothingInFlight or ConflictEventClosed; store.ErrSessionDestroyed
// for a destroyed session, as to any signal.
func (s *Service) CancelEvent(ctx context.Context, a store.Agent, key store.ActorKey, eventID int64) (SignalResult, error) {
	res, err := s.st.CancelEvent(ctx, store.CancelEventParams{Key: key, EventID: eventID, Reason: "cancelled by client"})
	if errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrConflict) {
		// The store cancels nothing in a destroyed session (its events
		// are closed, its activation failed): say why.
		x, gerr := s.st.GetSession(ctx, key)
		switch {
		case errors.Is(gerr, store.ErrNotFound):
			return SignalResult{}, notFoundSession(a, key.SessionID)
		case gerr != nil:
			return SignalResult{}, wrap("cancel", gerr)
		case x.Status == store.SessionDestroyed:
			return SignalResult{}, fmt.Errorf("cancel in session %s: %w", key, store.ErrSessionDestroyed)
		}
	}
	switch {
	case errors.Is(err, store.ErrNotFound) && eventID == 0:
		return SignalResult{}, &ConflictError{Reason: ConflictNothingInFlight, Field: "event_id",
			Message: "no turn is in flight; name a queued event with event_id (paddock signal cancel --event) to cancel it"}
	case errors.Is(err, store.ErrNotFound):
		return SignalResult{}, &NotFoundError{Resource: ResourceEvent, Field: "event_id",
			Message: fmt.Sprintf("session %q has no event %d", key.SessionID, eventID)}
	case errors.Is(err, store.ErrConflict):
		return SignalResult{}, &ConflictError{Reason: ConflictEventClosed, Field: "event_id",
			Message: fmt.Sprintf("event %d is already closed", eventID)}
	case err != nil:
		return SignalResult{}, wrap("cancel", err)
	}
	if res.InFlight {
		s.h.Ensure(key)
		s.poke(key) // frame turn.failed (cancelled)
	}
	return SignalResult{Kind: SignalCancel, Event: res.Event, Created: true, InFlight: res.InFlight}, nil
}

// reservedKeyPrefix returns the prefix of the idempotency keys of the
// events the host appends itself that key starts with, if any
// (store.WaitIdempotencyKey "wait:", store.AlarmIdempotencyKey "alarm:"):
// a client's event with such a key would stand for the host's, which
// would then not be appended.
func reservedKeyPrefix(key string) (string, bool) {
	for _, pre := range [...]string{"wait:", "alarm:"} {
		if strings.HasPrefix(key, pre) {
			return pre, true
		}
	}
	return "", false
}
