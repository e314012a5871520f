package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// StreamEvent is one Server-Sent Event of a session stream (GET
// …/sessions/{session}/stream): ID is its position ("<seq>" or
// "<seq>.<j>", the Last-Event-ID to resume after it), Event its name (a
// frame kind such as "turn.started", "chunk", "turn.committed", or
// "stream.reset"), Data its JSON object.
type StreamEvent struct {
	ID    string          `json:"id"`
	Event string          `json:"event"`
	Data  json.RawMessage `json:"data"`
}

// Stream event names (host/stream).
const (
	StreamChunk         = "chunk"
	StreamReset         = "stream.reset"
	StreamTurnStarted   = "turn.started"
	StreamTurnRetrying  = "turn.retrying"
	StreamTurnFailed    = "turn.failed"
	StreamTurnCommitted = "turn.committed"
	StreamWaitOpened    = "wait.opened"
	StreamWaitResolved  = "wait.resolved"
)

// maxStreamLine bounds one line of the stream (a frame's data).
const maxStreamLine = 32 << 20

// EventStream reads a session stream's events. It is not safe for
// concurrent use; Close it when done.
type EventStream struct {
	body   io.ReadCloser
	r      *bufio.Reader
	retry  time.Duration
	lastID string
}

// Stream opens a session's stream (GET …/sessions/{session}/stream)
// after lastEventID ("" for the oldest kept frame, "head" for after the
// last frame: only what is written from now on). An error answer (404,
// 410 session_destroyed, 400 for a malformed id) is an *Error; a stream
// that opened returns its events through Next until ctx ends or the
// connection drops. The Client's http.Client must have no Timeout (it
// would cut the stream); use ctx instead.
func (c *Client) Stream(ctx context.Context, agent, session, lastEventID string) (*EventStream, error) {
	path := sessionPath(agent, session) + "/stream"
	req, err := http.NewRequestWithContext(ctx, "GET", c.url(path), nil)
	if err != nil {
		return nil, fmt.Errorf("paddock api GET %s: %w", path, err)
	}
	req.Header.Set("Accept", "text/event-stream")
	if lastEventID != "" {
		req.Header.Set("Last-Event-ID", lastEventID)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if c.userAgent != "" {
		req.Header.Set("User-Agent", c.userAgent)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("paddock api GET %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return nil, decodeError(resp.StatusCode, resp.Header, data)
	}
	return &EventStream{body: resp.Body, r: bufio.NewReaderSize(resp.Body, 64<<10)}, nil
}

// LastEventID is the id to resume after (Last-Event-ID of the next
// connection): the last event's, or where the server said the stream
// started before any event came.
func (s *EventStream) LastEventID() string { return s.lastID }

// Retry is the reconnection delay the server suggested ("retry:"), 0
// until it sent one.
func (s *EventStream) Retry() time.Duration { return s.retry }

// Close closes the stream's connection.
func (s *EventStream) Close() error { return s.body.Close() }

// Next returns the next event, skipping comments (heartbeats). It returns
// io.EOF when the server ended the stream, or the connection's error
// (io.ErrUnexpectedEOF for a stream cut inside an event).
func (s *EventStream) Next() (StreamEvent, error) {
	var ev StreamEvent
	var data []byte
	seen, hasID := false, false
	for {
		line, err := s.line()
		if err != nil {
			if err == io.EOF && seen {
				return ev, io.ErrUnexpectedEOF
			}
			return ev, err
		}
		if len(line) == 0 {
			if hasID {
				s.lastID = ev.ID // an id counts even without data
			}
			if data != nil {
				ev.Data = data
				if ev.Event == "" {
					ev.Event = "message"
				}
				return ev, nil
			}
			ev, seen, hasID = StreamEvent{}, false, false
			continue
		}
		if line[0] == ':' {
			continue // a comment: the heartbeat
		}
		seen = true
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "id":
			ev.ID, hasID = string(value), true
		case "event":
			ev.Event = string(value)
		case "data":
			if data != nil {
				data = append(data, '\n')
			} else {
				data = []byte{}
			}
			data = append(data, value...)
		case "retry":
			if ms, err := strconv.Atoi(string(value)); err == nil && ms >= 0 {
				s.retry = time.Duration(ms) * time.Millisecond
			}
		}
	}
}

// line reads one line without its "\n" or "\r\n".
func (s *EventStream) line() ([]byte, error) {
	var out []byte
	for {
		chunk, err := s.r.ReadSlice('\n')
		if len(out)+len(chunk) > maxStreamLine {
			return nil, errors.New("paddock api: a stream line exceeds 32 MiB")
		}
		out = append(out, chunk...)
		switch {
		case err == nil:
			out = bytes.TrimSuffix(out[:len(out)-1], []byte("\r"))
			return out, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err == io.EOF && len(out) > 0:
			return nil, io.ErrUnexpectedEOF
		default:
			return nil, err
		}
	}
}
