package fabric

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/fabric/guard"
	"github.com/paddock-dev/paddock/fabric/internal/workerkind"
	"github.com/paddock-dev/paddock/fabric/wire"
	"github.com/paddock-dev/paddock/fabric/worker"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// rawClient is a hand-driven DEALER: a rogue, or a worker written against
// the wire package alone (as one in another language would be).
type rawClient struct {
	t      testing.TB
	id     string
	sock   zmq4.Socket // nil for a client on a bare connection (rawConn)
	sendMu sync.Mutex  // rawConn: zmq4.Conn sends are not concurrent-safe
	sendFn func(zmq4.Msg) error
	frames chan []byte
	rx     atomic.Uint64 // bytes of every frame received (flow-control acks)
	inc    wire.ID
	sess   *wire.Session
	sent   [][]byte // every frame sent, for replays
	gate   *gate    // closed: the client stops receiving
	// stopOn, if set, closes gate once a frame of this kind was received.
	stopOn atomic.Int32
	// welcome is the WELCOME of the last join.
	welcome wire.Welcome
}

func (e *env) raw(id string) *rawClient {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sock := zmq4.NewDealer(ctx, zmq4.WithID(zmq4.SocketIdentity(id)), zmq4.WithTimeout(30*time.Second))
	if err := sock.Dial(e.connect()); err != nil {
		e.t.Fatal(err)
	}
	r := &rawClient{t: e.t, id: id, sock: sock, sendFn: sock.Send, frames: make(chan []byte, 1024), gate: newGate()}
	go r.recvLoop(sock.Recv)
	e.t.Cleanup(func() { r.gate.release(); cancel(); sock.Close() })
	return r
}

// rawConn is a raw client on one bare TCP connection with a small receive
// buffer: when it stops reading, nothing (no zmq4 reader goroutine, no
// channel) drains the kernel buffers, so the host's writes to it block.
func (e *env) rawConn(id string) (*rawClient, net.Conn) {
	e.t.Helper()
	nc, err := net.Dial("tcp", e.addr())
	if err != nil {
		e.t.Fatal(err)
	}
	_ = nc.(*net.TCPConn).SetReadBuffer(4 << 10)
	zc, err := zmq4.Open(nc, null.Security(), zmq4.Dealer, zmq4.SocketIdentity(id), false, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	r := &rawClient{t: e.t, id: id, frames: make(chan []byte, 1024), gate: newGate()}
	r.sendFn = func(m zmq4.Msg) error {
		r.sendMu.Lock()
		defer r.sendMu.Unlock()
		return zc.SendMsg(m)
	}
	go r.recvLoop(zc.RecvMsg)
	e.t.Cleanup(func() { r.gate.release(); nc.Close() })
	return r, nc
}

func (r *rawClient) recvLoop(recv func() (zmq4.Msg, error)) {
	for {
		r.gate.wait()
		m, err := recv()
		if err != nil {
			return
		}
		if len(m.Frames) == 1 {
			r.rx.Add(uint64(len(m.Frames[0])))
			if k := r.stopOn.Load(); k != 0 && len(m.Frames[0]) > 1 && int32(m.Frames[0][1]) == k {
				r.gate.close()
			}
			select {
			case r.frames <- m.Frames[0]:
			default: // keep reading: a rogue that stops reading is another test
			}
		}
	}
}

func (r *rawClient) send(frame []byte) {
	r.t.Helper()
	r.sent = append(r.sent, frame)
	if err := r.sendFn(zmq4.NewMsg(frame)); err != nil {
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
		Kinds: []string{workerkind.Wasm}, Capacity: capacity})
	return s.Seal(wire.ToHost, wire.KindHello, 1, body), inc
}

// join performs HELLO → WELCOME → HEARTBEAT with key, as a real worker.
func (r *rawClient) join(key []byte, pool string) {
	r.t.Helper()
	r.joinCap(key, pool, 1)
}

// joinCap is join announcing capacity.
func (r *rawClient) joinCap(key []byte, pool string, capacity int) {
	r.t.Helper()
	f, inc := r.hello(key, pool, capacity)
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
			_, body, err := s.Open(wire.ToWorker, f)
			if err != nil {
				r.t.Fatalf("WELCOME does not authenticate: %v", err)
			}
			if err := json.Unmarshal(body, &r.welcome); err != nil {
				r.t.Fatalf("WELCOME does not decode: %v", err)
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
// timeouts. TestGuardedBadInputIsDroppedAndCounted (guarded_test.go) runs
// the same rogues against a broker bound through the guard transport.
func TestBadInputIsDroppedAndCounted(t *testing.T) { badInput(t, newEnv(t)) }

func badInput(t *testing.T, e *env) {
	digest := e.module(wasmtest.Faulty)
	e.startWorker("w1", func(c *worker.Config) { c.Pools = []string{"h"} })
	e.startWorker("w6") // pool "p": the victim of the forged RESULT
	e.mustReply("h", digest, e.request("", "warm"))
	e.mustReply("p", digest, e.request("", "warm"))
	transport := "tcp://"
	var g0 guard.Stats
	if e.guarded {
		transport = "gtcp:// (guard)"
		g0 = e.tguard().Stats()
	}
	stop := make(chan struct{})
	slowest := e.healthy(digest, stop)
	defer func() {
		close(stop)
		s := slowest()
		figure(t, "fabric (%s): slowest healthy turn while rogues sent no-key, forged, replayed, unknown-version, 100 MB and flood frames: %s (accept timeout %s)",
			transport, s.Round(time.Millisecond), testAccept)
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
		// w6 runs a turn; meanwhile (a) a keyless rogue squatting w6's
		// identity sends a RESULT under w6's live session header, and (b)
		// an authenticated worker w3 sends a RESULT echoing w6's turn_ref
		// and delivery id. Neither completes w6's turn: (a) is forged,
		// (b) goes to LateResult, for the fences to reject.
		//
		// On the production guard (DuplicateDistinct) the rogue gets a
		// connection of its own and w6 keeps its session: the turn
		// completes with w6's own reply. On guard.Default()
		// (DuplicateHandover) the rogue's connection takes the identity
		// and closes w6's: w6 reconnects at once under a new incarnation,
		// so its turn may fail as worker_lost (an attempt, retried) — but
		// never with the forged content.
		before := drops()
		handover := e.guarded && e.tguard().Options().DuplicateIdentity == guard.DuplicateHandover
		var hb0 uint64
		if e.guarded {
			hb0 = e.tguard().Stats().HandedOver
		}
		inc0 := e.incarnation("w6")
		req := e.request("", "sleep 800")
		type outcome struct {
			res *abi.TurnResult
			err error
		}
		out := make(chan outcome, 1)
		busy := e.inflight("w6")
		go func() {
			res, err := e.turnIn("p", digest, req)
			out <- outcome{res, err}
		}()
		e.waitFor("turn running on w6", 10*time.Second, func() bool { return e.inflight("w6") > busy })
		b := e.b
		b.mu.Lock()
		live := b.peers["w6"].cur.key
		b.mu.Unlock()
		forged, _ := json.Marshal(abi.TurnResult{TurnRef: req.TurnRef, Outcome: abi.OutcomeOK,
			Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "forged"}}})
		env, _ := json.Marshal(wire.Result{DeliveryID: req.TurnRef.DeliveryID, TurnRef: req.TurnRef, Result: forged})
		fake, _ := wire.NewSession(wire.NewKey(), "w6", live.incarnation, live.session)
		rogue := e.raw("w6")
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
		o := <-out
		if o.err == nil {
			if len(o.res.Messages) == 1 && o.res.Messages[0].Content == "forged" {
				t.Fatal("w6's turn completed with the forged result")
			}
		} else if te := turnError(t, o.err); !handover || te.Kind != KindWorkerLost {
			t.Fatalf("w6's turn: %v", o.err)
		}
		if e.guarded && !handover {
			if inc := e.incarnation("w6"); inc != inc0 {
				t.Fatalf("w6's incarnation changed from %s to %q: the rogue displaced it", inc0, inc)
			}
			if n := e.tguard().Stats().HandedOver - hb0; n != 0 {
				t.Fatalf("HandedOver +%d under DuplicateDistinct", n)
			}
			figure(t, "fabric (gtcp://, DuplicateDistinct): a keyless client claiming w6's identity got a connection of its own; w6 kept its session and its turn completed with its own reply; the forged RESULT was dropped as forged")
		}
		if handover {
			e.waitFor("w6 back under a new incarnation", 15*time.Second, func() bool {
				inc := e.incarnation("w6")
				return inc != "" && inc != inc0
			})
			figure(t, "fabric (gtcp://): a keyless client squatting w6's identity took its connection (handover, +%d HandedOver); w6's turn ended with %v; w6 rejoined under a new incarnation; the forged RESULT was dropped as forged",
				e.tguard().Stats().HandedOver-hb0, o.err)
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
		if e.guarded {
			hugeFrameDeclaration(t, e)
			return
		}
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
		r := e.raw("w2")
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
	if e.guarded {
		g := e.tguard().Stats()
		figure(t, "fabric (gtcp://): broker drops %+v; guard cut %d oversized frame(s), handed over %d connection(s), %d write timeout(s)",
			d, g.OversizedFrames-g0.OversizedFrames, g.HandedOver-g0.HandedOver, g.WriteTimeouts-g0.WriteTimeouts)
	}
	if e.incarnation("w1") == "" {
		t.Fatal("the healthy worker was lost")
	}
}
