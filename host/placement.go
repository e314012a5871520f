package host

import (
	"context"
	"time"

	"github.com/paddock-dev/paddock/store"
)

// Placer is implemented by runners that can run some pools only at some
// times: a remote pool runs only while a live remote worker of the pool is
// connected to this host's broker. Before a controller claims an
// activation it asks CanRun; when the answer is no, the host leaves the
// session alone (no claim, no epoch bump, no attempt) so that a host that
// can run it claims it from its own wake-up or scan (docs/DESIGN.md "Remote pools
// across hosts"). A runner that does not implement Placer can run every
// pool at any time.
type Placer interface {
	// CanRun reports whether a turn of agent, in pool, could be dispatched
	// on this host now (capacity aside). It must be cheap: it is asked on
	// every wake-up of a session on this host.
	CanRun(ctx context.Context, agent store.Agent, pool string) bool
}

// PoolScope is an optional part of a Placer: MayRefuse reports whether
// CanRun can answer no for pool at all (a remote pool). The runnable scan
// asks CanRun, once per scan, for the agents of such pools only, and
// leaves out the sessions of those this host cannot run now; a Placer
// without it has every agent asked (one agent listing per scan).
type PoolScope interface {
	MayRefuse(pool string) bool
}

// placeable reports whether this host may claim an activation of agent's
// session in pool now (Placer).
func (h *Host) placeable(ctx context.Context, agent store.Agent, pool string) bool {
	p, ok := h.runner.(Placer)
	if !ok {
		return true
	}
	if ps, ok := p.(PoolScope); ok && !ps.MayRefuse(pool) {
		return true // asked before every turn: no timer for a local pool
	}
	// CanRun may look up the agent's plugin binding in the store.
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return p.CanRun(ctx, agent, pool)
}

// Rescan makes the host look for runnable sessions now instead of at the
// next scan tick (it returns at once). Call it when something changed that
// lets this host run sessions it had to leave alone: a remote worker
// connected.
func (h *Host) Rescan() {
	select {
	case h.rescan <- struct{}{}:
	default:
	}
}
