package abi

import "context"

// steersKey is the context key of the steer channel given to WithSteers.
type steersKey struct{}

// WithSteers returns a copy of ctx that carries steers, the steer input of
// the turn a worker runs under it (docs/DESIGN.md "Steering and cancellation"). It
// is the one way every worker kind — wasm, plugin, remote — receives steers:
// the host's controller makes the channel, each worker reads it with
// SteersOf.
//
// The host sends a steer only after it has persisted it and raised the
// turn's revision: Steer.TurnRef is the new turn_ref. Use one channel per
// turn, buffered so that sending never blocks the host. Steers still in the
// channel when the turn returns were not seen by the worker: the result
// then echoes an older turn_ref, the store rejects it (stale_revision) and
// the host runs the turn again with the steers in TurnRequest.Steers. A nil
// channel is the same as none.
func WithSteers(ctx context.Context, steers <-chan Steer) context.Context {
	return context.WithValue(ctx, steersKey{}, steers)
}

// SteersOf returns the steer channel of ctx, nil if none.
func SteersOf(ctx context.Context) <-chan Steer {
	ch, _ := ctx.Value(steersKey{}).(<-chan Steer)
	return ch
}
