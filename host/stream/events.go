package stream

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// Event names of the stream besides the frame kinds (store.Frame*).
const (
	// EventChunk is one chunk of a chunk frame (store.FrameChunk).
	EventChunk = store.FrameChunk
	// EventReset tells a client that resumed from a position older than
	// the oldest kept frame that it missed frames for good: it reloads the
	// transcript; the stream continues from the oldest kept frame. Data:
	// {"oldest": n}.
	EventReset = "stream.reset"
)

// Event is one event of a session stream as a client receives it (one
// SSE event): ID is its Cursor's String, Name the SSE event name (a frame
// kind, EventChunk or EventReset), Data a JSON object.
//
// Data of a chunk: {"event_id","epoch","attempt","offset","type",
// "text"|"data","call_seq"?}, offset being the chunk's offset within its
// attempt. Data of any other frame: {"seq","event_id","epoch","attempt"}
// followed by the fields of the frame's body (store.TurnStartedBody,
// store.AttemptEndedBody, store.TurnCommittedBody, the wait bodies).
type Event struct {
	ID   string          `json:"id"`
	Name string          `json:"event"`
	Data json.RawMessage `json:"data"`
	// Cursor is ID parsed: the position after this event.
	Cursor Cursor `json:"-"`
}

// ChunkData is the data of a chunk event.
type ChunkData struct {
	EventID int64           `json:"event_id"`
	Epoch   int64           `json:"epoch"`
	Attempt int             `json:"attempt"`
	Offset  int             `json:"offset"`
	Type    string          `json:"type"`
	Text    string          `json:"text,omitempty"`
	Data    json.RawMessage `json:"data,omitempty"`
	CallSeq int             `json:"call_seq,omitempty"`
}

// FrameHead is the part of every non-chunk event's data the stream adds
// to the frame's body.
type FrameHead struct {
	Seq     int64 `json:"seq"`
	EventID int64 `json:"event_id"`
	Epoch   int64 `json:"epoch"`
	Attempt int   `json:"attempt"`
}

// resetEvent is the stream.reset event of a client whose position is
// older than oldest, the oldest kept frame (the stream resumes after
// oldest-1).
func resetEvent(oldest int64) Event {
	c := Cursor{Seq: max(oldest-1, 0)}
	return Event{ID: c.String(), Name: EventReset, Cursor: c,
		Data: json.RawMessage(`{"oldest":` + strconv.FormatInt(oldest, 10) + `}`)}
}

// FrameEvents returns the events of frame f a client at after has not
// seen: every event of a frame past after, the chunks past after.Chunk of
// a chunk frame after.Seq, nothing of frames before. A frame whose body
// cannot be decoded (not written by this version) is sent as one event
// with its body as it is.
func FrameEvents(f store.Frame, after Cursor) []Event {
	if f.Seq < after.Seq || (f.Seq == after.Seq && !after.InFrame) {
		return nil
	}
	if f.Kind == store.FrameChunk {
		var body store.ChunkBody
		if err := json.Unmarshal(f.Body, &body); err == nil {
			from := 0
			if f.Seq == after.Seq {
				from = after.Chunk + 1
			}
			if from >= len(body.Chunks) {
				return nil
			}
			out := make([]Event, 0, len(body.Chunks)-from)
			for j := from; j < len(body.Chunks); j++ {
				out = append(out, chunkEvent(f, body, j))
			}
			return out
		}
	}
	if f.Seq == after.Seq { // a non-chunk frame addressed by a chunk id: seen
		return nil
	}
	c := Cursor{Seq: f.Seq}
	return []Event{{ID: c.String(), Name: f.Kind, Cursor: c, Data: frameData(f)}}
}

func chunkEvent(f store.Frame, body store.ChunkBody, j int) Event {
	ch := body.Chunks[j]
	d, err := json.Marshal(ChunkData{EventID: f.EventID, Epoch: f.ActorEpoch, Attempt: f.Attempt, Offset: body.Offset + j,
		Type: ch.Type, Text: ch.Text, Data: ch.Data, CallSeq: ch.CallSeq})
	if err != nil { // a chunk's data is valid JSON (abi.Chunk.Validate)
		d = []byte(`{}`)
	}
	c := Cursor{Seq: f.Seq, Chunk: j, InFrame: true}
	return Event{ID: c.String(), Name: EventChunk, Cursor: c, Data: d}
}

// frameData is {"seq","event_id","epoch","attempt"} followed by the
// fields of f's body (a JSON object; any other body under "body"). A
// field the body has itself is not repeated from the frame (a
// wait.resolved frame written outside a turn carries its wait's event_id
// in its body).
func frameData(f store.Frame) json.RawMessage {
	body := bytes.TrimSpace(f.Body)
	var fields map[string]json.RawMessage
	if len(body) == 0 || body[0] != '{' || json.Unmarshal(body, &fields) != nil {
		head, _ := abi.Marshal(FrameHead{Seq: f.Seq, EventID: f.EventID, Epoch: f.ActorEpoch, Attempt: f.Attempt})
		if len(body) == 0 {
			return head
		}
		if !json.Valid(body) {
			body, _ = json.Marshal(string(body))
		}
		return json.RawMessage(fmt.Sprintf(`%s,"body":%s}`, head[:len(head)-1], body))
	}
	out := make([]byte, 0, len(body)+80)
	out = append(out, '{')
	for _, kv := range []struct {
		k string
		v int64
	}{{"seq", f.Seq}, {"event_id", f.EventID}, {"epoch", f.ActorEpoch}, {"attempt", int64(f.Attempt)}} {
		if _, ok := fields[kv.k]; ok {
			continue
		}
		out = append(out, '"')
		out = append(out, kv.k...)
		out = append(out, `":`...)
		out = strconv.AppendInt(out, kv.v, 10)
		out = append(out, ',')
	}
	inner := bytes.TrimSpace(body[1 : len(body)-1])
	if len(inner) == 0 {
		out[len(out)-1] = '}'
		return out
	}
	out = append(out, inner...)
	return append(out, '}')
}
