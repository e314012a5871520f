// Package workerhooks lets the fabric's tests break a worker
// (fabric/worker) in ways a real one breaks. The hooks travel in the
// context given to worker.Run, so that nothing outside the module can set
// them; a production worker has none.
package workerhooks

import (
	"context"
	"errors"

	"github.com/paddock-dev/paddock/abi"
)

// Hooks break a worker.
type Hooks struct {
	// RecvGate is called before each receive; blocking in it stalls the
	// receive loop while the rest of the worker lives.
	RecvGate func()
	// Capacity, if set, is announced instead of Config.Capacity.
	Capacity int
	// Die, when closed, drops the connection without GOODBYE and stops
	// the worker (an in-process kill -9); worker.Run returns ErrKilled.
	Die <-chan struct{}
	// Turn, if set, runs every turn the worker accepts instead of its
	// wasm runtime or plugin manager, under the ctx the worker gives its
	// instances (deadline, steers, the turn's abi.Caller).
	Turn func(ctx context.Context, binding string, req *abi.TurnRequest) (*abi.TurnResult, error)
}

// ErrKilled is what worker.Run returns after Die was closed.
var ErrKilled = errors.New("fabric: worker killed (test hook)")

type key struct{}

// With returns ctx carrying h.
func With(ctx context.Context, h *Hooks) context.Context { return context.WithValue(ctx, key{}, h) }

// From returns the hooks ctx carries, nil if none.
func From(ctx context.Context) *Hooks {
	h, _ := ctx.Value(key{}).(*Hooks)
	return h
}
