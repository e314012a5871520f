package store

import (
	"testing"
	"time"
)

func TestPlanFailure(t *testing.T) {
	const hour = time.Hour
	cases := []struct {
		name string
		in   FailureInput
		want FailurePlan
	}{
		{"uncounted keeps attempts and backoff, no policy",
			FailureInput{Policy: CrashDestroy, AttemptsBefore: 2, MaxAttempts: 3, Backoff: hour, SessionStatus: SessionActive},
			FailurePlan{Attempts: 2, Status: EventOpen, Delay: hour}},
		{"uncounted under sleep keeps the backoff",
			FailureInput{Policy: CrashSleep, MaxAttempts: 1, Backoff: hour, SessionStatus: SessionActive},
			FailurePlan{Status: EventOpen, Delay: hour}},
		{"negative backoff is none",
			FailureInput{Policy: CrashRestart, Counted: true, Backoff: -hour, SessionStatus: SessionActive},
			FailurePlan{Attempts: 1, Status: EventOpen}},
		{"restart retries after backoff",
			FailureInput{Policy: CrashRestart, Counted: true, AttemptsBefore: 1, MaxAttempts: 5, Backoff: hour, SessionStatus: SessionActive},
			FailurePlan{Attempts: 2, Status: EventOpen, Delay: hour}},
		{"restart dead-letters at max attempts",
			FailureInput{Policy: CrashRestart, Counted: true, AttemptsBefore: 4, MaxAttempts: 5, Backoff: hour, SessionStatus: SessionActive},
			FailurePlan{Attempts: 5, Status: EventDeadLetter, Delay: hour, DetachSteers: true}},
		{"max attempts 0 never dead-letters",
			FailureInput{Policy: CrashRestart, Counted: true, AttemptsBefore: 99, Backoff: hour, SessionStatus: SessionActive},
			FailurePlan{Attempts: 100, Status: EventOpen, Delay: hour}},
		{"sleep parks an active session, due at once",
			FailureInput{Policy: CrashSleep, Counted: true, MaxAttempts: 5, Backoff: hour, SessionStatus: SessionActive},
			FailurePlan{Attempts: 1, Status: EventOpen, Session: SessionSleep}},
		{"sleep on a sleeping session keeps its sleep, due at once",
			FailureInput{Policy: CrashSleep, Counted: true, MaxAttempts: 5, Backoff: hour, SessionStatus: SessionSleeping},
			FailurePlan{Attempts: 1, Status: EventOpen}},
		{"sleep dead letter moves on with the backoff",
			FailureInput{Policy: CrashSleep, Counted: true, MaxAttempts: 1, Backoff: hour, SessionStatus: SessionActive},
			FailurePlan{Attempts: 1, Status: EventDeadLetter, Delay: hour, DetachSteers: true}},
		{"destroy destroys",
			FailureInput{Policy: CrashDestroy, Counted: true, MaxAttempts: 5, Backoff: hour, SessionStatus: SessionSleeping},
			FailurePlan{Attempts: 1, Status: EventOpen, Delay: hour, Session: SessionDestroy}},
		{"destroy with a dead letter destroys, the dead letter stays",
			FailureInput{Policy: CrashDestroy, Counted: true, MaxAttempts: 1, SessionStatus: SessionActive},
			FailurePlan{Attempts: 1, Status: EventDeadLetter, Session: SessionDestroy, DetachSteers: true}},
		{"destroy of a destroyed session does nothing more",
			FailureInput{Policy: CrashDestroy, Counted: true, MaxAttempts: 5, Backoff: hour, SessionStatus: SessionDestroyed},
			FailurePlan{Attempts: 1, Status: EventOpen, Delay: hour}},
	}
	for _, c := range cases {
		if got := PlanFailure(c.in); got != c.want {
			t.Errorf("%s: PlanFailure(%+v) = %+v, want %+v", c.name, c.in, got, c.want)
		}
	}
}

func TestLeaseLost(t *testing.T) {
	if c, d, msg := LeaseLost(DeliverySuperseded, time.Minute); !c || d != time.Minute || msg != ErrTextLeaseLostSent {
		t.Errorf("LeaseLost(superseded) = %v, %v, %q", c, d, msg)
	}
	if c, d, msg := LeaseLost(DeliverySendFailed, time.Minute); c || d != 0 || msg != ErrTextLeaseLostCreated {
		t.Errorf("LeaseLost(send_failed) = %v, %v, %q", c, d, msg)
	}
}
