package wasm

import (
	"context"
	"sync"
)

// DefaultPoolIdle is the default number of idle instances a Pool keeps per
// key.
const DefaultPoolIdle = 8

// Pool keeps warm, idle instances for reuse, by key, so that a turn borrows
// one instead of instantiating (milliseconds of CPU and megabytes of
// allocations for a Go guest; a pooled one costs a mutex). The caller chooses the key, and with
// it who may see an instance's globals after whom: the host keys by module
// and agent (agent-scoped reuse, policy instance_reuse: agent), so that an
// instance serves the turns of one agent's sessions one at a time and never
// another agent's, even one running the same module bytes.
//
// An instance that failed a turn is closed by Instance.Turn and never comes
// back; one whose memory passed the recycle mark or that served
// RecycleAfterTurns turns is closed on Put. It is safe for concurrent use.
type Pool struct {
	rt      *Runtime
	maxIdle int

	mu     sync.Mutex
	idle   map[string][]*Instance // by key, most recently used last
	closed bool
}

// NewPool returns a pool over rt keeping at most maxIdle idle instances per
// key (0: DefaultPoolIdle; negative: none, every Get instantiates).
func NewPool(rt *Runtime, maxIdle int) *Pool {
	if maxIdle == 0 {
		maxIdle = DefaultPoolIdle
	}
	return &Pool{rt: rt, maxIdle: max(maxIdle, 0), idle: map[string][]*Instance{}}
}

// Get returns an idle instance kept under key, or a new instance of the
// loaded module digest (Runtime.Instantiate's errors).
func (p *Pool) Get(ctx context.Context, key, digest string) (*Instance, error) {
	p.mu.Lock()
	if !p.closed {
		if l := p.idle[key]; len(l) > 0 {
			inst := l[len(l)-1]
			l[len(l)-1] = nil
			if len(l) == 1 {
				delete(p.idle, key)
			} else {
				p.idle[key] = l[:len(l)-1]
			}
			p.mu.Unlock()
			return inst, nil
		}
	}
	p.mu.Unlock()
	return p.rt.Instantiate(ctx, digest)
}

// Put returns inst after a turn, to be kept under key: kept if it is
// healthy and fewer than the idle cap wait under key, closed otherwise.
func (p *Pool) Put(key string, inst *Instance) {
	if inst == nil {
		return
	}
	if !inst.ShouldRecycle() {
		p.mu.Lock()
		if !p.closed && len(p.idle[key]) < p.maxIdle {
			p.idle[key] = append(p.idle[key], inst)
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
	}
	_ = inst.Close(context.Background())
}

// Idle returns the number of idle instances under key.
func (p *Pool) Idle(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle[key])
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
