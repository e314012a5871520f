package host

import (
	"context"
	"sync"
)

// pool is one capacity pool of this host: at most capacity concurrent
// activations, handed out first come, first served (docs/DESIGN.md "Capacity":
// sessions that must wait queue FIFO).
//
// An idle activation holds its slot only while nobody waits for one: a
// waiter closes the pool's contention channel, and each idle holder that
// wins a yield (claimYield) stops its activation and returns the slot
// (docs/DESIGN.md invariant 11).
type pool struct {
	mu       sync.Mutex
	capacity int
	used     int
	waiters  []chan struct{} // FIFO; a closed channel owns a slot
	// yielding counts idle holders that promised their slot to a waiter
	// and have not returned it yet.
	yielding int
	// contendedCh is closed when a waiter queues (nil until asked for).
	contendedCh chan struct{}
	// closed is an always-closed channel, returned by contended while
	// waiters are not yet served by a yield.
	closed chan struct{}
}

func newPool(capacity int) *pool {
	closed := make(chan struct{})
	close(closed)
	return &pool{capacity: capacity, closed: closed}
}

// contended returns a channel that is closed while some waiter has no
// yield promised to it yet, or as soon as one queues.
func (p *pool) contended() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.waiters) > p.yielding {
		return p.closed
	}
	if p.contendedCh == nil {
		p.contendedCh = make(chan struct{})
	}
	return p.contendedCh
}

// claimYield reports whether the caller, an idle slot holder, should give
// its slot up to a waiter; if so it must call release(true) soon.
func (p *pool) claimYield() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.waiters) > p.yielding {
		p.yielding++
		return true
	}
	return false
}

// tryAcquire takes a slot if one is free and nobody is queued before us.
func (p *pool) tryAcquire() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.used < p.capacity && len(p.waiters) == 0 {
		p.used++
		return true
	}
	return false
}

// acquire waits in FIFO order for a slot until ctx ends.
func (p *pool) acquire(ctx context.Context) error {
	p.mu.Lock()
	if p.used < p.capacity && len(p.waiters) == 0 {
		p.used++
		p.mu.Unlock()
		return nil
	}
	w := make(chan struct{})
	p.waiters = append(p.waiters, w)
	if p.contendedCh != nil {
		close(p.contendedCh)
		p.contendedCh = nil
	}
	p.mu.Unlock()
	select {
	case <-w:
		return nil
	case <-ctx.Done():
		p.mu.Lock()
		defer p.mu.Unlock()
		for i, x := range p.waiters {
			if x == w {
				p.waiters = append(p.waiters[:i], p.waiters[i+1:]...)
				return ctx.Err()
			}
		}
		// Granted just as ctx ended: keep the FIFO fair by passing it on.
		p.used--
		p.grant()
		return ctx.Err()
	}
}

// release returns a slot, handing it to the oldest waiter; yielded says
// the holder gave it up after claimYield.
func (p *pool) release(yielded bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.used--
	if yielded && p.yielding > 0 {
		p.yielding--
	}
	p.grant()
}

// grant hands free slots to waiters in order. Called with mu held.
func (p *pool) grant() {
	for p.used < p.capacity && len(p.waiters) > 0 {
		w := p.waiters[0]
		p.waiters = p.waiters[1:]
		p.used++
		close(w)
	}
}

// setCapacity changes the capacity (config reload); slots in use are kept.
func (p *pool) setCapacity(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.capacity = n
	p.grant()
}

// stats returns slots in use, capacity and queue length.
func (p *pool) stats() (used, capacity, waiting int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.used, p.capacity, len(p.waiters)
}
