package fabric

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"

	"github.com/paddock-dev/paddock/fabric/guard"
	"github.com/paddock-dev/paddock/fabric/wire"
	"github.com/paddock-dev/paddock/fabric/worker"
	"github.com/paddock-dev/paddock/wasm"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// The adversarial tests again, with the broker bound as in production
// (cmd/paddock startBroker): through the guard transport with default
// options (WriteTimeout 5 s, MaxFrameSize 8 MiB) and DuplicateDistinct,
// the broker cutting connections through it; workers and rogues dial
// plain tcp://.

// The rogues of TestBadInputIsDroppedAndCounted over the guard: no
// credentials, wrong key, a forged RESULT with another session's
// turn_ref, replays, an unknown version, a flood of HELLOs, and a 100 MB
// frame declaration (cut by the guard before anything is allocated).
func TestGuardedBadInputIsDroppedAndCounted(t *testing.T) { badInput(t, newEnv(t, withGuard)) }

// hugeFrameDeclaration: a client completes the ZMTP handshake and sends
// the 9-byte header of a 100 MB frame and 64 KiB of it. On plain tcp://
// zmq4 allocates the 100 MB as announced (guard's
// TestPlainTCPOversizedFrameAllocates); the guard cuts the connection at
// the header, so the broker never sees the message.
func hugeFrameDeclaration(t *testing.T, e *env) {
	g0, d0 := e.tguard().Stats(), e.b.Stats().Dropped
	nc, err := net.Dial("tcp", e.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := zmq4.Open(nc, null.Security(), zmq4.Dealer, zmq4.SocketIdentity("rogue-big"), false, nil); err != nil {
		t.Fatal(err)
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	alloc0 := ms.TotalAlloc
	msg := make([]byte, 9+64<<10)
	msg[0] = 0x02 // long frame, last
	binary.BigEndian.PutUint64(msg[1:9], 100<<20)
	msg[9] = wire.Version
	start := time.Now()
	_, _ = nc.Write(msg) // may fail: the guard can cut before all of it is written
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = io.Copy(io.Discard, nc)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the connection that declared a 100 MB frame is still open after 10 s")
	}
	cut := time.Since(start)
	runtime.ReadMemStats(&ms)
	alloc := ms.TotalAlloc - alloc0
	e.waitFor("guard counted the oversized frame", 5*time.Second, func() bool {
		return e.tguard().Stats().OversizedFrames > g0.OversizedFrames
	})
	if d := e.b.Stats().Dropped; d.Oversized != d0.Oversized {
		t.Fatalf("the broker saw the oversized message (%d drops): the guard did not refuse it first", d.Oversized-d0.Oversized)
	}
	// Generous: other goroutines (the healthy worker's turns, -race)
	// allocate meanwhile; the point is that 100 MB were not.
	if alloc > 48<<20 {
		t.Fatalf("%d MiB allocated while a 100 MB frame was declared", alloc>>20)
	}
	figure(t, "fabric (gtcp://): a 100 MB frame declaration was cut by the guard %s after its header was sent (OversizedFrames +1, the broker never saw it); process TotalAlloc meanwhile %.1f MiB (healthy turns running)",
		cut.Round(time.Millisecond), float64(alloc)/(1<<20))
}

// The identity squatter of TestGapIdentitySquatterStallsPlainTCP, over the
// guard: a client with no credentials connects with live worker w1's
// identity (a 4 KiB receive buffer, never reads) while 1 MiB turns are
// sent to w1, three times in a row. The guard's DuplicateHandover gives
// the identity to the newest connection and closes the older one, so
// there is never a fan-out to a connection that does not read: w1 sees
// its connection close, reconnects at once and takes its identity back
// (closing the squatter). w1's turns in flight fail (attempts, retried);
// the other worker's turns keep completing throughout, and no socket
// send stalls.
func TestGuardedIdentitySquatterIsHandedOver(t *testing.T) {
	e := newEnv(t, withHandoverGuard)
	digest := e.module(wasmtest.Faulty)
	e.startWorker("w1", func(c *worker.Config) { c.Capacity = 8 })
	e.startWorker("w2", func(c *worker.Config) { c.Pools = []string{"h"} })
	e.mustReply("p", digest, e.request("", "warm"))
	e.mustReply("h", digest, e.request("", "warm"))
	g := e.tguard()
	g0, s0 := g.Stats(), e.b.Stats()

	stop := make(chan struct{})
	slowest := e.healthy(digest, stop)
	load := e.bigTurns(digest)
	e.waitFor("1 MiB turns in flight on w1", 10*time.Second, func() bool { return e.inflight("w1") >= 2 })
	ok0 := load.ok.Load()

	const rounds = 3
	var held time.Duration
	for round := range rounds {
		hb, inc := g.Stats().HandedOver, e.incarnation("w1")
		nc, err := net.Dial("tcp", e.addr())
		if err != nil {
			t.Fatal(err)
		}
		_ = nc.(*net.TCPConn).SetReadBuffer(4 << 10)
		if _, err := zmq4.Open(nc, null.Security(), zmq4.Dealer, zmq4.SocketIdentity("w1"), false, nil); err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		e.waitFor("w1 took its identity back", 20*time.Second, func() bool {
			cur := e.incarnation("w1")
			return g.Stats().HandedOver >= hb+2 && cur != "" && cur != inc
		})
		held = max(held, time.Since(t0))
		// The guard closed the squatter's connection.
		_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = io.Copy(io.Discard, nc)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("round %d: the squatter's connection is still open", round)
		}
		nc.Close()
	}
	load.stop()
	close(stop)
	sl := slowest()
	e.mustReply("p", digest, e.request("", "after the squatter"))

	g1, s1 := g.Stats(), e.b.Stats()
	figure(t, "fabric (gtcp://, DuplicateHandover): identity squatter ×%d: each time w1 lost its connection and took its identity back within %s (HandedOver +%d); w1's 1 MiB turns meanwhile: %d ok, %d failed (attempts or not sent); SendStalls +%d, guard WriteTimeouts +%d; slowest healthy turn on w2 %s (plain tcp://: the whole socket stalls)",
		rounds, held.Round(time.Millisecond), g1.HandedOver-g0.HandedOver, load.ok.Load()-ok0, load.fails.Load(),
		s1.SendStalls-s0.SendStalls, g1.WriteTimeouts-g0.WriteTimeouts, sl.Round(time.Millisecond))
	if g1.HandedOver-g0.HandedOver < 2*rounds {
		t.Fatalf("HandedOver +%d, want ≥ %d", g1.HandedOver-g0.HandedOver, 2*rounds)
	}
	if bound := g.Options().WriteTimeout + testSend; sl > bound {
		t.Fatalf("a healthy turn took %s (bound: guard write timeout + send timeout = %s)", sl, bound)
	}
}

// A worker that authenticates, acknowledges what it read, and stops
// reading (kernel level: a bare connection with a 4 KiB receive buffer)
// as soon as it received its first 1 MiB TURN, while 8 × 1 MiB turns are
// sent to it. The flow-control window lets at most one more 1 MiB TURN
// (plus PINGs) reach the socket; the broker cuts the worker off within
// the heartbeat timeout; a write blocked on it is cut by the guard's
// WriteTimeout at the latest. The healthy worker's turns keep completing.
func TestGuardedSlowReaderIsCutOff(t *testing.T) {
	e := newEnv(t, withGuard)
	digest := e.module(wasmtest.Faulty)
	e.startWorker("w1", func(c *worker.Config) { c.Pools = []string{"h"} })
	e.mustReply("h", digest, e.request("", "warm"))
	g := e.tguard()
	g0, s0 := g.Stats(), e.b.Stats()

	slow, _ := e.rawConn("w3")
	slow.join(e.keys["w3"], "slow")
	e.waitFor("w3 admitted", 5*time.Second, func() bool { return e.incarnation("w3") != "" })
	slow.stopOn.Store(int32(wire.KindTurn))
	hbStop := make(chan struct{})
	var hbWG sync.WaitGroup
	hbWG.Go(func() { slow.keepAlive(hbStop) })
	defer func() { close(hbStop); hbWG.Wait() }()

	stop := make(chan struct{})
	slowest := e.healthy(digest, stop)
	big := strings.Repeat("x", 1<<20)
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			_, err := e.turnIn("slow", digest, e.request("", big))
			errs <- err
		})
	}
	e.waitFor("w3 cut off", testHBTimeout+lossSlack, func() bool { return e.incarnation("w3") == "" })
	cutAfter := time.Since(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err == nil {
			t.Fatal("a turn to the slow worker succeeded")
		}
		if turnError(t, err).TurnSent() {
			t.Fatalf("a turn to the slow worker counts as accepted: %v", err)
		}
	}
	// Whatever the kernel buffered for it, its connection must not pin
	// the send lock: any write blocked on it ends by WriteTimeout.
	e.waitFor("no socket send in progress on the slow worker", g.Options().WriteTimeout+lossSlack, func() bool {
		return !e.b.Stats().Stalled
	})
	close(stop)
	sl := slowest()
	g1, s1 := g.Stats(), e.b.Stats()
	open := 0
	for _, id := range g.Peers() {
		if id == "w3" {
			open++
		}
	}
	figure(t, "fabric (gtcp://): worker reading through a 4 KiB rcvbuf, stopping at its first TURN, sent 8 × 1 MiB turns: it read %d bytes; cut off after %s as %+v, no turn accepted; SendStalls +%d, guard WriteTimeouts +%d; its TCP connection still open afterwards: %v; slowest healthy turn %s",
		slow.rx.Load(), cutAfter.Round(time.Millisecond), lostDelta(s0.Lost, s1.Lost), s1.SendStalls-s0.SendStalls,
		g1.WriteTimeouts-g0.WriteTimeouts, open > 0, sl.Round(time.Millisecond))
	if l := lostDelta(s0.Lost, s1.Lost); l.NotReading+l.PingTimeout+l.SendStalled == 0 {
		t.Fatalf("the slow reader was not cut off for not reading: %+v", l)
	}
	if bound := g.Options().WriteTimeout + testSend; sl > bound {
		t.Fatalf("a healthy turn took %s (bound %s)", sl, bound)
	}
}

// keepAlive is a well-behaved worker's upkeep until stop: a HEARTBEAT
// every testHB, and a PONG for every PING received, both acknowledging
// every byte received so far — until the client stops reading, after
// which its acknowledgements stop growing.
func (r *rawClient) keepAlive(stop <-chan struct{}) {
	seal := func(kind wire.Kind, body any) {
		b, _ := json.Marshal(body)
		_ = r.sendFn(zmq4.NewMsg(r.sess.Seal(wire.ToHost, kind, r.sess.NextSeq(), b)))
	}
	tick := time.NewTicker(testHB)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
			seal(wire.KindHeartbeat, wire.Heartbeat{Free: 1, RxBytes: r.rx.Load()})
		case f := <-r.frames:
			if h, err := wire.ParseHeader(f); err != nil || h.Kind != wire.KindPing {
				continue
			}
			_, body, err := r.sess.Open(wire.ToWorker, f)
			var p wire.Ping
			if err != nil || json.Unmarshal(body, &p) != nil {
				continue
			}
			seal(wire.KindPong, wire.Pong{Nonce: p.Nonce, RxBytes: r.rx.Load()})
		}
	}
}

func lostDelta(a, b LostCounts) LostCounts {
	return LostCounts{
		HeartbeatTimeout: b.HeartbeatTimeout - a.HeartbeatTimeout, PingTimeout: b.PingTimeout - a.PingTimeout,
		NotReading: b.NotReading - a.NotReading, Goodbye: b.Goodbye - a.Goodbye, Superseded: b.Superseded - a.Superseded,
		SendStalled: b.SendStalled - a.SendStalled, Rejected: b.Rejected - a.Rejected,
	}
}

// THE REMAINING GAP over the guard: a worker with valid credentials (a
// compromised or broken one) that stops reading but keeps acknowledging
// bytes it never read (rx_bytes is the worker's word), so the
// flow-control window never closes. Sent 8 × 1 MiB turns, the host's
// writes fill its kernel buffers and the next write blocks while holding
// zmq4's socket-wide send lock. The guard's WriteTimeout W cuts that
// connection and frees the lock. Until then nothing can be sent to
// anyone:
//
//   - W = 5 s (guard.Register() defaults), no Disconnect hook: W is
//     longer than the broker's send timeout and the heartbeat timeout:
//     the broker's watchdog fires, turns fail fast (not sent, no attempt
//     lost), the healthy worker hears no PING for W, drops its session
//     and rejoins; healthy turns run again within W + heartbeat timeout.
//   - W = 1 s (below both): the stall ends before the watchdog fires;
//     healthy turns are merely delayed by up to W and none fails.
//   - As in production (cmd/paddock tunes W below the heartbeat margin,
//     and wires BrokerConfig.Disconnect): here W = 5 s, but the broker
//     cuts the connection when the PONG is missed, within the heartbeat
//     timeout.
func TestGapLyingAckStallsUntilGuardWriteTimeout(t *testing.T) {
	for _, tc := range []struct {
		name  string
		tweak func(*BrokerConfig)
	}{
		{"guard W=5s without broker Disconnect", withHandoverGuard},
		{"guard W=1s", withShortGuard},
		{"production: guard W=5s with broker Disconnect", withGuard},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // separate guards and brokers: no shared counters
			lyingAck(t, newEnv(t, tc.tweak))
		})
	}
}

func lyingAck(t *testing.T, e *env) {
	g := e.tguard()
	w := g.Options().WriteTimeout
	digest := e.module(wasmtest.Faulty)
	e.startWorker("w1", func(c *worker.Config) { c.Pools = []string{"h"} })
	e.mustReply("h", digest, e.request("", "warm"))
	g0, s0 := g.Stats(), e.b.Stats()
	inc0 := e.incarnation("w1")

	liar, _ := e.rawConn("w3")
	liar.joinCap(e.keys["w3"], "slow", 8)
	e.waitFor("w3 admitted", 5*time.Second, func() bool { return e.incarnation("w3") != "" })
	liar.stopReading()
	lieStop := make(chan struct{})
	var lieWG sync.WaitGroup
	lieWG.Go(func() {
		for {
			select {
			case <-lieStop:
				return
			case <-time.After(testHB):
				b, _ := json.Marshal(wire.Heartbeat{Free: 8, RxBytes: 1 << 50})
				_ = liar.sendFn(zmq4.NewMsg(liar.sess.Seal(wire.ToHost, wire.KindHeartbeat, liar.sess.NextSeq(), b)))
			}
		}
	})
	defer func() { close(lieStop); lieWG.Wait() }()

	// The healthy worker's turns, failures tolerated and recorded.
	var (
		mu                   sync.Mutex
		lastOK               = time.Now()
		outage, slowest      time.Duration
		okN, failN, sentFail int
	)
	stop := make(chan struct{})
	var probe sync.WaitGroup
	probe.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			t0 := time.Now()
			_, err := e.turnIn("h", digest, e.request("", "ping"))
			d := time.Since(t0)
			mu.Lock()
			if err == nil {
				okN++
				slowest = max(slowest, d)
				outage = max(outage, time.Since(lastOK))
				lastOK = time.Now()
			} else {
				failN++
				var te *TurnError
				if !errors.As(err, &te) || te.TurnSent() {
					sentFail++
				}
			}
			mu.Unlock()
			time.Sleep(10 * time.Millisecond)
		}
	})

	big := strings.Repeat("x", 1<<20)
	start := time.Now()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { _, _ = e.turnIn("slow", digest, e.request("", big)) })
	}
	// The guard's write timeout cuts the stalled write, or — wired as in
	// production — the broker cuts the connection first when the worker
	// misses its PONG (BrokerConfig.Disconnect).
	e.waitFor("the stalled write cut", w+lossSlack, func() bool {
		gs := g.Stats()
		return gs.WriteTimeouts > g0.WriteTimeouts || gs.Disconnected > g0.Disconnected
	})
	cut := time.Since(start)
	wg.Wait()
	// Healthy turns run again: wait for two more successes.
	mu.Lock()
	ok1 := okN
	mu.Unlock()
	e.waitFor("healthy turns again", testHBTimeout+2*lossSlack, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return okN >= ok1+2
	})
	close(stop)
	probe.Wait()
	g1, s1 := g.Stats(), e.b.Stats()
	rejoined := e.incarnation("w1") != inc0
	figure(t, "fabric GAP (%s://, guard WriteTimeout %s; broker send timeout %s, heartbeat timeout %s): a keyed worker acknowledging unread bytes, sent 8 × 1 MiB turns, stalled the socket; it was cut %s after the turns began (guard WriteTimeouts +%d, broker Disconnects +%d, SendStalls +%d); healthy worker: longest gap between completed turns %s, %d turns failed (%d of them as sent), slowest completed %s, rejoined: %v",
		g.Scheme(), w, testSend, testHBTimeout, cut.Round(time.Millisecond), g1.WriteTimeouts-g0.WriteTimeouts, g1.Disconnected-g0.Disconnected, s1.SendStalls-s0.SendStalls,
		outage.Round(time.Millisecond), failN, sentFail, slowest.Round(time.Millisecond), rejoined)
	if sentFail > 0 {
		t.Fatalf("%d healthy turns failed after they reached the worker (an attempt lost)", sentFail)
	}
	if bound := w + testHBTimeout + 2*lossSlack; outage > bound {
		t.Fatalf("the healthy worker ran no turn for %s (bound %s)", outage, bound)
	}
	if w < testSend {
		// Below the send timeout: the stall ends before the watchdog
		// fires and the healthy worker never notices it.
		if failN > 0 || s1.SendStalls != s0.SendStalls || rejoined {
			t.Fatalf("with WriteTimeout %s < send timeout %s: %d healthy turns failed, SendStalls +%d, rejoined %v",
				w, testSend, failN, s1.SendStalls-s0.SendStalls, rejoined)
		}
		if bound := w + testSend; slowest > bound {
			t.Fatalf("a healthy turn took %s (bound %s)", slowest, bound)
		}
	}
}

// The identity squatter again, on the production guard (DuplicateDistinct):
// three keyless clients connect as live worker w1 (4 KiB receive buffers,
// never reading), and a real worker process loop with w1's id but a wrong
// key keeps trying to join, while 1 MiB turns run on w1. Each newcomer
// gets a connection of its own and never receives w1's traffic, so w1
// keeps its session, none of its turns fails, and nothing is handed over
// or stalls. (On guard.Default(), TestGuardedIdentitySquatterIsHandedOver:
// each squatter costs w1 its connection.)
func TestGuardedIdentitySquatterCannotDisplaceTheWorker(t *testing.T) {
	e := newEnv(t, withGuard)
	if e.tguard().Options().DuplicateIdentity != guard.DuplicateDistinct {
		t.Fatal("withGuard is not the production guard (DuplicateDistinct)")
	}
	digest := e.module(wasmtest.Faulty)
	e.startWorker("w1", func(c *worker.Config) { c.Capacity = 8 })
	e.mustReply("p", digest, e.request("", "warm"))
	g := e.tguard()
	g0, s0 := g.Stats(), e.b.Stats()
	inc := e.incarnation("w1")

	load := e.bigTurns(digest)
	e.waitFor("1 MiB turns in flight on w1", 10*time.Second, func() bool { return e.inflight("w1") >= 2 })

	// A misconfigured copy of w1: right id, wrong key.
	impostorCtx, stopImpostor := context.WithCancel(context.Background())
	impostorDone := make(chan error, 1)
	go func() {
		impostorDone <- worker.Run(impostorCtx, worker.Config{
			Connect: e.connect(), ID: "w1", Key: wire.NewKey(), Pools: []string{"p"}, Capacity: 1,
			CacheDir: t.TempDir(), Wasm: wasm.Config{CacheDir: wasmtest.CacheDir(t), TurnTimeout: turnDeadline},
			ReconnectMin: 20 * time.Millisecond, ReconnectMax: 100 * time.Millisecond,
		}, testLogger(t).With("side", "impostor"))
	}()
	var squatters []net.Conn
	for range 3 {
		nc, err := net.Dial("tcp", e.addr())
		if err != nil {
			t.Fatal(err)
		}
		_ = nc.(*net.TCPConn).SetReadBuffer(4 << 10)
		if _, err := zmq4.Open(nc, null.Security(), zmq4.Dealer, zmq4.SocketIdentity("w1"), false, nil); err != nil {
			t.Fatal(err)
		}
		squatters = append(squatters, nc)
		time.Sleep(300 * time.Millisecond)
	}
	e.waitFor("the impostor's HELLOs dropped as forged", 10*time.Second, func() bool {
		return e.b.Stats().Dropped.Forged > s0.Dropped.Forged
	})
	ok0 := load.ok.Load()
	e.waitFor("more turns completing on w1 meanwhile", 30*time.Second, func() bool { return load.ok.Load() >= ok0+4 })
	load.stop()
	stopImpostor()
	select {
	case <-impostorDone:
	case <-time.After(10 * time.Second):
		t.Fatal("the wrong-key worker did not stop within 10 s of its context ending")
	}
	for _, nc := range squatters {
		nc.Close()
	}

	g1, s1 := g.Stats(), e.b.Stats()
	figure(t, "fabric (gtcp://, DuplicateDistinct): 3 keyless squatters and a wrong-key worker claimed w1's id while 1 MiB turns ran on it: w1 kept incarnation %t, its turns %d ok, %d failed; HandedOver +%d, forged HELLOs dropped +%d, SendStalls +%d, guard WriteTimeouts +%d",
		e.incarnation("w1") == inc, load.ok.Load(), load.fails.Load(), g1.HandedOver-g0.HandedOver,
		s1.Dropped.Forged-s0.Dropped.Forged, s1.SendStalls-s0.SendStalls, g1.WriteTimeouts-g0.WriteTimeouts)
	if cur := e.incarnation("w1"); cur != inc {
		t.Fatalf("w1's incarnation changed from %s to %q: a newcomer displaced it", inc, cur)
	}
	if n := load.fails.Load(); n != 0 {
		t.Fatalf("%d of w1's turns failed (first: %v); want none", n, load.firstErr.Load())
	}
	if g1.HandedOver != g0.HandedOver || s1.SendStalls != s0.SendStalls || g1.WriteTimeouts != g0.WriteTimeouts {
		t.Fatalf("handovers +%d, send stalls +%d, write timeouts +%d; want none",
			g1.HandedOver-g0.HandedOver, s1.SendStalls-s0.SendStalls, g1.WriteTimeouts-g0.WriteTimeouts)
	}
}

// turnLoad is a stream of 1 MiB turns on pool "p" (bigTurns).
type turnLoad struct {
	ok, fails atomic.Int64
	firstErr  atomic.Value // string: the first failure
	stop      func()       // ends the stream and waits for it
}

// bigTurns runs "nap 50" turns carrying 1 MiB on pool "p" from 4
// goroutines until stop is called, counting what completes and fails.
func (e *env) bigTurns(digest string) *turnLoad {
	l := &turnLoad{}
	big := strings.Repeat("x", 1<<20)
	var wg sync.WaitGroup
	sending := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-sending:
					return
				default:
				}
				if _, err := e.turnIn("p", digest, e.request("", "nap 50 "+big)); err != nil {
					l.fails.Add(1)
					l.firstErr.CompareAndSwap(nil, err.Error())
					time.Sleep(20 * time.Millisecond)
				} else {
					l.ok.Add(1)
				}
			}
		})
	}
	l.stop = func() { close(sending); wg.Wait() }
	return l
}
