package store

import (
	"fmt"
	"time"

	"github.com/paddock-dev/paddock/abi"
)

// HostCall is one row of an event's journal: a host call made by an
// attempt of the event (docs/DESIGN.md invariant 12, "journal"). The
// rows of an event that are not SetAside form its journal proper: at most
// one per Seq, replayed by later attempts whose call at Seq has the same
// RequestDigest.
type HostCall struct {
	ID      int64 `json:"id"`
	EventID int64 `json:"event_id"`
	// Seq is the call's number within the event's attempt, from 1.
	Seq int `json:"seq"`
	// ActorEpoch is the epoch of the attempt that made (and recorded) it.
	ActorEpoch int64 `json:"actor_epoch"`
	// Kind is the abi.CallKind: http or model.
	Kind string `json:"kind"`
	// Destination says where it went, without secrets: "GET
	// https://host:443/path" for http, "endpoint/model" for model.
	Destination string `json:"destination"`
	// RequestDigest is "sha256:<hex>" of the request as the agent sent it
	// (canonical JSON, secret placeholders unfilled).
	RequestDigest string `json:"request_digest"`
	// Result is the encoded abi.CallResult returned to the agent (an
	// error result included), replayed byte for byte. Never holds a
	// secret's value.
	Result []byte `json:"-"`
	// ErrorCode is the result's error code ("" on success).
	ErrorCode string `json:"error_code,omitempty"`
	// Status is the upstream HTTP status (0 when none).
	Status int `json:"status,omitempty"`
	// StartedAt is when the host began the call, by the host's clock (a
	// record, never a correctness decision; zero at RecordHostCall means
	// the database's now); stored at millisecond precision on SQLite,
	// microsecond on PostgreSQL. DurationMS is how long it took, in
	// milliseconds.
	StartedAt  time.Time `json:"started_at"`
	DurationMS int64     `json:"duration_ms"`
	// InputTokens and OutputTokens are a model call's usage.
	InputTokens  int64 `json:"input_tokens,omitempty"`
	OutputTokens int64 `json:"output_tokens,omitempty"`
	// Replays counts later attempts that replayed the row instead of
	// calling again; ReplayedEpoch is the epoch of the last one.
	Replays       int   `json:"replays"`
	ReplayedEpoch int64 `json:"replayed_epoch,omitempty"`
	// SetAside: a later attempt diverged at or before this Seq (sent a
	// different request), so the row is kept for the record but no longer
	// replayed.
	SetAside  bool      `json:"set_aside"`
	CreatedAt time.Time `json:"created_at"`
}

// RecordHostCallParams are RecordHostCall's inputs, validated by
// CheckHostCall before any database access (ErrInvalid).
type RecordHostCallParams struct {
	// Ref is the attempt's turn_ref; the row is written only if it passes
	// the same fences as a commit (the delivery current, the activation
	// live at that epoch with an unexpired lease by the database's clock,
	// the event open) — else *FenceError and nothing is written.
	Ref abi.TurnRef
	// Call is the row (ID, EventID, ActorEpoch, Replays, ReplayedEpoch,
	// SetAside and CreatedAt are set by the store: EventID and ActorEpoch
	// from Ref; a zero StartedAt is the database's now).
	Call HostCall
	// SetAsideFrom > 0 first marks the event's rows with Seq ≥ it set aside
	// (the attempt diverged there), in the same transaction, under the same
	// fences; at most Call.Seq. 0: nothing is set aside.
	SetAsideFrom int
}

// Secret is a secret's metadata; its value never leaves the store
// unencrypted and never leaves the host (docs/DESIGN.md invariant 13).
type Secret struct {
	// Namespace is the secret's namespace; Name is unique within it.
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// MaxSecretNameLen is the longest secret name (CheckSecretName).
const MaxSecretNameLen = 128

// CheckHostCall validates RecordHostCall's inputs before any database
// access: Call.Seq ≥ 1, Call.Kind http or model, a non-empty
// Call.RequestDigest, no negative Status, DurationMS or token count, and
// 0 ≤ SetAsideFrom ≤ Call.Seq (an attempt diverges at or before the call
// it records). Errors name the field and wrap ErrInvalid. The fences are
// the database's to check, not this function's.
func CheckHostCall(p RecordHostCallParams) error {
	c := p.Call
	switch {
	case c.Seq < 1:
		return fmt.Errorf("host call seq %d, want at least 1: %w", c.Seq, ErrInvalid)
	case c.Kind != string(abi.CallKindHTTP) && c.Kind != string(abi.CallKindModel):
		return fmt.Errorf("host call kind %q, want %q or %q: %w", c.Kind, abi.CallKindHTTP, abi.CallKindModel, ErrInvalid)
	case c.RequestDigest == "":
		return fmt.Errorf("host call %d: empty request digest: %w", c.Seq, ErrInvalid)
	case c.Status < 0 || c.DurationMS < 0 || c.InputTokens < 0 || c.OutputTokens < 0:
		return fmt.Errorf("host call %d: negative status, duration or tokens (%d, %d ms, %d in, %d out): %w",
			c.Seq, c.Status, c.DurationMS, c.InputTokens, c.OutputTokens, ErrInvalid)
	case p.SetAsideFrom < 0 || p.SetAsideFrom > c.Seq:
		return fmt.Errorf("host call %d: set aside from %d, want 0 (none) or 1..%d: %w", c.Seq, p.SetAsideFrom, c.Seq, ErrInvalid)
	}
	return nil
}

// CheckHostCallSeq validates ReplayHostCall's seq (≥ 1), wrapping
// ErrInvalid.
func CheckHostCallSeq(seq int) error {
	if seq < 1 {
		return fmt.Errorf("host call seq %d, want at least 1: %w", seq, ErrInvalid)
	}
	return nil
}

// HostCallTaken is RecordHostCall's ErrConflict: a journal row not set
// aside already holds (event, seq).
func HostCallTaken(eventID int64, seq int) error {
	return fmt.Errorf("event %d already has a journal row at seq %d: %w", eventID, seq, ErrConflict)
}

// NoHostCall is ReplayHostCall's ErrNotFound: no journal row not set
// aside at (event, seq).
func NoHostCall(eventID int64, seq int) error {
	return fmt.Errorf("event %d has no journal row at seq %d: %w", eventID, seq, ErrNotFound)
}

// CheckSecretName validates a secret's name: 1 to MaxSecretNameLen
// characters of [A-Za-z0-9_.-]. The error names it and wraps ErrInvalid.
func CheckSecretName(name string) error {
	if name == "" || len(name) > MaxSecretNameLen {
		return fmt.Errorf("secret name %q: want 1 to %d characters: %w", name, MaxSecretNameLen, ErrInvalid)
	}
	for _, r := range name {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '.' || r == '-'
		if !ok {
			return fmt.Errorf("secret name %q: character %q is not one of [A-Za-z0-9_.-]: %w", name, r, ErrInvalid)
		}
	}
	return nil
}

// CheckSecret validates PutSecret's inputs: the name (CheckSecretName) and
// a non-empty sealed value (a sealed value always carries at least its
// nonce and tag). Errors wrap ErrInvalid.
func CheckSecret(name string, sealed []byte) error {
	if err := CheckSecretName(name); err != nil {
		return err
	}
	if len(sealed) == 0 {
		return fmt.Errorf("secret %q: empty sealed value: %w", name, ErrInvalid)
	}
	return nil
}
