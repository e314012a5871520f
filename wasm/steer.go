package wasm

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/tetratelabs/wazero/api"

	"github.com/paddock-dev/paddock/abi"
)

// turnSteersKey is the context key under which the steer_poll host function
// finds the running turn's turnSteers (host functions are shared by all
// instances).
type turnSteersKey struct{}

// turnSteers is the steer input of one running turn. The guest calls
// steer_poll on the goroutine that runs the turn, so no lock is needed:
// Turn reads refs only after the guest call returned.
type turnSteers struct {
	ch     <-chan abi.Steer
	log    *slog.Logger
	digest string
	glog   *guestLog

	// pending is the encoded steer taken from ch whose delivery is waiting
	// for a guest buffer large enough; pendingRef is its turn_ref.
	pending    []byte
	pendingRef abi.TurnRef
	// refs are the turn_refs of the steers delivered to the guest, oldest
	// first.
	refs []abi.TurnRef
}

// withTurnSteers attaches s to the context of the turn's guest calls.
func withTurnSteers(ctx context.Context, s *turnSteers) context.Context {
	return context.WithValue(ctx, turnSteersKey{}, s)
}

// hostSteerPoll is the host function
// paddock.steer_poll(buf_ptr i32, buf_cap i32) -> i32 (abi/README.md,
// "Imports"): 0 when no steer is waiting; n > 0 when one steer's JSON, n
// bytes, was written at buf_ptr (the steer is then taken in); -n when the
// waiting steer needs n bytes and buf_cap is smaller (nothing is taken; the
// next call returns the same steer). A buffer outside guest memory fails
// the turn with KindInvalidResult. Outside a turn, or for a turn run
// without WithSteers, it returns 0.
func hostSteerPoll(ctx context.Context, m api.Module, stack []uint64) {
	s, _ := ctx.Value(turnSteersKey{}).(*turnSteers)
	stack[0] = api.EncodeI32(s.poll(ctx, m.Memory(), api.DecodeU32(stack[0]), api.DecodeU32(stack[1])))
}

// poll implements steer_poll for the running turn.
func (s *turnSteers) poll(ctx context.Context, mem api.Memory, ptr, capacity uint32) int32 {
	if s == nil {
		return 0
	}
	for s.pending == nil {
		select {
		case st, ok := <-s.ch:
			if !ok {
				s.ch = nil // closed: no more steers; a nil channel never receives
				return 0
			}
			b, err := abi.Marshal(st)
			if err == nil && len(b) > abi.MaxRequestBytes {
				err = fmt.Errorf("%d bytes, limit %d", len(b), abi.MaxRequestBytes)
			}
			if err != nil {
				// The host's bug, not the guest's: the steer is dropped
				// here, and the stale reply brings it back in Steers.
				s.log.LogAttrs(ctx, slog.LevelError, "wasm steer not deliverable",
					logAttrs(s.digest, st.TurnRef.String(), "error", err.Error())...)
				continue
			}
			s.pending, s.pendingRef = b, st.TurnRef
		default:
			return 0
		}
	}
	n := len(s.pending)
	if uint32(n) > capacity {
		return -int32(n)
	}
	if mem == nil || !mem.Write(ptr, s.pending) {
		size := uint32(0)
		if mem != nil {
			size = mem.Size()
		}
		// A panic with an error fails the guest call; classify finds the
		// *TurnError in the chain.
		panic(&TurnError{Kind: KindInvalidResult, Op: HostModule + "." + HostSteerPoll, Digest: s.digest,
			Err: fmt.Errorf("steer buffer %#x of %d bytes is outside the %d-byte memory", ptr, n, size)})
	}
	s.refs = append(s.refs, s.pendingRef)
	s.glog.retag(s.pendingRef.String())
	s.pending = nil
	return int32(n)
}

// echoes reports whether ref is one the guest may echo: the request's or
// that of a steer it took in.
func (s *turnSteers) echoes(req, ref abi.TurnRef) bool {
	if ref == req {
		return true
	}
	if s == nil {
		return false
	}
	for _, r := range s.refs {
		if r == ref {
			return true
		}
	}
	return false
}
