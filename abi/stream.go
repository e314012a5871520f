package abi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Streaming output and waits (docs/DESIGN.md "The session stream",
// "Waits and approvals"; abi/README.md "Emit" and "Waits").

// Chunk types of an emitted chunk.
const (
	// ChunkText is a text delta of the turn's answer (a streamed model
	// call forwards its deltas as text chunks by itself).
	ChunkText = "text"
	// ChunkTool is tool-call progress: Data is a JSON value the agent
	// chooses (e.g. {"tool":"search","status":"running"}).
	ChunkTool = "tool"
	// ChunkJSON is any small JSON value the agent chooses.
	ChunkJSON = "json"
)

// Limits of streamed output.
const (
	// MaxChunkBytes bounds one chunk's Text plus Data, in bytes.
	MaxChunkBytes = 64 << 10
)

// Chunk is one piece of output a running turn emits before it commits.
// It is sent as the host call kind "emit" (CallRequest.Emit) over every
// worker kind's host-call channel; the host stamps it with the turn's
// event, epoch, attempt and an offset and adds it to the session stream.
// Emitting is not journaled and never fails the turn: a refused chunk
// (too large, invalid) returns a CallError the agent may ignore.
type Chunk struct {
	// Type is text, tool or json.
	Type string `json:"type"`
	// Text is the text of a text chunk (valid UTF-8, no NUL).
	Text string `json:"text,omitempty"`
	// Data is the JSON value of a tool or json chunk.
	Data json.RawMessage `json:"data,omitempty"`
	// CallSeq is set by the host on the text chunks it forwards from a
	// streamed model call: that call's seq in the journal. Agents leave
	// it 0.
	CallSeq int `json:"call_seq,omitempty"`
}

// Validate checks a chunk's type, size and text; the error names the field.
func (c *Chunk) Validate() error {
	if c == nil {
		return errors.New("emit is null")
	}
	switch c.Type {
	case ChunkText:
		if len(c.Data) != 0 {
			return errors.New(`emit.type "text" takes "text", not "data"`)
		}
	case ChunkTool, ChunkJSON:
		if c.Text != "" {
			return fmt.Errorf("emit.type %q takes \"data\", not \"text\"", c.Type)
		}
		if !json.Valid(c.Data) {
			return fmt.Errorf("emit.data of a %q chunk must be a JSON value", c.Type)
		}
	default:
		return fmt.Errorf("emit.type %q: want text, tool or json", c.Type)
	}
	if c.CallSeq < 0 {
		return fmt.Errorf("emit.call_seq %d is negative", c.CallSeq)
	}
	if n := len(c.Text) + len(c.Data); n > MaxChunkBytes {
		return fmt.Errorf("emit is %d bytes, limit %d", n, MaxChunkBytes)
	}
	if err := ValidText(c.Text); err != nil {
		return fmt.Errorf("emit.text %v", err)
	}
	return nil
}

// Emit sends a text delta of the running turn's answer to the session
// stream (host call kind "emit"). An error is a *CallError; a turn may
// ignore it (streaming is best effort until the turn commits).
func Emit(ctx context.Context, text string) error {
	return EmitChunk(ctx, &Chunk{Type: ChunkText, Text: text})
}

// EmitJSON sends v, encoded as JSON, as a chunk of type typ (ChunkTool or
// ChunkJSON) to the session stream.
func EmitJSON(ctx context.Context, typ string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("emit: encode %s chunk: %w", typ, err)
	}
	return EmitChunk(ctx, &Chunk{Type: typ, Data: b})
}

// EmitChunk sends one chunk to the session stream through ctx's Caller.
func EmitChunk(ctx context.Context, c *Chunk) error {
	res := Call(ctx, &CallRequest{Kind: CallKindEmit, Emit: c})
	if res.Error != nil {
		return res.Error
	}
	return nil
}

// Event kinds of waits (TurnRequest.Event.Kind).
const (
	// EventWaitResolved: a wait the session opened was resolved; Event.Wait
	// holds its id and the resolver's payload.
	EventWaitResolved = "wait.resolved"
	// EventWaitExpired: a wait's timeout passed before anyone resolved it.
	EventWaitExpired = "wait.expired"
)

// WaitEvent is set on wait.resolved and wait.expired events.
type WaitEvent struct {
	// ID is the wait's id.
	ID string `json:"id"`
	// For is what the wait was for, as the agent said.
	For string `json:"for,omitempty"`
	// Data is the resolver's payload (wait.resolved only).
	Data json.RawMessage `json:"data,omitempty"`
}

// WaitSpec is what a turn with outcome "wait" waits for. The turn commits
// (messages, state, alarms); the session then sleeps until the wait is
// resolved (a wait.resolved event) or its timeout passes (wait.expired).
type WaitSpec struct {
	// ID names the wait within the session: 1–100 bytes of letters,
	// digits and . _ : -. Empty: the host names it "w<event id>". An id
	// the session used before is refused (the commit fails).
	ID string `json:"id,omitempty"`
	// For says what is awaited, shown to whoever resolves it (≤ 1,000 bytes).
	For string `json:"for,omitempty"`
	// Data is a JSON value shown with the wait (≤ 64 KiB).
	Data json.RawMessage `json:"data,omitempty"`
	// TimeoutMs, when > 0, expires the wait after that many milliseconds
	// (durably: a wait.expired event); at most MaxAlarmDelayMs.
	TimeoutMs int64 `json:"timeout_ms,omitempty"`
}

var waitIDPattern = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,100}$`)

// ValidWaitID reports whether id is a valid wait id (see WaitSpec.ID): the
// pattern, and not only dots ("." and ".." are path segments a URL
// resolves away, so such a wait could never be answered by its URL).
func ValidWaitID(id string) bool {
	return waitIDPattern.MatchString(id) && strings.Trim(id, ".") != ""
}

// Validate checks a wait spec; the error names the field.
func (w *WaitSpec) Validate() error {
	if w.ID != "" && !ValidWaitID(w.ID) {
		return fmt.Errorf("wait.id %q: want 1–100 letters, digits, '.', '_', ':' or '-', not only dots", w.ID)
	}
	if len(w.For) > 1000 {
		return fmt.Errorf("wait.for is %d bytes, limit 1000", len(w.For))
	}
	if err := ValidText(w.For); err != nil {
		return fmt.Errorf("wait.for %v", err)
	}
	if len(w.Data) > 64<<10 {
		return fmt.Errorf("wait.data is %d bytes, limit 65536", len(w.Data))
	}
	if len(w.Data) != 0 && !json.Valid(w.Data) {
		return errors.New("wait.data is not a JSON value")
	}
	if w.TimeoutMs < 0 || w.TimeoutMs > MaxAlarmDelayMs {
		return fmt.Errorf("wait.timeout_ms %d: want 0 (none) to %d", w.TimeoutMs, int64(MaxAlarmDelayMs))
	}
	return nil
}
