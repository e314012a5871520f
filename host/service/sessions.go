package service

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// SessionParams create a session (the fields follow Rivet's actor API).
type SessionParams struct {
	// Key is the optional client-chosen key, unique per agent: 1–200
	// printable ASCII characters without spaces. GetOrCreateSession needs
	// one.
	Key string
	// Input is handed to the session's first turn; at most
	// abi.MaxStateBytes bytes.
	Input []byte
	// CrashPolicy is restart, sleep or destroy; empty means the agent's
	// (the config's override for the agent, else the agent's stored one).
	CrashPolicy string
}

// CreateSession creates a session of agent a (as GetAgent returned it).
// Refusals: *InvalidError (key, input, crash_policy); a *ConflictError
// ConflictSessionExists (field "key") when the key is taken.
func (s *Service) CreateSession(ctx context.Context, a store.Agent, p SessionParams) (store.Session, error) {
	x, _, err := s.putSession(ctx, a, p, false)
	return x, err
}

// GetOrCreateSession returns agent a's session with key p.Key, creating it
// (created true) when there is none. Refusals as CreateSession, and a
// missing key.
func (s *Service) GetOrCreateSession(ctx context.Context, a store.Agent, p SessionParams) (x store.Session, created bool, err error) {
	return s.putSession(ctx, a, p, true)
}

func (s *Service) putSession(ctx context.Context, a store.Agent, p SessionParams, getOrCreate bool) (store.Session, bool, error) {
	if p.Key != "" && !keyRE.MatchString(p.Key) {
		return store.Session{}, false, invalid("key", "key must be 1–200 printable ASCII characters without spaces")
	}
	if getOrCreate && p.Key == "" {
		return store.Session{}, false, missing("key", "get-or-create needs a key")
	}
	if len(p.Input) > abi.MaxStateBytes {
		return store.Session{}, false, invalid("input", "input is %d bytes, limit %d", len(p.Input), abi.MaxStateBytes)
	}
	def := a.CrashPolicy
	if ap, ok := s.h.Policy().Agents[a.Name]; ok {
		def = ap.CrashPolicy // the config's override for this agent
	}
	// The policy asked for is passed as given ("" when none), so that a
	// get-or-create compares only a policy the caller named with the
	// existing session's; def applies to a new session.
	if _, err := policy(p.CrashPolicy, def); err != nil {
		return store.Session{}, false, err
	}
	x, created, err := s.st.CreateSession(ctx, store.CreateSessionParams{
		AgentUID: a.UID, SessionID: uuid.NewString(), Key: p.Key, Input: p.Input,
		CrashPolicy: store.CrashPolicy(p.CrashPolicy), DefaultCrashPolicy: def, GetOrCreate: getOrCreate,
	})
	if se, ok := errors.AsType[*store.SessionExistsError](err); ok {
		msg := fmt.Sprintf("agent %q already has session %s with key %q",
			a.Name, se.Existing.SessionID, p.Key)
		if se.Field != "key" {
			msg = fmt.Sprintf("agent %q's session %s with key %q has a different %s (get-or-create with the same %s, or none)",
				a.Name, se.Existing.SessionID, p.Key, se.Field, se.Field)
		}
		return x, false, &ConflictError{Reason: ConflictSessionExists, Field: se.Field, Message: msg}
	}
	if errors.Is(err, store.ErrConflict) {
		return x, false, &ConflictError{Reason: ConflictSessionExists, Field: "key",
			Message: fmt.Sprintf("agent %q already has a session with key %q", a.Name, p.Key)}
	}
	return x, created, wrap("create session", err)
}

// GetSession returns agent a's session id with its counters, or a
// *NotFoundError for field "session".
func (s *Service) GetSession(ctx context.Context, a store.Agent, id string) (store.Session, error) {
	x, err := s.st.GetSession(ctx, store.ActorKey{AgentUID: a.UID, SessionID: id})
	if errors.Is(err, store.ErrNotFound) {
		return x, notFoundSession(a, id)
	}
	return x, wrap("get session", err)
}

func notFoundSession(a store.Agent, id string) error {
	return &NotFoundError{Resource: ResourceSession, Field: "session", Message: fmt.Sprintf("agent %q has no session %q", a.Name, id)}
}

// ListSessions pages agent a's sessions by session id: after cursor (the
// last session id of the previous page, "" to start), at most limit (0:
// DefaultSessionLimit; at most MaxSessionLimit, else an *InvalidError for
// "limit"). next is the cursor of the next page, "" after the last.
func (s *Service) ListSessions(ctx context.Context, a store.Agent, cursor string, limit int) (xs []store.Session, next string, err error) {
	n, err := pageSize(limit, DefaultSessionLimit, MaxSessionLimit)
	if err != nil {
		return nil, "", err
	}
	xs, err = s.st.ListSessions(ctx, store.ListSessionsParams{AgentUID: a.UID, After: cursor, Limit: n})
	if err != nil {
		return nil, "", wrap("list sessions", err)
	}
	if len(xs) == n {
		next = xs[len(xs)-1].SessionID
	}
	return xs, next, nil
}

// DestroySession destroys session x (idempotent; as GetSession returned
// it): status destroyed, open events discarded, alarms deleted; a running
// controller notices and aborts its turn. It returns the session as it is
// now.
func (s *Service) DestroySession(ctx context.Context, x store.Session) (store.Session, error) {
	x, err := s.st.DestroySession(ctx, x.ActorKey)
	if err != nil {
		return x, wrap("destroy session", err)
	}
	s.h.Ensure(x.ActorKey) // a running controller notices and aborts
	s.poke(x.ActorKey)     // a turn in flight's turn.failed (destroyed)
	return x, nil
}
