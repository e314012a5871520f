package host

import (
	"testing"
	"time"

	"github.com/paddock-dev/paddock/store"
)

// TestEchoSetPairsAnAppendsTwoWakeups: of an append's two wake-ups, the
// report (Appended) and the echo of its notification, exactly one wakes
// the controller. A report that comes first wakes it and the echo is
// dropped; an echo that comes first waits for the report, which wakes it
// instead, or wakes it itself after the grace; other appends are
// independent; an unpaired one is forgotten after two generations (its
// partner, come late, then wakes again: nothing lost).
func TestEchoSetPairsAnAppendsTwoWakeups(t *testing.T) {
	var s echoSet
	key := func(session string, seq int64) echoKey {
		return echoKey{store.ActorKey{AgentUID: "a", SessionID: session}, seq}
	}
	never := func() { t.Error("an echo's wake-up fired although its report came first") }

	a, b, c := key("s", 1), key("s", 2), key("t", 1)
	if wake, dropped := s.reported(a); !wake || dropped {
		t.Fatalf("a first report: wake %v, dropped %v; want true, false", wake, dropped)
	}
	if s.echoed(b, time.Hour, never) != true {
		t.Fatal("a first echo was not taken as first")
	}
	if s.echoed(a, time.Hour, never) {
		t.Fatal("the echo of a reported append was not dropped")
	}
	if wake, dropped := s.reported(b); !wake || !dropped {
		t.Fatalf("a report after its echo, within the grace: wake %v, dropped %v; want true, true", wake, dropped)
	}
	// A pair done is forgotten: the same key again is a first.
	if wake, _ := s.reported(a); !wake {
		t.Fatal("a pair done was still remembered")
	}

	// An echo whose report does not come wakes the controller itself.
	fired := make(chan struct{})
	if !s.echoed(c, time.Millisecond, func() { close(fired) }) {
		t.Fatal("a first echo was not taken as first")
	}
	select {
	case <-fired:
	case <-time.After(10 * time.Second):
		t.Fatal("an echo without a report never woke the controller")
	}
	if wake, dropped := s.reported(c); wake || !dropped {
		t.Fatalf("a report after its echo woke: wake %v, dropped %v; want false, true", wake, dropped)
	}

	d := key("u", 1)
	s.reported(d)
	for i := range 2 * echoSetSize {
		s.reported(key("y", int64(i+10)))
	}
	if wake, dropped := s.reported(d); !wake || dropped {
		t.Fatal("a wake-up unpaired for two generations was still remembered")
	}
	if n := len(s.cur) + len(s.prev); n > 2*echoSetSize {
		t.Fatalf("echoSet holds %d entries, bound %d", n, 2*echoSetSize)
	}
}
