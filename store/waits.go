package store

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/paddock-dev/paddock/abi"
)

// Waits (docs/DESIGN.md "Waits and approvals"): a session waiting for a
// human at zero cost. A turn that ends with outcome wait opens one
// (CommitTurnParams.Wait); a call that needs approval opens one of kind
// approval and holds its event (FailAttemptParams.Hold).

// WaitKind says what opened a wait.
type WaitKind string

const (
	// WaitKindWait: a turn ended with outcome wait.
	WaitKindWait WaitKind = "wait"
	// WaitKindApproval: a host call needs an approver's decision; the
	// call's event is held until it is resolved.
	WaitKindApproval WaitKind = "approval"
)

// WaitStatus is a wait's state; open is the only non-terminal one.
type WaitStatus string

const (
	WaitOpen      WaitStatus = "open"
	WaitResolved  WaitStatus = "resolved"
	WaitExpired   WaitStatus = "expired"
	WaitCancelled WaitStatus = "cancelled" // the session was destroyed
)

// Wait is a wait row.
type Wait struct {
	ActorKey
	ID   string   `json:"wait_id"`
	Kind WaitKind `json:"kind"`
	// EventID is the event whose turn opened the wait (approval: the held
	// event).
	EventID int64  `json:"event_id"`
	For     string `json:"for,omitempty"`
	// Data is what the agent attached (wait) or the call's request with
	// secrets unfilled (approval).
	Data   json.RawMessage `json:"data,omitempty"`
	Status WaitStatus      `json:"status"`
	// CallSeq and CallDigest identify the host call an approval is for.
	CallSeq    int    `json:"call_seq,omitempty"`
	CallDigest string `json:"call_digest,omitempty"`
	// Resolution is the resolver's payload (approval: an
	// ApprovalDecision).
	Resolution json.RawMessage `json:"resolution,omitempty"`
	CreatedAt  time.Time       `json:"created_at"`
	ExpiresAt  *time.Time      `json:"expires_at,omitempty"`
	ClosedAt   *time.Time      `json:"closed_at,omitempty"`
}

// WaitParams open a wait with a commit or a hold.
type WaitParams struct {
	ID   string
	For  string
	Data json.RawMessage
	// Timeout > 0 expires the wait that long after it opens (DB clock).
	Timeout time.Duration
	// CallSeq and CallDigest: approvals only.
	CallSeq    int
	CallDigest string
}

// WaitFromSpec makes a commit's WaitParams from an agent's spec, naming
// the wait "w<eventID>" when the agent did not.
func WaitFromSpec(s *abi.WaitSpec, eventID int64) *WaitParams {
	if s == nil {
		return nil
	}
	id := s.ID
	if id == "" {
		id = fmt.Sprintf("w%d", eventID)
	}
	return &WaitParams{ID: id, For: s.For, Data: s.Data, Timeout: time.Duration(s.TimeoutMs) * time.Millisecond}
}

// ApprovalDecision is the resolution of an approval wait.
type ApprovalDecision struct {
	Approved bool `json:"approved"`
	// Reason is the approver's, returned to the agent on rejection.
	Reason string `json:"reason,omitempty"`
}

// ResolveWaitParams are ResolveWait's inputs.
type ResolveWaitParams struct {
	Key    ActorKey
	WaitID string
	// Resolution is stored with the wait; for a wait of kind wait it is
	// the data of the wait.resolved event appended to the session. JSON
	// (null when empty).
	Resolution json.RawMessage
	// Traceparent is stored with the wait.resolved event a wait of kind
	// wait appends, as AppendEventParams.Traceparent, so that the turn it
	// runs joins the resolver's trace ("" stores none).
	Traceparent string
}

// ListWaitsParams list waits of one agent, or one session when SessionID
// is set; Status "" means every status.
type ListWaitsParams struct {
	AgentUID  string
	SessionID string
	Status    WaitStatus
	// After is the last (created order) position of the previous page:
	// the store pages by an internal row id it returns in NextAfter.
	After int64
	Limit int
}

// WaitPage is a page of ListWaits.
type WaitPage struct {
	Waits     []Wait
	NextAfter int64
}

// WaitClosedError is returned when a wait is resolved that is no longer
// open. Resolved twice: errors.Is ErrConflict (HTTP 409); expired or
// cancelled: errors.Is ErrGone (HTTP 410).
type WaitClosedError struct {
	WaitID string
	Status WaitStatus
}

func (e *WaitClosedError) Error() string {
	return fmt.Sprintf("wait %q is already %s", e.WaitID, e.Status)
}

// Is makes a resolved wait ErrConflict and an expired or cancelled one ErrGone.
func (e *WaitClosedError) Is(target error) bool {
	if e.Status == WaitResolved {
		return target == ErrConflict
	}
	return target == ErrGone
}

// WaitEventPayload is the payload of a wait.resolved or wait.expired event
// (the event's Payload column); the host turns it into abi.Event.Wait.
func WaitEventPayload(w Wait) json.RawMessage {
	return MustBody(abi.WaitEvent{ID: w.ID, For: w.For, Data: w.Resolution})
}

// CheckWait validates a wait to open (ErrInvalid names what is wrong).
func CheckWait(p *WaitParams) error {
	spec := abi.WaitSpec{ID: p.ID, For: p.For, Data: p.Data}
	if p.ID == "" {
		return fmt.Errorf("wait id is empty: %w", ErrInvalid)
	}
	if err := spec.Validate(); err != nil {
		return fmt.Errorf("%v: %w", err, ErrInvalid)
	}
	if p.Timeout < 0 {
		return fmt.Errorf("wait %q: negative timeout: %w", p.ID, ErrInvalid)
	}
	return nil
}
