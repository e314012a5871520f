package store

import (
	"encoding/json"
	"fmt"

	"github.com/paddock-dev/paddock/abi"
)

// The rules of the stream and wait writes both drivers apply before (or
// around) their SQL.

// CheckCommitWait validates CommitTurnParams.Wait before any database
// access: a wait comes with outcome wait and only with it, and it passes
// CheckWait (ErrInvalid names what is wrong).
func CheckCommitWait(p CommitTurnParams) error {
	outcome := CommitOutcome(p)
	switch {
	case p.Wait == nil && outcome == abi.OutcomeWait:
		return fmt.Errorf("outcome wait without a wait: %w", ErrInvalid)
	case p.Wait == nil:
		return nil
	case outcome != abi.OutcomeWait:
		return fmt.Errorf("wait %q with outcome %q (only outcome wait opens one): %w", p.Wait.ID, outcome, ErrInvalid)
	case p.Wait.CallSeq != 0 || p.Wait.CallDigest != "":
		return fmt.Errorf("wait %q: a call seq or digest belongs to an approval, not a commit: %w", p.Wait.ID, ErrInvalid)
	}
	return CheckWait(p.Wait)
}

// CheckHold validates FailAttemptParams.Hold before any database access:
// a hold is never counted and names the host call it is for (ErrInvalid
// names what is wrong). Without a Hold it returns nil.
func CheckHold(p FailAttemptParams) error {
	if p.Hold == nil {
		return nil
	}
	switch {
	case p.Counted:
		return fmt.Errorf("approval wait %q on a counted failure: %w", p.Hold.ID, ErrInvalid)
	case p.Hold.CallSeq < 1 || p.Hold.CallDigest == "":
		return fmt.Errorf("approval wait %q: call seq %d, digest %q: want the host call's seq (≥ 1) and digest: %w",
			p.Hold.ID, p.Hold.CallSeq, p.Hold.CallDigest, ErrInvalid)
	}
	return CheckWait(p.Hold)
}

// MaxResolutionBytes bounds a wait's resolution (as WaitSpec.Data).
const MaxResolutionBytes = 64 << 10

// CheckResolution validates ResolveWaitParams.Resolution for a wait of
// kind and returns what to store: JSON, "null" when empty; an approval's
// must be an ApprovalDecision object (ErrInvalid names what is wrong).
func CheckResolution(kind WaitKind, raw json.RawMessage) (json.RawMessage, error) {
	if len(raw) == 0 {
		raw = json.RawMessage("null")
	}
	switch {
	case len(raw) > MaxResolutionBytes:
		return nil, fmt.Errorf("resolution is %d bytes, limit %d: %w", len(raw), MaxResolutionBytes, ErrInvalid)
	case !json.Valid(raw):
		return nil, fmt.Errorf("resolution is not a JSON value: %w", ErrInvalid)
	}
	if kind == WaitKindApproval {
		var d *ApprovalDecision
		if err := json.Unmarshal(raw, &d); err != nil || d == nil {
			return nil, fmt.Errorf(`approval resolution must be {"approved": bool, "reason"?: string}: %w`, ErrInvalid)
		}
	}
	return raw, nil
}

// WaitIdempotencyKey is the idempotency key of the event a wait's
// resolution or expiry appends: "wait:<id>" (one per wait and session).
func WaitIdempotencyKey(waitID string) string { return "wait:" + waitID }

// WaitResolvedEventKind is the kind of the event ResolveWait (resolved)
// or ExpireDueWaits (expired) appends for a wait of kind wait.
func WaitResolvedEventKind(status WaitStatus) string {
	if status == WaitExpired {
		return abi.EventWaitExpired
	}
	return abi.EventWaitResolved
}

// TimeoutMillis is a wait's timeout in whole milliseconds (0: none; a
// positive timeout under 1 ms counts as 1 ms).
func (p *WaitParams) TimeoutMillis() int64 {
	if p.Timeout <= 0 {
		return 0
	}
	return max(1, p.Timeout.Milliseconds())
}

// HoldFrame is the first of the two frames FailAttempt writes for a
// Hold: turn.retrying (reason approval, no due time); wait.opened (its
// body the wait) follows.
func HoldFrame() (kind string, body AttemptEndedBody) {
	return FrameTurnRetrying, AttemptEndedBody{Reason: EndReasonApproval}
}
