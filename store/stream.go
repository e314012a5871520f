package store

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/paddock-dev/paddock/abi"
)

// The session stream (docs/DESIGN.md "The session stream"): an append-only
// log of frames per session, numbered 1, 2, 3… without gaps by Seq. A
// frame is written in the transaction that makes it true (turn.started by
// NextDelivery, turn.committed by CommitTurn, turn.retrying / turn.failed
// by FailAttempt, ExpireActivation and CancelEvent, wait.* by the wait
// writes) or, for chunks, by AppendChunks under the attempt's fences, so
// a frame is stored iff what it says happened, and a stale attempt's
// chunks are refused. Seq is taken from the session's counter under that
// counter row's lock, so frames become visible in Seq order: a reader that
// has seen Seq n has seen every frame ≤ n.

// Frame kinds.
const (
	FrameTurnStarted   = "turn.started"
	FrameChunk         = "chunk"
	FrameTurnRetrying  = "turn.retrying"
	FrameTurnCommitted = "turn.committed"
	FrameTurnFailed    = "turn.failed"
	FrameWaitOpened    = "wait.opened"
	FrameWaitResolved  = "wait.resolved"
)

// Frame is one stored frame of a session stream.
type Frame struct {
	ActorKey
	// Seq numbers the session's frames from 1, without gaps.
	Seq  int64  `json:"seq"`
	Kind string `json:"kind"`
	// EventID, ActorEpoch and Attempt name the turn the frame belongs to
	// (0 for wait frames written outside a turn).
	EventID    int64 `json:"event_id,omitempty"`
	ActorEpoch int64 `json:"actor_epoch,omitempty"`
	Attempt    int   `json:"attempt,omitempty"`
	// Body is the kind's JSON object (see the *Body types).
	Body      json.RawMessage `json:"body"`
	CreatedAt time.Time       `json:"created_at"`
}

// TurnStartedBody is a turn.started frame's body.
type TurnStartedBody struct {
	// EventKind is the kind of the event the turn handles.
	EventKind string `json:"event_kind"`
}

// ChunkBody is a chunk frame's body: a batch of chunks of one attempt,
// with offsets Offset, Offset+1, … (an attempt's offsets start at 0).
type ChunkBody struct {
	Offset int         `json:"offset"`
	Chunks []abi.Chunk `json:"chunks"`
}

// AttemptEndedBody is the body of turn.retrying and turn.failed.
type AttemptEndedBody struct {
	// Reason: error (the attempt failed), lease_expired (its host went
	// away), approval (it waits for an approval), steer (a steer reruns
	// the turn in the same attempt: RestartStream), dead_letter,
	// destroyed, cancelled.
	Reason string `json:"reason"`
	Error  string `json:"error,omitempty"`
	// NextAttemptAt is when the retry is due (turn.retrying, except
	// approval and steer).
	NextAttemptAt *time.Time `json:"next_attempt_at,omitempty"`
}

// Reasons of AttemptEndedBody.
const (
	EndReasonError        = "error"
	EndReasonLeaseExpired = "lease_expired"
	EndReasonApproval     = "approval"
	EndReasonSteer        = "steer"
	EndReasonDeadLetter   = "dead_letter"
	EndReasonDestroyed    = "destroyed"
	EndReasonCancelled    = "cancelled"
)

// TurnCommittedBody is a turn.committed frame's body.
type TurnCommittedBody struct {
	TurnNo   int64               `json:"turn_no"`
	Outcome  abi.Outcome         `json:"outcome"`
	Messages []TranscriptMessage `json:"messages"`
	Usage    abi.Usage           `json:"usage"`
}

// AttemptEndedFrame decides which frame a failed attempt writes — the one
// rule both drivers use in FailAttempt and ExpireActivation: turn.failed
// when the event was dead-lettered or the session destroyed, else
// turn.retrying with the retry's due time. reason is EndReasonError or
// EndReasonLeaseExpired.
func AttemptEndedFrame(reason, errText string, r FailResult) (kind string, body AttemptEndedBody) {
	switch {
	case r.DeadLettered:
		return FrameTurnFailed, AttemptEndedBody{Reason: EndReasonDeadLetter, Error: errText}
	case r.SessionStatus == SessionDestroyed:
		return FrameTurnFailed, AttemptEndedBody{Reason: EndReasonDestroyed, Error: errText}
	}
	at := r.NextAttemptAt
	return FrameTurnRetrying, AttemptEndedBody{Reason: reason, Error: errText, NextAttemptAt: &at}
}

// MustBody encodes a frame body (the *Body types cannot fail to encode).
func MustBody(v any) json.RawMessage {
	b, err := abi.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("store: encode frame body: %v", err))
	}
	return b
}

// Limits of AppendChunks.
const (
	// MaxChunksPerFrame bounds the chunks of one AppendChunks call.
	MaxChunksPerFrame = 4096
	// MaxChunkFrameBytes bounds the encoded body of one chunk frame.
	MaxChunkFrameBytes = 1 << 20
)

// AppendChunksParams are AppendChunks' inputs.
type AppendChunksParams struct {
	// Ref is the attempt's turn_ref; the frame is written only if it passes
	// the same fences as RecordHostCall, else *FenceError.
	Ref     abi.TurnRef
	Attempt int
	// Offset is the first chunk's offset within the attempt.
	Offset int
	Chunks []abi.Chunk
}

// CheckChunks validates AppendChunks' inputs before any database access
// and returns the frame body to store (ErrInvalid names what is wrong).
func CheckChunks(p AppendChunksParams) (json.RawMessage, error) {
	switch {
	case len(p.Chunks) == 0 || len(p.Chunks) > MaxChunksPerFrame:
		return nil, fmt.Errorf("%d chunks, want 1–%d: %w", len(p.Chunks), MaxChunksPerFrame, ErrInvalid)
	case p.Offset < 0 || p.Attempt < 1:
		return nil, fmt.Errorf("chunk offset %d, attempt %d: %w", p.Offset, p.Attempt, ErrInvalid)
	}
	for i := range p.Chunks {
		if err := p.Chunks[i].Validate(); err != nil {
			return nil, fmt.Errorf("chunk %d: %v: %w", p.Offset+i, err, ErrInvalid)
		}
	}
	body := MustBody(ChunkBody{Offset: p.Offset, Chunks: p.Chunks})
	if len(body) > MaxChunkFrameBytes {
		return nil, fmt.Errorf("chunk frame is %d bytes, limit %d: %w", len(body), MaxChunkFrameBytes, ErrInvalid)
	}
	return body, nil
}

// RestartStreamParams are RestartStream's inputs.
type RestartStreamParams struct {
	// Ref is the attempt's newest turn_ref (after the steer); the frames
	// are written only if it passes the same fences as AppendChunks, else
	// *FenceError.
	Ref     abi.TurnRef
	Attempt int
	// Reason is the turn.retrying frame's reason (EndReasonSteer).
	Reason string
}

// CheckRestart validates RestartStreamParams (ErrInvalid) and returns the
// body of the turn.retrying frame RestartStream writes.
func CheckRestart(p RestartStreamParams) (json.RawMessage, error) {
	switch {
	case p.Attempt < 1:
		return nil, fmt.Errorf("attempt %d, want ≥ 1: %w", p.Attempt, ErrInvalid)
	case p.Reason == "":
		return nil, fmt.Errorf("restart without a reason: %w", ErrInvalid)
	}
	return MustBody(AttemptEndedBody{Reason: p.Reason}), nil
}

// StreamFramesParams page a session's stream.
type StreamFramesParams struct {
	Key ActorKey
	// After is the last Seq already seen (0 = from the oldest kept).
	After int64
	Limit int
}

// StreamPage is a page of a session's stream.
type StreamPage struct {
	// Frames have Seq > After, by Seq, at most Limit.
	Frames []Frame
	// Head is the session's last Seq (0 when it has no frame yet).
	Head int64
	// Oldest is the smallest Seq still kept (Head+1 when none is): a
	// reader at After < Oldest-1 missed frames that were compacted away.
	Oldest int64
}

// CompactStreamParams are CompactStream's inputs.
type CompactStreamParams struct {
	// Before: frames created before it are deleted, except those of an
	// event still open (its turn may yet retry or commit).
	Before time.Time
	Limit  int
}
