package store

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors callers branch on.
var (
	// ErrNotFound: the named row does not exist.
	ErrNotFound = errors.New("not found")
	// ErrConflict: a unique name or key is already taken.
	ErrConflict = errors.New("conflict")
	// ErrSessionDestroyed: the session is destroyed; it accepts nothing.
	ErrSessionDestroyed = errors.New("session destroyed")
	// ErrActivationLive: a live activation already holds the actor key.
	ErrActivationLive = errors.New("a live activation already exists for this actor key")
	// ErrSessionSleeping: the session sleeps; a signal or a wake resumes it.
	ErrSessionSleeping = errors.New("session sleeping")
	// ErrNotLive: the activation is no longer live under the given ref.
	ErrNotLive = errors.New("activation is not live under this ref")
	// ErrGone: what the request acts on is gone for good (an expired wait,
	// a destroyed session's wait).
	ErrGone = errors.New("gone")
)

// NotDeadLetterError is the ErrConflict of RedriveEvent and DiscardEvent
// on an event that is not dead-lettered (open, done, discarded, ...): it
// names the event and the status it has.
type NotDeadLetterError struct {
	Key     ActorKey
	EventID int64
	Status  EventStatus
}

func (e *NotDeadLetterError) Error() string {
	return fmt.Sprintf("event %d of %s is %s, not dead_letter", e.EventID, e.Key, e.Status)
}

// Is makes errors.Is(err, ErrConflict) true for every *NotDeadLetterError.
func (e *NotDeadLetterError) Is(target error) bool { return target == ErrConflict }

// TurnInFlightError is AppendEvent's refusal under
// AppendEventParams.RefuseIfInFlight: the session's live activation has a
// current event (EventID), and nothing was written. errors.Is(err,
// ErrConflict) holds.
type TurnInFlightError struct {
	Key     ActorKey
	EventID int64
}

func (e *TurnInFlightError) Error() string {
	return fmt.Sprintf("session %s has a turn in flight (event %d)", e.Key, e.EventID)
}

// Is makes errors.Is(err, ErrConflict) true for every *TurnInFlightError.
func (e *TurnInFlightError) Is(target error) bool { return target == ErrConflict }

// RefuseInFlight is the decision of AppendEventParams.RefuseIfInFlight,
// shared by the drivers: called inside the append transaction, after an
// idempotent re-send was answered with its first event, with the current
// event of the session's live activation (0: none, or no live
// activation). It returns the *TurnInFlightError to refuse with, or nil.
func RefuseInFlight(p AppendEventParams, currentEventID int64) error {
	if !p.RefuseIfInFlight || currentEventID == 0 {
		return nil
	}
	return &TurnInFlightError{Key: p.Key, EventID: currentEventID}
}

// FenceReason says why a reply was rejected (docs/DESIGN.md invariant 3).
type FenceReason string

// Fence rejection reasons, one per check.
const (
	FenceUnknownDelivery    FenceReason = "unknown_delivery"
	FenceWrongActorKey      FenceReason = "wrong_actor_key"
	FenceSupersededDelivery FenceReason = "superseded_delivery"
	FenceStaleEpoch         FenceReason = "stale_epoch"
	FenceStaleRevision      FenceReason = "stale_revision"
	FenceExpiredLease       FenceReason = "expired_lease"
)

// FenceReasons returns every reason, for metrics (a new slice each
// call: no package-level mutable state).
func FenceReasons() []FenceReason {
	return []FenceReason{
		FenceUnknownDelivery, FenceWrongActorKey, FenceSupersededDelivery,
		FenceStaleEpoch, FenceStaleRevision, FenceExpiredLease,
	}
}

// FenceError is returned when a reply's turn_ref does not match the database
// rows. Nothing was written.
type FenceError struct {
	Reason FenceReason
	// Detail names the mismatching field and values, for logs.
	Detail string
}

func (e *FenceError) Error() string {
	if e.Detail == "" {
		return fmt.Sprintf("fence rejected reply: %s", e.Reason)
	}
	return fmt.Sprintf("fence rejected reply: %s: %s", e.Reason, e.Detail)
}

// Is makes errors.Is(err, ErrFence) true for every *FenceError.
func (e *FenceError) Is(target error) bool { return target == ErrFence }

// ErrFence matches any *FenceError with errors.Is.
var ErrFence = errors.New("fence rejected reply")

// NoDueEventError is returned by NextDelivery when no open event is due.
type NoDueEventError struct {
	// NextDueAt is when the oldest open event becomes due; zero when the
	// session has no open event.
	NextDueAt time.Time
}

func (e *NoDueEventError) Error() string {
	if e.NextDueAt.IsZero() {
		return "no open event"
	}
	return "no due event before " + e.NextDueAt.UTC().Format(time.RFC3339Nano)
}

// SessionExistsError is CreateSession's ErrConflict for a key taken by a
// session that is not destroyed (a destroyed session's key is free again).
// It names that session and what refused the call (Field): "key" for a
// create without GetOrCreate; for a get-or-create, the first of
// "crash_policy" and "input" whose value differs from the existing
// session's (see CheckExistingSession).
type SessionExistsError struct {
	// Existing is the session holding the key.
	Existing ActorKey
	// Key is the session key asked for.
	Key string
	// Field is "key", "crash_policy" or "input".
	Field string
}

func (e *SessionExistsError) Error() string {
	if e.Field == "key" {
		return fmt.Sprintf("session key %q is taken by session %s", e.Key, e.Existing.SessionID)
	}
	return fmt.Sprintf("session key %q is taken by session %s, which has a different %s", e.Key, e.Existing.SessionID, e.Field)
}

// Is makes errors.Is(err, ErrConflict) true for every *SessionExistsError.
func (e *SessionExistsError) Is(target error) bool { return target == ErrConflict }
