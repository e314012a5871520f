package main

import (
	"context"
	"fmt"
	"time"

	apiclient "github.com/paddock-dev/paddock/host/api/client"
	"github.com/paddock-dev/paddock/store"
)

// EventEndedError is the error of `signal send --wait` when the event
// ended without a committed turn: dead-lettered, cancelled or discarded.
type EventEndedError struct {
	EventID int64
	Status  store.EventStatus
	// LastError is the error of the event's last failed attempt, if any.
	LastError string
	// SessionDestroyed is whether the session was destroyed (which
	// discards its open events); DestroyedAt is when, if known.
	SessionDestroyed bool
	DestroyedAt      *time.Time
}

func (e *EventEndedError) Error() string {
	msg := fmt.Sprintf("event %d ended %s", e.EventID, e.Status)
	if e.SessionDestroyed {
		msg += ": the session was destroyed"
		if e.DestroyedAt != nil {
			msg += " at " + e.DestroyedAt.Local().Format(time.DateTime)
		}
		if e.LastError != "" {
			msg += "; last error: " + oneLine(e.LastError, 300)
		}
		return msg
	}
	switch {
	case e.LastError != "":
		return msg + ": " + oneLine(e.LastError, 300)
	case e.Status == store.EventCancelled:
		return msg + ": cancelled by a cancel signal before its turn committed"
	}
	return msg + " (no error recorded; see `paddock event show`)"
}

// eventEnded returns the EventEndedError for ev, an event of the session
// closed without a committed turn, looking up whether the session was
// destroyed.
func eventEnded(ctx context.Context, api *apiclient.Client, agentName, sess string, ev apiclient.Event) error {
	e := &EventEndedError{EventID: ev.ID, Status: ev.Status, LastError: ev.LastError}
	s, err := api.GetSession(ctx, agentName, sess)
	switch {
	case err == nil:
		e.SessionDestroyed, e.DestroyedAt = s.Status == store.SessionDestroyed, s.DestroyTS
	case apiclient.IsCode(err, apiclient.CodeSessionDestroyed):
		e.SessionDestroyed = true
	default:
		return fmt.Errorf("%w (and the session could not be read: %w)", e, err)
	}
	return e
}
