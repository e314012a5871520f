package wasm_test

// The Instance's reused request buffer and the copied-out result (written
// in review).

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/examples/faulty"
	"github.com/paddock-dev/paddock/wasm"
)

// TestRequestBufferReuse runs turns of varied sizes on one instance
// (under, at and over the kept-buffer cap, over abi.MaxRequestBytes, and
// failing to encode) and checks each request reached the guest intact and
// each result survives the instance and its memory being reused.
func TestRequestBufferReuse(t *testing.T) {
	t.Parallel()
	b := shared(t)
	ctx := context.Background()
	inst := b.instance(t, b.faulty(t))
	r := rand.New(rand.NewPCG(7, 7))
	alphabet := []string{"a", "<", ">", "&", "é", "😀", "\u2028", "\"", "\\", "\n", "x"}
	text := func(n int) string {
		var sb strings.Builder
		for sb.Len() < n {
			sb.WriteString(alphabet[r.IntN(len(alphabet))])
		}
		return strings.TrimSpace(sb.String())
	}
	type kept struct {
		res  *abi.TurnResult
		want string
	}
	var keep []kept
	for round, n := range []int{10, 100, 60 << 10, 64<<10 - 200, 70 << 10, 10, 300 << 10, 5, -1, -2, 12, 64 << 10, 3} {
		switch n {
		case -1: // over abi.MaxRequestBytes: refused, the instance stays usable
			_, err := inst.Turn(ctx, request("statesum", make([]byte, abi.MaxRequestBytes), 1))
			if !errors.Is(err, wasm.ErrRequestTooLarge) {
				t.Fatalf("round %d: %v, want ErrRequestTooLarge", round, err)
			}
			continue
		case -2: // an encoding error on the fast path (event data), after a big prefix
			req := request("echo "+text(50<<10), nil, 1)
			req.Event.Data = json.RawMessage(`{"a":`)
			if _, err := inst.Turn(ctx, req); err == nil || !strings.Contains(err.Error(), "encode turn request") {
				t.Fatalf("round %d: %v, want an encoding error", round, err)
			}
			continue
		}
		msg := "echo " + text(n)
		state := make([]byte, n/2)
		for i := range state {
			state[i] = byte(r.Uint32())
		}
		req := request(msg, nil, 1)
		res, err := inst.Turn(ctx, req)
		if got := replyOf(t, res, err); got != "ok: "+strings.TrimSpace(msg) {
			t.Fatalf("round %d (%d bytes): reply differs from the request's message (%d vs %d bytes)", round, n, len(got), len(msg))
		}
		keep = append(keep, kept{res, "ok: " + strings.TrimSpace(msg)})
		res, err = inst.Turn(ctx, request("statesum", state, 1))
		if got := replyOf(t, res, err); got != faulty.StateSum(state) {
			t.Fatalf("round %d: statesum %q, want %q", round, got, faulty.StateSum(state))
		}
		keep = append(keep, kept{res, faulty.StateSum(state)})
	}
	inst.Close(ctx)
	// Reuse the memory the results came from.
	for range 3 {
		i2 := b.instance(t, b.faulty(t))
		reply(t)(i2.Turn(ctx, request("big 100000", nil, 1)))
		i2.Close(ctx)
	}
	for i, k := range keep {
		if got := k.res.Messages[0].Content; got != k.want {
			t.Fatalf("result %d changed after its instance closed: %d bytes, want %d", i, len(got), len(k.want))
		}
	}
}
