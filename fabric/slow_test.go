package fabric

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"

	"github.com/paddock-dev/paddock/fabric/wire"
	"github.com/paddock-dev/paddock/fabric/worker"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// An authenticated worker that stops reading (but keeps heartbeating)
// gets big turns: the flow-control window keeps the host from writing
// more than one message it did not acknowledge, so the socket never
// blocks; the worker is cut off within the heartbeat timeout (its window
// stays full, its PING unanswered), its turns fail as not sent, and the
// healthy worker's turns run at their usual pace throughout.
func TestSlowReaderIsCutOffWithoutStallingOthers(t *testing.T) {
	e := newEnv(t)
	digest := e.module(wasmtest.Faulty)
	e.startWorker("w1", func(c *worker.Config) { c.Pools = []string{"h"} })
	e.mustReply("h", digest, e.request("", "warm"))

	slow := e.raw("w3")
	slow.join(e.keys["w3"], "slow")
	e.waitFor("w3 admitted", 5*time.Second, func() bool { return e.incarnation("w3") != "" })
	slow.stopReading()
	hbStop := make(chan struct{})
	go func() { // alive, but reading nothing
		for {
			select {
			case <-hbStop:
				return
			case <-time.After(testHB):
				slow.msgQuiet(t)
			}
		}
	}()
	defer close(hbStop)

	stop := make(chan struct{})
	slowest := e.healthy(digest, stop)
	big := strings.Repeat("x", 1<<20)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			_, err := e.turnIn("slow", digest, e.request("", big))
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if te := turnError(t, err); te.TurnSent() {
			t.Fatalf("a turn to the slow worker counts as sent: %v", err)
		}
	}
	e.waitFor("w3 cut off", 5*time.Second, func() bool { return e.incarnation("w3") == "" })
	close(stop)
	s := e.b.Stats()
	if s.SendStalls != 0 {
		t.Fatalf("socket sends stalled %d times", s.SendStalls)
	}
	if s.Lost.NotReading+s.Lost.PingTimeout == 0 {
		t.Fatalf("the slow reader was not cut off for not reading: %+v", s.Lost)
	}
	sl := slowest()
	figure(t, "fabric: slowest healthy turn while another worker stopped reading and was sent 8 × 1 MiB turns: %s (no socket stall; cut off as %+v)",
		sl.Round(time.Millisecond), s.Lost)
	if sl > testAccept {
		t.Fatalf("a healthy turn took %s", sl)
	}
}

// stopReading makes the raw client stop receiving (zmq4 still buffers ten
// messages, then the kernel buffers fill).
func (r *rawClient) stopReading() { r.gate.close() }

// msgQuiet sends a heartbeat acknowledging nothing, ignoring errors.
func (r *rawClient) msgQuiet(*testing.T) {
	f := r.sess.Seal(wire.ToHost, wire.KindHeartbeat, r.sess.NextSeq(), []byte(`{"free":1,"running":0,"rx_bytes":0}`))
	_ = r.sendFn(zmq4.NewMsg(f))
}

// THE REMAINING GAP on plain tcp:// (closed by the guard transport): a
// client with no credentials connects with a live worker's identity and
// never reads. zmq4's ROUTER sends every message for that identity to both
// connections, under one socket-wide lock; once the squatter's kernel
// buffers are full the write blocks, and every send to every worker waits
// behind it. The broker detects it after SendTimeout: the worker is marked
// lost (send_stalled), turns fail fast as not sent (nothing is delayed
// past its timeouts, but nothing can be sent either) — until the stuck
// connection breaks. Received results still flow. This test pins the
// behaviour on plain tcp://; over the guard transport (production) the
// squatter's connection takes the identity over instead of sharing it, so
// there is no fan-out and no stall: TestGuardedIdentitySquatterIsHandedOver.
func TestGapIdentitySquatterStallsPlainTCP(t *testing.T) {
	e := newEnv(t)
	digest := e.module(wasmtest.Faulty)
	e.startWorker("w1", func(c *worker.Config) { c.Capacity = 8 })
	e.startWorker("w2", func(c *worker.Config) { c.Pools = []string{"h"} })
	e.mustReply("p", digest, e.request("", "warm"))
	e.mustReply("h", digest, e.request("", "warm"))

	// The squatter: a raw ZMTP handshake as DEALER "w1", then silence.
	nc, err := net.Dial("tcp", e.addr())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zmq4.Open(nc, null.Security(), zmq4.Dealer, zmq4.SocketIdentity("w1"), false, nil); err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	time.Sleep(100 * time.Millisecond) // let the ROUTER add the connection

	// Turns with 1 MiB requests for w1: each TURN also goes to the
	// squatter, until its buffers are full.
	big := strings.Repeat("x", 1<<20)
	var wg sync.WaitGroup
	sending := make(chan struct{})
	for range 4 { // keep TURNs coming until the squatter's buffers are full
		wg.Go(func() {
			for {
				select {
				case <-sending:
					return
				default:
				}
				_, _ = e.turnIn("p", digest, e.request("", "nap 50 "+big))
			}
		})
	}
	start := time.Now()
	e.waitFor("send stall detected", 30*time.Second, func() bool { return e.b.Stats().SendStalls > 0 })
	detected := time.Since(start)
	close(sending)

	// While stalled: a turn for the other worker fails fast, not sent.
	t0 := time.Now()
	_, err = e.turnIn("h", digest, e.request("", "during stall"))
	failFast := time.Since(t0)
	te := turnError(t, err)
	if te.TurnSent() || !errors.Is(err, ErrSendStalled) && te.Kind != KindNoWorker && te.Kind != KindSendFailed {
		t.Fatalf("turn during the stall: %v", err)
	}
	if failFast > testAccept+testSend {
		t.Fatalf("turn during the stall took %s to fail", failFast)
	}

	// The stall lasts until the squatter's connection breaks.
	stalledFor := time.Since(start)
	nc.Close()
	t1 := time.Now()
	e.waitFor("socket unstuck", 10*time.Second, func() bool { return !e.b.Stats().Stalled })
	wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for ctx.Err() == nil { // the workers rejoin (they saw no PING during the stall)
		if _, err := e.turnIn("h", digest, e.request("", "after")); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if ctx.Err() != nil {
		t.Fatal("turns did not recover after the squatter left")
	}
	figure(t, "fabric GAP (plain tcp://): identity squatter stalled the ROUTER; detected %s after the sends began (send timeout %s), turns failed fast (%s, not sent), stall lasted %s+ until the squatter's connection closed; recovery %s",
		detected.Round(time.Millisecond), testSend, failFast.Round(time.Millisecond), stalledFor.Round(time.Millisecond), time.Since(t1).Round(time.Millisecond))
}
