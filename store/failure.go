package store

import "time"

// FailureInput is what PlanFailure decides on: one failed attempt of an open
// event, with the rows the driver read under the failed activation's row
// lock (or, on sqlite, inside its write transaction).
type FailureInput struct {
	// Policy is the session's crash policy.
	Policy CrashPolicy
	// Counted: the worker had accepted the turn (docs/DESIGN.md "What counts as an
	// attempt"); only a counted failure consumes an attempt and applies
	// the crash policy.
	Counted bool
	// AttemptsBefore is the event's attempts before this failure (≥ 0).
	AttemptsBefore int
	// MaxAttempts is the dead-letter threshold; ≤ 0 means never.
	MaxAttempts int
	// Backoff is the retry delay the caller chose; negative counts as 0.
	Backoff time.Duration
	// SessionStatus is the session's status before the failure.
	SessionStatus SessionStatus
}

// SessionAction is what a failed attempt does to its session.
type SessionAction int

// Session actions of a FailurePlan.
const (
	// SessionKeep leaves the session as it is.
	SessionKeep SessionAction = iota
	// SessionSleep parks an active session: sleeping, sleep_ts = DB now,
	// sleep_reason "crash", pending_since cleared. Drivers guard the write
	// with status = 'active' in SQL.
	SessionSleep
	// SessionDestroy destroys the session: destroyed, destroy_ts, open
	// events discarded (a dead letter stays dead_letter), alarms deleted.
	SessionDestroy
)

// FailurePlan is the decision PlanFailure takes; a driver writes it and
// nothing else.
type FailurePlan struct {
	// Attempts is the event's attempts after the failure.
	Attempts int
	// Status is the event's status after the failure: EventOpen or
	// EventDeadLetter (closed_at = DB now).
	Status EventStatus
	// Delay sets next_attempt_at = DB now + Delay (≥ 0).
	Delay time.Duration
	// Session is what happens to the session.
	Session SessionAction
	// DetachSteers: the steers attached to the event (steer_of) become
	// queued events of their own, because the event left open.
	DetachSteers bool
}

// SleepReasonCrash is the sleep_reason of a session the sleep crash
// policy parked.
const SleepReasonCrash = "crash"

// PlanFailure decides what one failed attempt does (docs/DESIGN.md "Failure, retry
// and crash policy"):
//
//   - A counted failure adds an attempt; once attempts reach MaxAttempts
//     (> 0) the event is dead-lettered and its attached steers detached. An
//     uncounted one changes neither and never applies the crash policy.
//   - The retry is due after Backoff ("next_attempt_at = now + backoff") —
//     except when the sleep policy parks the session: then the wake is the
//     trigger and the event is due at once. A dead-lettered event is not
//     parked, so it keeps the backoff under every policy.
//   - Crash policy, counted failures only: restart keeps the session;
//     sleep parks an active session unless the event was dead-lettered
//     (the session moves on to its next event); a session already sleeping
//     keeps its sleep_ts and reason; destroy destroys a session not yet
//     destroyed, dead letter or not.
func PlanFailure(in FailureInput) FailurePlan {
	p := FailurePlan{Attempts: in.AttemptsBefore, Status: EventOpen, Delay: max(in.Backoff, 0)}
	if !in.Counted {
		return p
	}
	p.Attempts++
	if in.MaxAttempts > 0 && p.Attempts >= in.MaxAttempts {
		p.Status = EventDeadLetter
		p.DetachSteers = true
	}
	switch in.Policy {
	case CrashSleep:
		if p.Status == EventDeadLetter {
			break
		}
		p.Delay = 0
		if in.SessionStatus == SessionActive {
			p.Session = SessionSleep
		}
	case CrashDestroy:
		if in.SessionStatus != SessionDestroyed {
			p.Session = SessionDestroy
		}
	}
	return p
}

// Last errors the watchdog records on an event whose activation's lease
// expired.
const (
	ErrTextLeaseLostSent    = "lease expired: host lost while the turn ran"
	ErrTextLeaseLostCreated = "lease expired: host lost before the turn was sent"
)

// LeaseLost is the watchdog's failure of the event in flight when a lease
// expired, from the state its delivery was closed with (the SQL moves sent
// to superseded, created to send_failed): a superseded delivery — a worker
// had the turn — counts an attempt and waits out backoff; a send_failed one
// was never sent, so it counts nothing and is due at once (docs/DESIGN.md "What
// counts as an attempt"). lastError is recorded on the event.
func LeaseLost(closed DeliveryState, backoff time.Duration) (counted bool, delay time.Duration, lastError string) {
	if closed == DeliverySuperseded {
		return true, backoff, ErrTextLeaseLostSent
	}
	return false, 0, ErrTextLeaseLostCreated
}
