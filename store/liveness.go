package store

import (
	"slices"

	"github.com/paddock-dev/paddock/abi"
)

// Sleep reasons (sessions.sleep_reason) written by Paddock itself; the
// crash policy's is SleepReasonCrash.
const (
	// SleepReasonCapacity: a sleep-policy session found its pool full.
	SleepReasonCapacity = "capacity"
	// SleepReasonPendingTimeout: a restart-policy session waited
	// restart_pending_timeout for a slot.
	SleepReasonPendingTimeout = "pending_timeout"
	// SleepReasonAgent: a turn committed with outcome sleep.
	SleepReasonAgent = "agent"
	// SleepReasonFinish: a turn committed with outcome finish.
	SleepReasonFinish = "finish"
	// SleepReasonWait: a turn committed with outcome wait; the session
	// waits for the wait's resolution or expiry (or another signal).
	SleepReasonWait = "wait"
	// SleepReasonApproval: a host call of the session's turn waits for an
	// approver; its event is held until then.
	SleepReasonApproval = "approval"
)

// CapacitySleepReasons are the sleep reasons of a session parked only for
// lack of capacity (docs/DESIGN.md invariant 11): such a session that holds a due
// open event is runnable (RunnableSessions lists it), and the host that
// has a slot for it wakes and runs it. A session asleep for any other
// reason (the agent's sleep or finish, the crash policy's sleep) waits for
// a signal, a wake, an alarm or a redrive.
func CapacitySleepReasons() []string {
	return []string{SleepReasonCapacity, SleepReasonPendingTimeout}
}

// WaitsForCapacity reports whether s sleeps only for lack of capacity: it
// runs again, without a client action, once a slot of its pool is free.
func WaitsForCapacity(s Session) bool {
	return s.Status == SessionSleeping && slices.Contains(CapacitySleepReasons(), s.SleepReason)
}

// OutcomeSleepReason is the sleep_reason a committed turn's outcome parks
// its session with when no other event of the session is open ("" = the
// session stays active). sleep and finish both park the session until the
// next signal (abi/README.md "Outcomes"); finish does not destroy it.
func OutcomeSleepReason(o abi.Outcome) string {
	switch o {
	case abi.OutcomeSleep:
		return SleepReasonAgent
	case abi.OutcomeFinish:
		return SleepReasonFinish
	case abi.OutcomeWait:
		return SleepReasonWait
	}
	return ""
}
