package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/tracing"
)

// ResourceWait is a session's wait (docs/DESIGN.md "Waits and approvals").
const ResourceWait Resource = "wait"

// MaxApprovalReasonBytes bounds an approver's reason.
const MaxApprovalReasonBytes = 1000

// ParseWaitStatus checks a wait status filter: "" (every status), open,
// resolved, expired or cancelled; else an *InvalidError for "status".
func ParseWaitStatus(status string) (store.WaitStatus, error) {
	switch st := store.WaitStatus(status); st {
	case "", store.WaitOpen, store.WaitResolved, store.WaitExpired, store.WaitCancelled:
		return st, nil
	}
	return "", invalid("status", "status %q must be open, resolved, expired or cancelled", status)
}

// ListWaits pages agent a's waits (as GetAgent returned it), of session
// sessionID when it is set, of one status or ("") all, oldest first. p.After
// is the previous page's NextAfter (0 to start). Refusals: *InvalidError
// (status, limit, after).
func (s *Service) ListWaits(ctx context.Context, a store.Agent, sessionID, status string, p Page) (store.WaitPage, error) {
	st, err := ParseWaitStatus(status)
	if err != nil {
		return store.WaitPage{}, err
	}
	if p, err = p.check(); err != nil {
		return store.WaitPage{}, err
	}
	pg, err := s.st.ListWaits(ctx, store.ListWaitsParams{AgentUID: a.UID, SessionID: sessionID, Status: st, After: p.After, Limit: p.Limit})
	if pg.Waits == nil {
		pg.Waits = []store.Wait{}
	}
	return pg, wrap("list waits", err)
}

// GetWait returns wait id of session x (as GetSession returned it).
// Refusals: an *InvalidError (wait) for a malformed id, a *NotFoundError
// (wait) for a wait the session does not have.
func (s *Service) GetWait(ctx context.Context, x store.Session, id string) (store.Wait, error) {
	if !abi.ValidWaitID(id) {
		return store.Wait{}, invalid("wait", "wait id %q: want 1–100 letters, digits, '.', '_', ':' or '-'", id)
	}
	w, err := s.st.GetWait(ctx, x.ActorKey, id)
	if errors.Is(err, store.ErrNotFound) {
		return w, notFoundWait(x, id)
	}
	return w, wrap("get wait", err)
}

func notFoundWait(x store.Session, id string) error {
	return &NotFoundError{Resource: ResourceWait, Field: "wait", Message: fmt.Sprintf("session %q has no wait %q", x.SessionID, id)}
}

// Resolution is what a resolver answers a wait with: Data for a wait of
// kind wait (any JSON value; absent is null), Approved (required) and
// Reason for an approval.
type Resolution struct {
	Data     json.RawMessage
	Approved *bool
	Reason   string
}

// ResolveWait resolves wait w (as GetWait returned it) of session x (as
// GetSession returned it) and wakes the session: a wait of kind wait
// becomes a wait.resolved event carrying r.Data; an approval releases its
// held event, whose host call then runs (approved) or is refused with
// r.Reason. It returns the wait as it is now. Refusals: *InvalidError
// (data, approved or reason — a field the wait's kind does not take, a
// missing decision, a reason over MaxApprovalReasonBytes), *TooLargeError
// (data over store.MaxResolutionBytes), a *ConflictError
// ConflictWaitResolved when it was resolved already, a *GoneError when it
// expired or was cancelled, a *NotFoundError (wait) when it is gone from
// the store, and store.ErrSessionDestroyed (wrapped) for a destroyed
// session. The store decides under its lock: a wait resolved meanwhile
// is refused there the same way.
func (s *Service) ResolveWait(ctx context.Context, x store.Session, w store.Wait, r Resolution) (store.Wait, error) {
	if x.Status == store.SessionDestroyed {
		return store.Wait{}, fmt.Errorf("resolve wait %q: %w", w.ID, store.ErrSessionDestroyed)
	}
	if err := closed(w); err != nil {
		return store.Wait{}, err
	}
	resolution, err := checkResolution(w, r)
	if err != nil {
		return store.Wait{}, err
	}
	w, err = s.st.ResolveWait(ctx, store.ResolveWaitParams{Key: x.ActorKey, WaitID: w.ID, Resolution: resolution,
		Traceparent: tracing.Traceparent(ctx)})
	if wc, ok := errors.AsType[*store.WaitClosedError](err); ok {
		return store.Wait{}, closed(store.Wait{ID: wc.WaitID, Status: wc.Status})
	}
	switch {
	case errors.Is(err, store.ErrNotFound):
		return store.Wait{}, notFoundWait(x, w.ID)
	case errors.Is(err, store.ErrInvalid):
		return store.Wait{}, invalid("data", "%v", err)
	case err != nil:
		return store.Wait{}, wrap("resolve wait", err)
	}
	s.h.Ensure(x.ActorKey) // the wait's event, or the released held event
	s.poke(x.ActorKey)     // frame wait.resolved
	return w, nil
}

// closed refuses a wait that is not open.
func closed(w store.Wait) error {
	switch w.Status {
	case store.WaitOpen:
		return nil
	case store.WaitResolved:
		return &ConflictError{Reason: ConflictWaitResolved, Field: "wait", Message: fmt.Sprintf("wait %q is already resolved", w.ID)}
	case store.WaitExpired:
		return &GoneError{Reason: GoneWaitExpired, Field: "wait", Message: fmt.Sprintf("wait %q expired before it was resolved", w.ID)}
	default:
		return &GoneError{Reason: GoneWaitCancelled, Field: "wait", Message: fmt.Sprintf("wait %q was cancelled (its session was destroyed)", w.ID)}
	}
}

// checkResolution checks r against wait w's kind and returns the
// resolution to store.
func checkResolution(w store.Wait, r Resolution) (json.RawMessage, error) {
	if string(r.Data) == "null" {
		r.Data = nil
	}
	switch w.Kind {
	case store.WaitKindApproval:
		if len(r.Data) > 0 {
			return nil, invalid("data", `wait %q is an approval: answer {"approved": true|false, "reason": "…"}, not "data"`, w.ID)
		}
		if r.Approved == nil {
			return nil, missing("approved", `wait %q is an approval: "approved" (true or false) is required`, w.ID)
		}
		if len(r.Reason) > MaxApprovalReasonBytes {
			return nil, invalid("reason", "reason is %d bytes, limit %d", len(r.Reason), MaxApprovalReasonBytes)
		}
		if err := abi.ValidText(r.Reason); err != nil {
			return nil, invalid("reason", "reason %v", err)
		}
		return store.MustBody(store.ApprovalDecision{Approved: *r.Approved, Reason: r.Reason}), nil
	default:
		if r.Approved != nil || r.Reason != "" {
			field := "approved"
			if r.Approved == nil {
				field = "reason"
			}
			return nil, invalid(field, `wait %q is not an approval: answer {"data": <any JSON>}, without %q`, w.ID, field)
		}
		if len(r.Data) > store.MaxResolutionBytes {
			return nil, &TooLargeError{Field: "data", Size: len(r.Data), Limit: store.MaxResolutionBytes,
				Message: fmt.Sprintf("data is %d bytes, limit %d", len(r.Data), store.MaxResolutionBytes)}
		}
		if len(r.Data) > 0 && !json.Valid(r.Data) {
			return nil, invalid("data", "data is not a JSON value")
		}
		return r.Data, nil
	}
}
