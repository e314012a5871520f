package host

import (
	"context"
	"sync"
)

// pool is one capacity pool of this host: at most capacity concurrent
// activations, handed out first come, first served (DESIGN "Capacity":
// sessions that must wait queue FIFO).
type pool struct {
	mu       sync.Mutex
	capacity int
	used     int
	waiters  []chan struct{} // FIFO; a closed channel owns a slot
}

func newPool(capacity int) *pool { return &pool{capacity: capacity} }

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

// release returns a slot, handing it to the oldest waiter.
func (p *pool) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.used--
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
