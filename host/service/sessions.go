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
	// Pool, when set, names the capacity pool the caller expects the
	// session to run in (Rivet's runner_name_selector). The pool is the
	// agent's policy, not the session's: a name that is not the agent's
	// pool is refused — a *NotFoundError (ResourcePool, Referenced) when
	// no pool of that name is configured on this host, else an
	// *InvalidError naming the agent's pool.
	Pool string
	// ExistingWins makes a get-or-create return the existing session even
	// when CrashPolicy or Input differ from it: they apply only to a new
	// session (Rivet's PUT /actors). Without it such a get-or-create is
	// refused (docs/DESIGN.md "API shape").
	ExistingWins bool
}

// MaxKeyBytes is the longest session key, in bytes (keys are printable
// ASCII without spaces).
const MaxKeyBytes = 200

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
	if err := s.checkPool(a, p.Pool); err != nil {
		return store.Session{}, false, err
	}
	def := a.CrashPolicy
	if ap, ok := s.h.Policy().Agents[store.QualifiedName(a.Namespace, a.Name)]; ok {
		def = ap.CrashPolicy // the config's override for this agent
	}
	// The policy asked for is passed as given ("" when none), so that a
	// get-or-create compares only a policy the caller named with the
	// existing session's; def applies to a new session.
	if _, err := policy(p.CrashPolicy, def); err != nil {
		return store.Session{}, false, err
	}
	if err := s.checkLiveSessions(ctx, a.Namespace); err != nil {
		// Over the quota, a get-or-create still answers with the session
		// its key already has (nothing new is created).
		if !getOrCreate {
			return store.Session{}, false, s.countQuota(err)
		}
		if _, kerr := s.SessionByKey(ctx, a, p.Key); kerr != nil {
			return store.Session{}, false, s.countQuota(err)
		}
	}
	x, created, err := s.st.CreateSession(ctx, store.CreateSessionParams{
		AgentUID: a.UID, SessionID: uuid.NewString(), Key: p.Key, Input: p.Input,
		CrashPolicy: store.CrashPolicy(p.CrashPolicy), DefaultCrashPolicy: def, GetOrCreate: getOrCreate,
	})
	if se, ok := errors.AsType[*store.SessionExistsError](err); ok && getOrCreate && p.ExistingWins && se.Field != "key" {
		// Only the policy or input differs: the existing session wins.
		x, err := s.GetSession(ctx, a, se.Existing.SessionID)
		return x, false, err
	}
	if se, ok := errors.AsType[*store.SessionExistsError](err); ok {
		msg := fmt.Sprintf("agent %q already has session %s with key %q",
			a.Name, se.Existing.SessionID, p.Key)
		if se.Field != "key" {
			msg = fmt.Sprintf("agent %q's session %s with key %q has a different %s (get-or-create with the same %s, or none)",
				a.Name, se.Existing.SessionID, p.Key, se.Field, se.Field)
		}
		return x, false, &ConflictError{Reason: ConflictSessionExists, Field: se.Field, Message: msg, Existing: se.Existing.SessionID}
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

// checkPool refuses a pool that is not agent a's (SessionParams.Pool).
func (s *Service) checkPool(a store.Agent, pool string) error {
	if pool == "" {
		return nil
	}
	pol := s.h.Policy()
	want := pol.ForAgent(a).Pool
	if pool == want {
		return nil
	}
	if _, ok := pol.Pools[pool]; !ok {
		return &NotFoundError{Resource: ResourcePool, Field: "pool", Referenced: true,
			Message: fmt.Sprintf("no pool %q is configured on this host (agent %q runs in pool %q)", pool, a.Name, want)}
	}
	return invalid("pool", "agent %q runs in pool %q, not %q: the pool is the agent's policy (config agents.%s.pool)", a.Name, want, pool, a.Name)
}

// AgentPool returns the capacity pool agent a's sessions run in (its
// policy's; Rivet's runner_name_selector).
func (s *Service) AgentPool(a store.Agent) string { return s.h.Policy().ForAgent(a).Pool }

// FindSession returns the session with id, whatever its agent, with that
// agent, or a *NotFoundError for field "session". Session ids are UUIDs,
// unique across agents.
//
// Missing store support: a lookup by session id alone; this reads the
// agent list and then tries each agent's session (one read per agent).
func (s *Service) FindSession(ctx context.Context, id string) (store.Agent, store.Session, error) {
	if id == "" {
		return store.Agent{}, store.Session{}, &NotFoundError{Resource: ResourceSession, Field: "session", Message: "no session \"\""}
	}
	ns, err := s.namespace(ctx)
	if err != nil {
		return store.Agent{}, store.Session{}, err
	}
	// The agents of the namespace only: a session id copied from another
	// namespace is not found.
	as, err := s.st.ListAgents(ctx, ns)
	if err != nil {
		return store.Agent{}, store.Session{}, wrap("find session", err)
	}
	for _, a := range as {
		x, err := s.st.GetSession(ctx, store.ActorKey{AgentUID: a.UID, SessionID: id})
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return a, x, wrap("find session", err)
		}
		return a, x, nil
	}
	return store.Agent{}, store.Session{}, &NotFoundError{Resource: ResourceSession, Field: "session", Message: fmt.Sprintf("no session %q", id)}
}

// SessionQuery selects agent a's sessions for QuerySessions.
type SessionQuery struct {
	// Key, when set, selects the sessions with that key (at most one is
	// not destroyed).
	Key string
	// IncludeDestroyed also selects destroyed sessions.
	IncludeDestroyed bool
	// After is the previous page's next cursor ("" to start).
	After string
	// Limit is the page size: 0 means DefaultSessionLimit, at most
	// MaxSessionLimit.
	Limit int
}

// QuerySessions pages agent a's sessions by session id, leaving out
// destroyed ones unless q.IncludeDestroyed and, with q.Key, those of
// another key. next is the cursor of the next page ("" after the last).
// Refusals: *InvalidError for "limit".
//
// Missing store support: a filter by key and status in the query itself;
// this reads the agent's sessions a page of MaxSessionLimit at a time
// until the page is full (a lookup by key reads every session of the
// agent).
func (s *Service) QuerySessions(ctx context.Context, a store.Agent, q SessionQuery) (xs []store.Session, next string, err error) {
	n, err := pageSize(q.Limit, DefaultSessionLimit, MaxSessionLimit)
	if err != nil {
		return nil, "", err
	}
	after := q.After
	for {
		page, err := s.st.ListSessions(ctx, store.ListSessionsParams{AgentUID: a.UID, After: after, Limit: MaxSessionLimit})
		if err != nil {
			return nil, "", wrap("query sessions", err)
		}
		for _, x := range page {
			after = x.SessionID
			if (q.Key != "" && x.Key != q.Key) || (!q.IncludeDestroyed && x.Status == store.SessionDestroyed) {
				continue
			}
			xs = append(xs, x)
			if len(xs) == n {
				return xs, x.SessionID, nil
			}
		}
		if len(page) < MaxSessionLimit {
			return xs, "", nil
		}
	}
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
