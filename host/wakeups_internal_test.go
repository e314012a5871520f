package host

import (
	"testing"

	"github.com/paddock-dev/paddock/store"
)

// TestEchoSetPairsAnAppendsTwoWakeups: of an append's two wake-ups, in
// either order, the first is reported first and the second is not; other
// appends are independent; an unpaired one is forgotten after two
// generations (its partner, come late, then wakes again: nothing lost).
func TestEchoSetPairsAnAppendsTwoWakeups(t *testing.T) {
	var s echoSet
	a := echoKey{store.ActorKey{AgentUID: "a", SessionID: "s"}, 1}
	b := echoKey{store.ActorKey{AgentUID: "a", SessionID: "s"}, 2}
	c := echoKey{store.ActorKey{AgentUID: "a", SessionID: "t"}, 1}
	for _, step := range []struct {
		k     echoKey
		first bool
	}{
		{a, true}, {b, true}, {c, true}, {b, false}, {a, false}, {c, false},
		// A pair done is forgotten: the same key again is a first.
		{a, true}, {a, false},
	} {
		if got := s.first(step.k); got != step.first {
			t.Fatalf("first(%v) = %v, want %v", step.k, got, step.first)
		}
	}
	if !s.first(a) {
		t.Fatal("a fresh wake-up was not first")
	}
	for i := range 2 * echoSetSize {
		s.first(echoKey{store.ActorKey{AgentUID: "x", SessionID: "y"}, int64(i + 10)})
	}
	if !s.first(a) {
		t.Fatal("a wake-up unpaired for two generations was still remembered")
	}
	if n := len(s.cur) + len(s.prev); n > 2*echoSetSize {
		t.Fatalf("echoSet holds %d entries, bound %d", n, 2*echoSetSize)
	}
}
