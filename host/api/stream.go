package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/host/stream"
	"github.com/paddock-dev/paddock/store"
)

// Defaults of the stream route.
const (
	// DefaultStreamHeartbeat is how often an idle stream sends a comment,
	// so that proxies and clients see the connection alive.
	DefaultStreamHeartbeat = 15 * time.Second
	// streamRetryMs is the reconnection delay the stream suggests to
	// EventSource clients (SSE "retry:").
	streamRetryMs = 2000
	// streamWriteTimeout bounds one write of the stream to the client: a
	// client that reads nothing for that long is cut.
	streamWriteTimeout = 30 * time.Second
)

// streamSession streams a session's frames as Server-Sent Events
// (docs/DESIGN.md "The session stream"): from the position of the
// Last-Event-ID header, else ?after=, else from the oldest kept frame;
// the position "head" starts after the session's last frame.
// Each event is flushed as it is written; an idle stream sends a comment
// every heartbeat. It ends when the client goes away, the hub closes
// (the host stops), or the session is destroyed.
func (s *Server) streamSession(w http.ResponseWriter, r *http.Request) error {
	a, x, err := s.session(r)
	if err != nil {
		return err
	}
	field, pos := "Last-Event-ID", r.Header.Get("Last-Event-ID")
	if pos == "" {
		field, pos = "after", r.URL.Query().Get("after")
	}
	after, err := service.ParseStreamPosition(field, pos)
	if err != nil {
		return asParam(err)
	}
	sub, err := s.svc.Stream(r.Context(), x, after)
	if errors.Is(err, store.ErrSessionDestroyed) {
		return &Error{Status: http.StatusGone, Code: "session_destroyed", Message: "the session is destroyed: its stream has ended (its transcript stays readable)"}
	}
	if err != nil {
		return err
	}
	defer sub.Close()

	rc := http.NewResponseController(w)
	// The server's read timeout would end the request (its context) while
	// the stream is open, and its write timeout would cut a long stream:
	// this route has no read deadline and a deadline per write instead.
	_ = rc.SetReadDeadline(time.Time{})
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	h.Set("Connection", "keep-alive")
	w.WriteHeader(http.StatusOK)
	var buf bytes.Buffer
	// The opening block sets the client's last event id to where the
	// stream starts (an event without data is not dispatched, but its id
	// counts): a client that started at "head" and loses the connection
	// before any event resumes from there, not from a later head.
	fmt.Fprintf(&buf, "retry: %d\nid: %s\n\n", streamRetryMs, sub.Position())
	if err := s.flushStream(w, rc, &buf); err != nil {
		return nil
	}
	heartbeat := s.o.StreamHeartbeat
	if heartbeat <= 0 {
		heartbeat = DefaultStreamHeartbeat
	}
	ctx := r.Context()
	caller, hasCaller := service.CallerFrom(ctx)
	checked := time.Now()
	for {
		// A stream outlives its request's authentication: once per
		// heartbeat its token is checked again, so a revocation ends an
		// open stream too (docs/DESIGN.md "Tokens, roles and the audit
		// log").
		if hasCaller && time.Since(checked) >= heartbeat {
			checked = time.Now()
			if err := s.svc.CheckCaller(ctx, caller); err != nil {
				var unauth *service.UnauthenticatedError
				if !errors.As(err, &unauth) {
					s.log.Warn("api: session stream ended: its token could not be checked", "session", x.SessionID, "err", err)
				}
				return nil
			}
		}
		wait, cancel := context.WithTimeout(ctx, heartbeat)
		evs, err := sub.Next(wait)
		cancel()
		switch {
		case err == nil:
		case ctx.Err() != nil, errors.Is(err, stream.ErrClosed):
			return nil // the client went away, or the host stops
		case errors.Is(err, context.DeadlineExceeded):
			// A session destroyed with no turn in flight writes no frame:
			// look at it once per heartbeat.
			if now, err := s.svc.GetSession(ctx, a, x.SessionID); err == nil && now.Status == store.SessionDestroyed {
				return nil
			}
			buf.WriteString(": heartbeat\n\n")
			if err := s.flushStream(w, rc, &buf); err != nil {
				return nil
			}
			continue
		default:
			// A store read failed: end the stream; the client resumes
			// with Last-Event-ID.
			s.log.Warn("api: session stream ended by a store error", "session", x.SessionID, "err", err)
			return nil
		}
		ended := false
		for _, e := range evs {
			writeEvent(&buf, e)
			ended = ended || destroyedFrame(e)
		}
		if err := s.flushStream(w, rc, &buf); err != nil || ended {
			return nil
		}
	}
}

// writeEvent writes one SSE event: id, event name and its JSON data on one
// line (JSON has no raw newlines).
func writeEvent(buf *bytes.Buffer, e stream.Event) {
	buf.WriteString("id: ")
	buf.WriteString(e.ID)
	buf.WriteString("\nevent: ")
	buf.WriteString(e.Name)
	buf.WriteString("\ndata: ")
	buf.Write(e.Data)
	buf.WriteString("\n\n")
}

// destroyedFrame reports whether e ends its session's stream: a turn that
// failed because the session was destroyed.
func destroyedFrame(e stream.Event) bool {
	if e.Name != store.FrameTurnFailed {
		return false
	}
	var b store.AttemptEndedBody
	return json.Unmarshal(e.Data, &b) == nil && b.Reason == store.EndReasonDestroyed
}

// flushStream writes buf to the client under a fresh write deadline and
// flushes it.
func (s *Server) flushStream(w http.ResponseWriter, rc *http.ResponseController, buf *bytes.Buffer) error {
	_ = rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
	_, err := w.Write(buf.Bytes())
	buf.Reset()
	if err != nil {
		return err
	}
	return rc.Flush()
}
