package service

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/paddock-dev/paddock/store"
)

// ParseEventStatus checks an event status filter: "" (every status), open,
// done, cancelled, dead_letter or discarded; else an *InvalidError for
// "status".
func ParseEventStatus(status string) (store.EventStatus, error) {
	switch st := store.EventStatus(status); st {
	case "", store.EventOpen, store.EventDone, store.EventCancelled, store.EventDeadLetter, store.EventDiscarded:
		return st, nil
	}
	return "", invalid("status", "status %q must be open, done, cancelled, dead_letter or discarded", status)
}

// ListEvents pages session x's events (as GetSession returned it) by event
// id, of one status or ("") all. Refusals: *InvalidError (status, limit,
// after).
func (s *Service) ListEvents(ctx context.Context, x store.Session, status string, p Page) ([]store.Event, error) {
	st, err := ParseEventStatus(status)
	if err != nil {
		return nil, err
	}
	if p, err = p.check(); err != nil {
		return nil, err
	}
	es, err := s.st.ListEvents(ctx, store.ListEventsParams{Key: x.ActorKey, Status: st, After: p.After, Limit: p.Limit})
	return es, wrap("list events", err)
}

// GetEvent returns event id of session x with its error chain (oldest
// first). Refusals: an *InvalidError (event) for an id below 1, a
// *NotFoundError (event) for an event the session does not have.
func (s *Service) GetEvent(ctx context.Context, x store.Session, id int64) (store.Event, []store.AttemptError, error) {
	e, err := s.event(ctx, x, id)
	if err != nil {
		return e, nil, err
	}
	chain, err := s.st.EventErrors(ctx, x.ActorKey, e.ID)
	return e, chain, wrap("event errors", err)
}

func (s *Service) event(ctx context.Context, x store.Session, id int64) (store.Event, error) {
	if id < 1 {
		return store.Event{}, invalid("event", "event %d must be a positive event id", id)
	}
	es, err := s.st.ListEvents(ctx, store.ListEventsParams{Key: x.ActorKey, After: id - 1, Limit: 1})
	if err != nil {
		return store.Event{}, wrap("get event", err)
	}
	if len(es) == 0 || es[0].ID != id {
		return store.Event{}, &NotFoundError{Resource: ResourceEvent, Field: "event",
			Message: fmt.Sprintf("session %q has no event %d", x.SessionID, id)}
	}
	return es[0], nil
}

// RedriveEvent re-opens the dead-lettered event id of session x for a new
// attempt under a new epoch and wakes the runtime. It returns the event as
// it is now. Refusals: as GetEvent, and a *ConflictError
// ConflictNotDeadLetter (field "event") naming the event's status.
func (s *Service) RedriveEvent(ctx context.Context, x store.Session, id int64) (store.Event, error) {
	return s.deadLetterOp(ctx, x, id, true)
}

// DiscardEvent closes the dead-lettered event id of session x as
// discarded. Refusals as RedriveEvent.
func (s *Service) DiscardEvent(ctx context.Context, x store.Session, id int64) (store.Event, error) {
	return s.deadLetterOp(ctx, x, id, false)
}

func (s *Service) deadLetterOp(ctx context.Context, x store.Session, id int64, redrive bool) (store.Event, error) {
	e, err := s.event(ctx, x, id)
	if err != nil {
		return e, err
	}
	if redrive {
		e, err = s.st.RedriveEvent(ctx, x.ActorKey, e.ID)
	} else {
		e, err = s.st.DiscardEvent(ctx, x.ActorKey, e.ID)
	}
	// The store's conflict names the event's current status (e, the
	// store's answer, is zero on error).
	var ndl *store.NotDeadLetterError
	if errors.As(err, &ndl) {
		return e, &ConflictError{Reason: ConflictNotDeadLetter, Field: "event",
			Message: fmt.Sprintf("event %d is %s, not dead_letter", ndl.EventID, ndl.Status)}
	}
	if err != nil {
		return e, wrap("dead letter", err)
	}
	if redrive {
		s.h.Ensure(x.ActorKey)
	}
	return e, nil
}

// ListDeadLetters pages the dead-lettered events of agent a (as GetAgent
// returned it) by event id, of one session when sessionID is set, each
// with its error chain. Refusals: *InvalidError (limit, after).
func (s *Service) ListDeadLetters(ctx context.Context, a store.Agent, sessionID string, p Page) ([]store.DeadLetter, error) {
	p, err := p.check()
	if err != nil {
		return nil, err
	}
	dls, err := s.st.ListDeadLetters(ctx, store.ListDeadLettersParams{AgentUID: a.UID, SessionID: sessionID, After: p.After, Limit: p.Limit})
	return dls, wrap("list dead letters", err)
}

// ListAlarms returns session x's alarms by name (never nil).
func (s *Service) ListAlarms(ctx context.Context, x store.Session) ([]store.Alarm, error) {
	as, err := s.st.ListAlarms(ctx, x.ActorKey)
	if as == nil {
		as = []store.Alarm{}
	}
	return as, wrap("list alarms", err)
}

// MaxTranscriptWait bounds a transcript long-poll.
const MaxTranscriptWait = time.Minute

// Transcript pages session x's committed turns after turn number p.After.
// With wait > 0 (at most MaxTranscriptWait) it long-polls until a turn
// past p.After commits or wait passes: it wakes on a commit on this host
// and polls the store every second (another host may commit). next is the
// last turn number returned (p.After when none); turns is never nil.
// A destroyed session commits no more turns, so a wait for one ends at
// once (when x is destroyed, or when a poll finds it destroyed meanwhile)
// with store.ErrSessionDestroyed (wrapped), as the session stream does;
// its turns are still paged without wait.
// Refusals: *InvalidError (limit, after, wait); the context's error when
// ctx ends while waiting.
func (s *Service) Transcript(ctx context.Context, x store.Session, p Page, wait time.Duration) (turns []store.Turn, next int64, err error) {
	if p, err = p.check(); err != nil {
		return nil, 0, err
	}
	if wait < 0 || wait > MaxTranscriptWait {
		return nil, 0, invalid("wait", "wait=%s must be a duration between 0s and 60s", wait)
	}
	deadline := time.Now().Add(wait)
	for {
		committed := s.h.CommitSignal()
		turns, err := s.st.Transcript(ctx, store.TranscriptParams{Key: x.ActorKey, AfterTurn: p.After, Limit: p.Limit})
		if err != nil {
			return nil, 0, wrap("transcript", err)
		}
		left := time.Until(deadline)
		if len(turns) == 0 && wait > 0 && x.Status == store.SessionDestroyed {
			return nil, 0, fmt.Errorf("wait for the transcript of session %s: %w", x.SessionID, store.ErrSessionDestroyed)
		}
		if len(turns) > 0 || left <= 0 {
			next := p.After
			if len(turns) > 0 {
				next = turns[len(turns)-1].TurnNo
			}
			if turns == nil {
				turns = []store.Turn{}
			}
			return turns, next, nil
		}
		// Wake on a local commit, or poll (another host may commit).
		select {
		case <-committed:
		case <-time.After(min(left, time.Second)):
		case <-ctx.Done():
			return nil, 0, fmt.Errorf("transcript wait: %w", ctx.Err())
		}
		// Destroyed meanwhile (here or on another host)?
		if now, err := s.st.GetSession(ctx, x.ActorKey); err == nil {
			x = now
		}
	}
}
