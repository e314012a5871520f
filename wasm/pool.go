package wasm

import (
	"context"
	"sync"
)

// DefaultPoolIdle is the default number of idle instances a Pool keeps per
// module.
const DefaultPoolIdle = 8

// Pool keeps warm, idle instances of each module so that a turn borrows one
// instead of instantiating (~6-13 ms and ~12 MB of allocations for a Go
// guest; a pooled one costs a mutex). An instance serves one turn at a time
// and goes back to the pool after a successful turn, so instances are shared
// by the activations of one module in turn — and memory is bounded by the
// turns running at once plus the idle cap, not by the number of live
// sessions. A session's state travels in every TurnRequest, so no session
// depends on what an instance remembers (abi/README.md: a guest must keep
// nothing in globals between turns).
//
// An instance that failed a turn is closed by Instance.Turn and never comes
// back; one whose memory passed the recycle mark or that served
// RecycleAfterTurns turns is closed on Put. It is safe for concurrent use.
type Pool struct {
	rt      *Runtime
	maxIdle int

	mu     sync.Mutex
	idle   map[string][]*Instance // by digest, most recently used last
	closed bool
}

// NewPool returns a pool over rt keeping at most maxIdle idle instances per
// module (0: DefaultPoolIdle; negative: none, every Get instantiates).
func NewPool(rt *Runtime, maxIdle int) *Pool {
	if maxIdle == 0 {
		maxIdle = DefaultPoolIdle
	}
	return &Pool{rt: rt, maxIdle: max(maxIdle, 0), idle: map[string][]*Instance{}}
}

// Get returns an idle instance of the loaded module digest, or a new one
// (Runtime.Instantiate's errors).
func (p *Pool) Get(ctx context.Context, digest string) (*Instance, error) {
	p.mu.Lock()
	if !p.closed {
		if l := p.idle[digest]; len(l) > 0 {
			inst := l[len(l)-1]
			l[len(l)-1] = nil
			p.idle[digest] = l[:len(l)-1]
			p.mu.Unlock()
			return inst, nil
		}
	}
	p.mu.Unlock()
	return p.rt.Instantiate(ctx, digest)
}

// Put returns inst after a turn: kept if it is healthy and its module has
// fewer than the idle cap waiting, closed otherwise.
func (p *Pool) Put(inst *Instance) {
	if inst == nil {
		return
	}
	if !inst.ShouldRecycle() {
		p.mu.Lock()
		if !p.closed && len(p.idle[inst.digest]) < p.maxIdle {
			p.idle[inst.digest] = append(p.idle[inst.digest], inst)
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
	}
	_ = inst.Close(context.Background())
}

// Idle returns the number of idle instances of digest.
func (p *Pool) Idle(digest string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle[digest])
}

// Drop closes the idle instances of digest (after Runtime.Unload).
func (p *Pool) Drop(ctx context.Context, digest string) {
	p.mu.Lock()
	l := p.idle[digest]
	delete(p.idle, digest)
	p.mu.Unlock()
	for _, inst := range l {
		_ = inst.Close(ctx)
	}
}

// Close closes every idle instance; later Puts close theirs.
func (p *Pool) Close(ctx context.Context) {
	p.mu.Lock()
	all := p.idle
	p.idle, p.closed = map[string][]*Instance{}, true
	p.mu.Unlock()
	for _, l := range all {
		for _, inst := range l {
			_ = inst.Close(ctx)
		}
	}
}
