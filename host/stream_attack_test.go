package host_test

// Attacks on the session stream and waits (branch breaker). Each test
// states what it tries and what the host must do.

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// Found by attack, fixed: stream.max_bytes_per_turn counted only a chunk's
// text and data, so empty chunks ({"type":"text","text":""}) cost nothing:
// a guest looping on Emit("") was never refused, and every chunk still
// became a stored chunk and an SSE event of ~100 bytes for every client
// (unbounded store growth and client traffic per turn). Each chunk now
// also counts a fixed overhead towards the cap.
func TestAttackEmptyChunksEscapeTheTurnCap(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		pol := testPolicy()
		pol.Stream.MaxBytesPerTurn = abi.MaxChunkBytes
		var mu sync.Mutex
		accepted, refused := 0, ""
		f := start(t, st, map[string]abi.TurnFunc{"flood": func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			n := 0
			for ; n < 100_000; n++ {
				if err := abi.Emit(ctx, ""); err != nil {
					if ce, ok := errors.AsType[*abi.CallError](err); ok {
						mu.Lock()
						refused = string(ce.Code)
						mu.Unlock()
					}
					break
				}
			}
			mu.Lock()
			accepted = n
			mu.Unlock()
			return &abi.TurnResult{}, nil
		}}, pol)
		key := f.session(f.agent("flood"))
		f.signal(key, "go")
		f.waitFor("the turn to commit", func() bool { return f.get(key).TurnCount == 1 })
		mu.Lock()
		defer mu.Unlock()
		if refused != string(abi.CallTooLarge) || accepted >= 100_000 {
			t.Fatalf("%d empty chunks accepted, then %q; want too_large well before 100000", accepted, refused)
		}
		_, chunks := describeStream(t, f.frames(key))
		checkOffsets(t, chunks)
		if len(chunks) != accepted {
			t.Errorf("%d chunks stored, want the %d accepted", len(chunks), accepted)
		}
	})
}
