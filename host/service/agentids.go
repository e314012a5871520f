package service

import (
	"context"
	"errors"
	"sync"

	"github.com/paddock-dev/paddock/store"
)

// maxAgentIDs bounds the entries of a Service's cache of agent identities
// (agentIDs): past it, an entry is dropped for each one added.
const maxAgentIDs = 4096

// agentIDs caches what an agent's address — its name or uid, in a
// namespace — resolves to: the agent's identity (uid, namespace, name),
// so that a signal addressed by name does not read the agents table each
// time (docs/DESIGN.md "The flow of one signal").
//
// Why an entry stays right: the identity of an agent is immutable. No
// store operation renames an agent, moves it to another namespace or
// changes its uid (an update, CreateAgent with Upsert, changes only its
// kind, binding and crash policy), and none deletes one; sessions refer to
// their agent's uid without ON DELETE CASCADE, so even a row removed by
// hand can go only while no session names it. A stale entry — an agent
// deleted and registered again under its name, with a new uid — can thus
// only send a signal to a session that does not exist under the old uid:
// the signal fails as a missing session, writing nothing, and SignalAgent
// then drops the entry, resolves the address again from the store, and
// sends the signal to the new uid. Only found agents are cached (an agent
// created on another host is found at once), keyed by the namespace the
// request acts in after its namespace check, so a namespace-scoped token
// never reads another namespace's entry.
type agentIDs struct {
	mu sync.Mutex
	m  map[agentAddr]store.Agent
}

// agentAddr is how a request addressed an agent: its namespace and the
// name or uid it gave.
type agentAddr struct{ namespace, nameOrUID string }

// get returns the cached identity of addr.
func (c *agentIDs) get(addr agentAddr) (store.Agent, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	a, ok := c.m[addr]
	return a, ok
}

// put caches a as what addr resolves to.
func (c *agentIDs) put(addr agentAddr, a store.Agent) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[agentAddr]store.Agent)
	}
	if _, ok := c.m[addr]; !ok && len(c.m) >= maxAgentIDs {
		for k := range c.m {
			delete(c.m, k)
			break
		}
	}
	c.m[addr] = a
}

// forget drops what addr resolves to.
func (c *agentIDs) forget(addr agentAddr) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, addr)
}

// identity is a's identity: its uid, namespace and name, the fields that
// never change while the agent exists; the others are zero.
func identity(a store.Agent) store.Agent {
	return store.Agent{UID: a.UID, Namespace: a.Namespace, Name: a.Name}
}

// ResolveAgent returns the identity of the agent nameOrUID (a name, or a
// uid) of the namespace of ctx: its UID, Namespace and Name, every other
// field zero — what Signal needs. It reads the store only the first time
// an address is resolved (agentIDs explains why the answer stays right);
// GetAgent reads the whole row every time. Refusals are GetAgent's: a
// *NotFoundError for an agent that is not in the namespace asked, missing
// or of another namespace alike, and the namespace check's.
func (s *Service) ResolveAgent(ctx context.Context, nameOrUID string) (store.Agent, error) {
	ns, err := s.namespace(ctx)
	if err != nil {
		return store.Agent{}, err
	}
	addr := agentAddr{namespace: ns, nameOrUID: nameOrUID}
	if a, ok := s.agents.get(addr); ok {
		return a, nil
	}
	return s.resolveAgent(ctx, addr)
}

// resolveAgent reads addr's agent from the store and caches its identity.
func (s *Service) resolveAgent(ctx context.Context, addr agentAddr) (store.Agent, error) {
	a, err := s.st.GetAgent(ctx, addr.namespace, addr.nameOrUID)
	if errors.Is(err, store.ErrNotFound) {
		return store.Agent{}, notFoundAgent(addr.nameOrUID)
	}
	if err != nil {
		return store.Agent{}, wrap("get agent", err)
	}
	a = identity(a)
	s.agents.put(addr, a)
	return a, nil
}

// SignalAgent is Signal to session sessionID of the agent nameOrUID of the
// namespace of ctx, resolved with ResolveAgent (no read of the agents
// table once its address is cached). When the session is not found under
// the cached uid, the address is resolved again from the store: an agent
// registered again under its name since (a new uid) gets the signal; an
// agent gone is a *NotFoundError for the agent; otherwise the session is
// missing indeed. A caller whose role or namespace does not allow the
// signal is refused (a *ForbiddenError) before the agent is looked up.
// Refusals are otherwise ResolveAgent's and Signal's.
func (s *Service) SignalAgent(ctx context.Context, nameOrUID, sessionID string, p SignalParams) (SignalResult, error) {
	if err := s.Authorize(ctx, SignalOp(p)); err != nil {
		return SignalResult{}, err
	}
	a, err := s.ResolveAgent(ctx, nameOrUID)
	if err != nil {
		return SignalResult{}, err
	}
	res, err := s.Signal(ctx, a, sessionID, p)
	var nf *NotFoundError
	if !errors.As(err, &nf) || nf.Resource != ResourceSession {
		return res, err
	}
	// Nothing was written: check the cached uid against the store.
	addr := agentAddr{namespace: a.Namespace, nameOrUID: nameOrUID}
	s.agents.forget(addr)
	fresh, ferr := s.resolveAgent(ctx, addr)
	switch {
	case ferr != nil:
		return SignalResult{}, ferr
	case fresh.UID == a.UID:
		return res, err
	}
	return s.Signal(ctx, fresh, sessionID, p)
}
