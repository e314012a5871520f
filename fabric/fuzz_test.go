package fabric

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/fabric/internal/workerkind"
	"github.com/paddock-dev/paddock/fabric/wire"
)

// fuzzBroker is a real broker whose receive path the fuzz target drives
// directly (Broker.handle, as its receive goroutine does; no client
// connects, so that goroutine stays blocked in Recv), with the keys of its
// one worker, "w1", to seal messages as the worker would.
type fuzzBroker struct {
	b    *Broker
	key  []byte
	sess *wire.Session // the worker's side of the current session
	last []byte        // the last message sealed on sess
}

func newFuzzBroker(f *testing.F) *fuzzBroker {
	f.Helper()
	fb := &fuzzBroker{key: wire.NewKey()}
	b, err := NewBroker(context.Background(), BrokerConfig{
		Endpoint: "tcp://127.0.0.1:0", Workers: map[string][]byte{"w1": fb.key},
		// Nothing here heartbeats on time: sessions end only by what the
		// fuzzer sends.
		HeartbeatInterval: time.Hour, HeartbeatTimeout: 2 * time.Hour,
		Modules: func(context.Context, string) ([]byte, error) { return nil, errors.New("no modules") },
	}, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = b.Close(ctx)
	})
	fb.b = b
	return fb
}

// received returns the count of messages the broker took in or dropped.
func (fb *fuzzBroker) received() uint64 {
	s := fb.b.Stats()
	d := s.Dropped
	return s.MessagesIn + d.Oversized + d.Malformed + d.UnknownVersion + d.Unauthenticated + d.Forged + d.Replayed +
		d.Flood + d.UnknownSession + d.StaleSession
}

func (fb *fuzzBroker) handle(route string, frame []byte) {
	fb.b.handle(zmq4.NewMsgFrom([]byte(route), frame))
}

// hello seals a HELLO with body under a fresh incarnation.
func (fb *fuzzBroker) hello(t testing.TB, body []byte) wire.ID {
	inc := wire.NewID()
	ws, err := wire.NewSession(fb.key, "w1", inc, wire.ID{})
	if err != nil {
		t.Fatal(err)
	}
	// The HELLO rate limit is per worker id; the fuzzer says hello far
	// more often than any worker may.
	clear(fb.b.helloRate)
	fb.handle("w1", ws.Seal(wire.ToHost, wire.KindHello, 1, body))
	return inc
}

// live makes sure the worker has a session the broker has not ended, and
// returns it (the broker's side).
func (fb *fuzzBroker) live(t testing.TB) *session {
	if fb.sess != nil {
		fb.b.mu.Lock()
		s := fb.b.sessions[sessKey{"w1", fb.sess.Incarnation(), fb.sess.ID()}]
		fb.b.mu.Unlock()
		if s != nil && !s.isDead() {
			return s
		}
	}
	body, _ := json.Marshal(wire.Hello{TimeMs: time.Now().UnixMilli(), ABIVersion: abi.Version, Pools: []string{"p"}, Kinds: []string{workerkind.Wasm}, Capacity: 2})
	inc := fb.hello(t, body)
	deadline := time.Now().Add(10 * time.Second)
	for {
		fb.b.mu.Lock()
		var s *session
		for k, x := range fb.b.sessions {
			if k.incarnation == inc {
				s = x
			}
		}
		fb.b.mu.Unlock()
		if s != nil {
			ws, err := wire.NewSession(fb.key, "w1", inc, s.key.session)
			if err != nil {
				t.Fatal(err)
			}
			fb.sess = ws
			return s
		}
		if time.Now().After(deadline) {
			t.Fatal("a valid HELLO opened no session")
		}
		time.Sleep(time.Millisecond)
	}
}

// FuzzBrokerReceive drives the host's receive path with what a hostile
// peer can send: raw frames under the worker's id or an unknown one,
// HELLOs sealed with the right key around any body, messages of any kind
// and body sealed on a live session, forgeries and replays. Properties: no
// panic or hang; every message is accounted for (taken in or dropped,
// by reason); a forgery or a replay is never taken in; a genuine HEARTBEAT
// on a live session is still taken in afterwards (nothing the fuzzer sent
// broke the broker's state).
func FuzzBrokerReceive(f *testing.F) {
	hb, _ := json.Marshal(wire.Heartbeat{Free: 1, RxBytes: 10})
	hello, _ := json.Marshal(wire.Hello{TimeMs: time.Now().UnixMilli(), ABIVersion: abi.Version, Pools: []string{"p"}, Kinds: []string{workerkind.Wasm}, Capacity: 1})
	for _, s := range []struct {
		mode, kind uint8
		body       string
	}{
		{0, 0, "\x01\x04\x00\x00"}, {0, 0, "\x02rest"}, {0, 0, ""}, {1, 0, strings.Repeat("\x01", 60)},
		{2, 0, string(hello)}, {2, 0, `{"abi_version":2}`}, {2, 0, `{"time_ms":0,"abi_version":1,"pools":["p"],"kinds":["wasm"],"capacity":1}`},
		{2, 0, `{"time_ms":` + "9223372036854775807" + `,"abi_version":1}`}, {2, 0, "not json"},
		{3, uint8(wire.KindHeartbeat), string(hb)}, {3, uint8(wire.KindPong), `{"nonce":1}`}, {3, uint8(wire.KindGoodbye), `{"reason":"bye"}`},
		{3, uint8(wire.KindResult), `{"delivery_id":"x","result":{"outcome":"ok"}}`}, {3, uint8(wire.KindResult), `{"delivery_id":"x","result":[1]}`},
		{3, uint8(wire.KindAccepted), `{"delivery_id":"x"}`}, {3, uint8(wire.KindError), `{"code":"c","message":"m"}`},
		{3, uint8(wire.KindFetchModule), `{"request_id":1,"digest":"sha256:00","offset":-5,"max_bytes":-1}`},
		{3, uint8(wire.KindTurn), `{}`}, {3, 0x42, `{}`}, {3, uint8(wire.KindProgress), `{"stage":"x"}`},
		{4, uint8(wire.KindHeartbeat), string(hb)}, {5, uint8(wire.KindHeartbeat), string(hb)},
	} {
		f.Add(s.mode, s.kind, []byte(s.body))
	}
	fb := newFuzzBroker(f)
	f.Fuzz(func(t *testing.T, mode, kind uint8, body []byte) {
		fb.live(t)
		before := fb.b.Stats()
		n := fb.received()
		switch mode % 6 {
		case 0: // any bytes under the worker's id
			fb.handle("w1", body)
		case 1: // any bytes under an id the host does not know
			fb.handle("intruder", body)
		case 2: // an authentic HELLO around any body
			fb.hello(t, body)
		case 3: // an authentic message of any kind and body
			fb.last = fb.sess.Seal(wire.ToHost, wire.Kind(kind), fb.sess.NextSeq(), body)
			fb.handle("w1", fb.last)
		case 4: // the same, sealed with another key
			forger, err := wire.NewSession(wire.NewKey(), "w1", fb.sess.Incarnation(), fb.sess.ID())
			if err != nil {
				t.Fatal(err)
			}
			fb.handle("w1", forger.Seal(wire.ToHost, wire.Kind(kind), fb.sess.NextSeq(), body))
			if after := fb.b.Stats(); after.MessagesIn != before.MessagesIn {
				t.Fatal("a forged message was taken in")
			}
		case 5: // a replay of the last authentic message
			if fb.last == nil {
				return
			}
			fb.handle("w1", fb.last)
			if after := fb.b.Stats(); after.MessagesIn != before.MessagesIn {
				t.Fatal("a replayed message was taken in")
			}
		}
		if fb.received() <= n {
			t.Fatalf("mode %d kind %#x: a message left no trace in the counters", mode%6, kind)
		}
		// A genuine heartbeat on a live session is still taken in.
		s := fb.live(t)
		in := fb.b.Stats().MessagesIn
		hb, _ := json.Marshal(wire.Heartbeat{Free: 1})
		fb.last = fb.sess.Seal(wire.ToHost, wire.KindHeartbeat, fb.sess.NextSeq(), hb)
		fb.handle("w1", fb.last)
		if fb.b.Stats().MessagesIn != in+1 && !s.isDead() {
			t.Fatalf("after mode %d kind %#x %q a genuine heartbeat is not taken in: %+v", mode%6, kind, body, fb.b.Stats().Dropped)
		}
	})
}

// FuzzRemoteResult is the host's check of a remote worker's TurnResult
// (Instance.result, what a RESULT's result carries). Properties: no panic;
// a refusal is a *TurnError of kind invalid_result, accepted (the worker
// had taken the turn); an accepted result is within abi.MaxResultBytes,
// validates and echoes one of the allowed turn_refs.
func FuzzRemoteResult(f *testing.F) {
	ref := abi.TurnRef{DeliveryID: "d", ActivationUID: "a", ActorEpoch: 1, ActorEventID: 2, AgentUID: "u", SessionID: "s"}
	steered := ref
	steered.Revision, steered.DeliveryID = 1, "d2"
	r1, _ := json.Marshal(ref)
	r2, _ := json.Marshal(steered)
	for _, s := range []string{
		`{"turn_ref":` + string(r1) + `,"outcome":"ok","messages":[{"role":"assistant","content":"hi"}]}`,
		`{"turn_ref":` + string(r2) + `,"outcome":"sleep"}`,
		`{"turn_ref":{},"outcome":"ok"}`, `{"outcome":"error"}`, `null`, `[]`, `{"turn_ref":` + string(r1) + `,"outcome":"ok","state":"!"}`,
	} {
		f.Add([]byte(s), true)
	}
	i := &Instance{b: &Broker{log: slog.New(slog.DiscardHandler)}, pool: "p", binding: "sha256:" + strings.Repeat("0", 64), kind: workerkind.Wasm}
	f.Fuzz(func(t *testing.T, body []byte, withSteer bool) {
		req := &abi.TurnRequest{TurnRef: ref}
		allowed := []abi.TurnRef{ref}
		if withSteer {
			allowed = append(allowed, steered)
		}
		res, busy, err := i.result(nil, body, req, allowed)
		if busy {
			t.Fatal("a result reported busy")
		}
		if err != nil {
			var te *TurnError
			if !errors.As(err, &te) || te.Kind != KindInvalidResult || !te.Accepted || te.Err == nil {
				t.Fatalf("refused with %T %+v, want an accepted TurnError of kind invalid_result", err, err)
			}
			return
		}
		if len(body) > abi.MaxResultBytes {
			t.Fatal("a result over abi.MaxResultBytes was accepted")
		}
		if err := res.Validate(); err != nil {
			t.Fatalf("an accepted result does not validate: %v", err)
		}
		if res.TurnRef != ref && !(withSteer && res.TurnRef == steered) {
			t.Fatalf("an accepted result echoes %+v", res.TurnRef)
		}
	})
}
