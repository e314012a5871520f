package store

import (
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
	// StartedAt is when the host began the call; DurationMS how long it
	// took, in milliseconds.
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

// RecordHostCallParams are RecordHostCall's inputs.
type RecordHostCallParams struct {
	// Ref is the attempt's turn_ref; the row is written only if it passes
	// the same fences as a commit (the delivery current, the activation
	// live at that epoch with an unexpired lease by the database's clock,
	// the event open) — else *FenceError and nothing is written.
	Ref abi.TurnRef
	// Call is the row (ID, EventID, ActorEpoch, Replays, SetAside and
	// CreatedAt are set by the store from Ref).
	Call HostCall
	// SetAsideFrom > 0 first marks the event's rows with Seq ≥ it set aside
	// (the attempt diverged there), in the same transaction.
	SetAsideFrom int
}

// Secret is a secret's metadata; its value never leaves the store
// unencrypted and never leaves the host (docs/DESIGN.md invariant 13).
type Secret struct {
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}
