package fabric

import (
	"bytes"
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/fabric/wire"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// rawClient is a hand-driven DEALER: a rogue, or a worker written against
// the wire package alone (as one in another language would be).
type rawClient struct {
	t      *testing.T
	id     string
	sock   zmq4.Socket
	frames chan []byte
	inc    wire.ID
	sess   *wire.Session
	sent   [][]byte // every frame sent, for replays
	gate   *gate    // closed: the client stops receiving
}

func (e *env) raw(id string) *rawClient {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sock := zmq4.NewDealer(ctx, zmq4.WithID(zmq4.SocketIdentity(id)), zmq4.WithTimeout(5*time.Second))
	if err := sock.Dial(e.b.Endpoint()); err != nil {
		e.t.Fatal(err)
	}
	r := &rawClient{t: e.t, id: id, sock: sock, frames: make(chan []byte, 1024), gate: newGate()}
	go func() {
		for {
			r.gate.wait()
			m, err := sock.Recv()
			if err != nil {
				return
			}
			if len(m.Frames) == 1 {
				select {
				case r.frames <- m.Frames[0]:
				default: // keep reading: a rogue that stops reading is another test
				}
			}
		}
	}()
	e.t.Cleanup(func() { r.gate.release(); cancel(); sock.Close() })
	return r
}

func (r *rawClient) send(frame []byte) {
	r.t.Helper()
	r.sent = append(r.sent, frame)
	if err := r.sock.Send(zmq4.NewMsg(frame)); err != nil {
		r.t.Fatal(err)
	}
}

// hello seals a HELLO for a fresh incarnation under key.
func (r *rawClient) hello(key []byte, pool string, capacity int) ([]byte, wire.ID) {
	inc := wire.NewID()
	s, err := wire.NewSession(key, r.id, inc, wire.ID{})
	if err != nil {
		r.t.Fatal(err)
	}
	body, _ := json.Marshal(wire.Hello{TimeMs: time.Now().UnixMilli(), ABIVersion: abi.Version, Pools: []string{pool},
		Kinds: []string{KindWasm}, Capacity: capacity})
	return s.Seal(wire.ToHost, wire.KindHello, 1, body), inc
}

// join performs HELLO → WELCOME → HEARTBEAT with key, as a real worker.
func (r *rawClient) join(key []byte, pool string) {
	r.t.Helper()
	f, inc := r.hello(key, pool, 1)
	r.send(f)
	r.inc = inc
	deadline := time.After(5 * time.Second)
	for r.sess == nil {
		select {
		case f := <-r.frames:
			h, err := wire.ParseHeader(f)
			if err != nil || h.Incarnation != inc || h.Kind != wire.KindWelcome {
				continue
			}
			s, _ := wire.NewSession(key, r.id, inc, h.Session)
			if _, _, err := s.Open(wire.ToWorker, f); err != nil {
				r.t.Fatalf("WELCOME does not authenticate: %v", err)
			}
			r.sess = s
		case <-deadline:
			r.t.Fatal("no WELCOME")
		}
	}
	r.msg(wire.KindHeartbeat, wire.Heartbeat{Free: 1})
}

// msg seals and sends a message on the joined session.
func (r *rawClient) msg(kind wire.Kind, body any) []byte {
	r.t.Helper()
	b, _ := json.Marshal(body)
	f := r.sess.Seal(wire.ToHost, kind, r.sess.NextSeq(), b)
	r.send(f)
	return f
}

// await returns the next authentic message of kind for r's incarnation.
func (r *rawClient) await(key []byte, kind wire.Kind, within time.Duration) []byte {
	r.t.Helper()
	deadline := time.After(within)
	for {
		select {
		case f := <-r.frames:
			h, err := wire.ParseHeader(f)
			if err != nil || h.Incarnation != r.inc || h.Kind != kind {
				continue
			}
			s, _ := wire.NewSession(key, r.id, r.inc, h.Session)
			if _, body, err := s.Open(wire.ToWorker, f); err == nil {
				return body
			}
		case <-deadline:
			r.t.Fatalf("no %s within %s", kind, within)
			return nil
		}
	}
}

// Bad input from rogue clients and misbehaving workers is dropped and
// counted, and never delays a healthy worker's turns beyond their
// timeouts.
func TestBadInputIsDroppedAndCounted(t *testing.T) {
	e := newEnv(t)
	digest := e.module(wasmtest.Faulty)
	e.startWorker("w1", func(c *WorkerConfig) { c.Pools = []string{"h", "p"} })
	e.mustReply("h", digest, e.request("", "warm"))
	stop := make(chan struct{})
	slowest := e.healthy(digest, stop)
	defer func() {
		close(stop)
		s := slowest()
		figure(t, "fabric: slowest healthy turn while rogues sent no-key, forged, replayed, unknown-version, 100 MB and flood frames: %s (accept timeout %s)",
			s.Round(time.Millisecond), testAccept)
		if s > testAccept {
			t.Errorf("a healthy turn took %s", s)
		}
	}()
	drops := func() Drops { return e.b.Stats().Dropped }
	expect := func(what string, get func(Drops) uint64, atLeast uint64, before Drops) {
		t.Helper()
		e.waitFor(what, 10*time.Second, func() bool { return get(drops())-get(before) >= atLeast })
	}

	t.Run("no credentials", func(t *testing.T) {
		before := drops()
		r := e.raw("rogue")
		f, _ := r.hello(wire.NewKey(), "p", 1)
		r.send(f)
		expect("unauthenticated drop", func(d Drops) uint64 { return d.Unauthenticated }, 1, before)
	})

	t.Run("wrong key", func(t *testing.T) {
		before := drops()
		r := e.raw("w2")
		f, _ := r.hello(wire.NewKey(), "p", 1)
		r.send(f)
		expect("forged drop", func(d Drops) uint64 { return d.Forged }, 1, before)
		if e.incarnation("w2") != "" {
			t.Fatal("w2 admitted with a wrong key")
		}
	})

	t.Run("forged result with another session's turn_ref", func(t *testing.T) {
		// w1 runs a turn; meanwhile (a) a keyless rogue squatting w1's
		// identity sends a RESULT under w1's live session header, and (b)
		// an authenticated worker w3 sends a RESULT echoing w1's turn_ref
		// and delivery id. Neither completes w1's turn: (a) is forged,
		// (b) goes to LateResult, for the fences to reject.
		out, req := e.runLong(digest, "w1", "sleep 800")
		before := drops()
		b := e.b
		b.mu.Lock()
		live := b.peers["w1"].cur.key
		b.mu.Unlock()
		forged, _ := json.Marshal(abi.TurnResult{TurnRef: req.TurnRef, Outcome: abi.OutcomeOK,
			Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "forged"}}})
		env, _ := json.Marshal(wire.Result{DeliveryID: req.TurnRef.DeliveryID, TurnRef: req.TurnRef, Result: forged})
		fake, _ := wire.NewSession(wire.NewKey(), "w1", live.incarnation, live.session)
		rogue := e.raw("w1")
		rogue.send(fake.Seal(wire.ToHost, wire.KindResult, 1<<40, env))
		expect("forged drop", func(d Drops) uint64 { return d.Forged }, 1, before)

		w3 := e.raw("w3")
		w3.join(e.keys["w3"], "other")
		w3.msg(wire.KindResult, wire.Result{DeliveryID: req.TurnRef.DeliveryID, TurnRef: req.TurnRef, Result: forged})
		select {
		case late := <-e.late:
			if late.TurnRef != req.TurnRef || late.Messages[0].Content != "forged" {
				t.Fatalf("late result %+v", late)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the authenticated worker's misdirected RESULT did not reach LateResult")
		}
		if err := <-out; err != nil {
			t.Fatalf("w1's turn: %v", err)
		}
	})

	t.Run("replayed frames", func(t *testing.T) {
		before := drops()
		r := e.raw("w4")
		r.join(e.keys["w4"], "other")
		hello, heartbeat := r.sent[0], r.sent[1]
		r.send(heartbeat)
		r.send(hello)
		expect("replay drops", func(d Drops) uint64 { return d.Replayed }, 2, before)
	})

	t.Run("unknown version", func(t *testing.T) {
		before := drops()
		r := e.raw("w5")
		r.join(e.keys["w5"], "other")
		e.waitFor("w5 admitted", 5*time.Second, func() bool { return e.incarnation("w5") != "" })
		f := r.msg(wire.KindHeartbeat, wire.Heartbeat{Free: 1})
		v2 := bytes.Clone(f)
		v2[0] = 2
		r.send(v2)
		body := r.await(e.keys["w5"], wire.KindReject, 5*time.Second)
		var rej wire.Reject
		_ = json.Unmarshal(body, &rej)
		if rej.Code != wire.RejectUnknownVersion || rej.GotVersion != 2 || len(rej.Versions) != 1 || rej.Versions[0] != wire.Version {
			t.Fatalf("reject %+v", rej)
		}
		rogue := e.raw("rogue-v")
		rogue.send(v2)
		expect("unknown version drops", func(d Drops) uint64 { return d.UnknownVersion }, 2, before)
	})

	t.Run("100 MB frame", func(t *testing.T) {
		before := drops()
		r := e.raw("rogue-big")
		big := make([]byte, 100<<20)
		big[0] = wire.Version
		start := time.Now()
		r.send(big)
		expect("oversized drop", func(d Drops) uint64 { return d.Oversized }, 1, before)
		t.Logf("100 MB frame dropped after %s (zmq4 allocates and reads it before the broker can refuse it)", time.Since(start))
	})

	t.Run("flood of hellos", func(t *testing.T) {
		before := drops()
		// Keyless: every HELLO fails authentication.
		r := e.raw("w6")
		var wg sync.WaitGroup
		wg.Go(func() {
			for range 2000 {
				f, _ := r.hello(wire.NewKey(), "p", 1)
				r.send(f)
			}
		})
		// With the key (a compromised or looping worker): past the burst,
		// HELLOs are dropped as flood.
		a := e.raw("w3")
		for range 200 {
			f, _ := a.hello(e.keys["w3"], "other", 1)
			a.send(f)
		}
		wg.Wait()
		expect("forged hellos", func(d Drops) uint64 { return d.Forged }, 2000, before)
		expect("flooded hellos", func(d Drops) uint64 { return d.Flood }, 150, before)
	})

	if t.Failed() {
		return
	}
	d := drops()
	t.Logf("drops: %+v", d)
	if e.incarnation("w1") == "" {
		t.Fatal("the healthy worker was lost")
	}
}
