package fabric

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/fabric/worker"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// runLong starts a long turn ("sleep <ms>" busy-waits) on pool p and
// returns a channel with its outcome once it is running on worker id.
func (e *env) runLong(binding, id, msg string) (<-chan error, *abi.TurnRequest) {
	e.t.Helper()
	req := e.request("", msg)
	out := make(chan error, 1)
	before, acceptedBefore := e.inflight(id), e.accepted(id)
	go func() {
		_, err := e.turn(binding, req)
		out <- err
	}()
	e.waitFor("turn dispatched to "+id, 10*time.Second, func() bool { return e.inflight(id) > before })
	// Dispatched is not yet accepted: a loss from here on must be of a turn
	// that reached the worker (TurnSent).
	e.waitFor("turn accepted by "+id, 10*time.Second, func() bool { return e.accepted(id) > acceptedBefore })
	return out, req
}

// healthy runs turns on worker w2's pool "h" until stop, failing the
// test if one fails or takes longer than the accept timeout; it returns
// the slowest turn.
func (e *env) healthy(binding string, stop <-chan struct{}) func() time.Duration {
	var (
		mu      sync.Mutex
		slowest time.Duration
		wg      sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			start := time.Now()
			res, err := e.turnIn("h", binding, e.request("", "ping"))
			d := time.Since(start)
			if err != nil || res.Outcome != abi.OutcomeOK {
				e.t.Errorf("healthy worker's turn failed after %s: %v", d, err)
				return
			}
			mu.Lock()
			slowest = max(slowest, d)
			mu.Unlock()
			time.Sleep(5 * time.Millisecond)
		}
	}()
	return func() time.Duration {
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return slowest
	}
}

// A worker whose connection drops without GOODBYE (an in-process kill -9:
// the socket closes, nothing more arrives): its in-flight turn fails
// within the heartbeat timeout, far below the turn's deadline, as
// accepted (an attempt). Another worker's turns keep flowing.
func TestWorkerLossFailsTurnWithinHeartbeatTimeout(t *testing.T) {
	e := newEnv(t)
	digest := e.module(wasmtest.Faulty)
	w1 := e.startWorker("w1")
	e.startWorker("w2", func(c *worker.Config) { c.Pools = []string{"h"} })
	e.mustReply("h", digest, e.request("", "warm"))
	stop := make(chan struct{})
	slowest := e.healthy(digest, stop)

	out, _ := e.runLong(digest, "w1", "sleep 50000")
	killed := time.Now()
	w1.kill()
	err := <-out
	d := time.Since(killed)
	close(stop)
	te := turnError(t, err)
	if te.Kind != KindWorkerLost || te.Code != ReasonHeartbeatTimeout || !te.TurnSent() {
		t.Fatalf("turn on the killed worker: %v", err)
	}
	if d > testHBTimeout+lossSlack {
		t.Fatalf("failed %s after the kill; heartbeat timeout %s", d, testHBTimeout)
	}
	figure(t, "fabric: in-flight turn failed %s after its worker's connection dropped (heartbeat interval %s, timeout %s, turn deadline %s)",
		d.Round(time.Millisecond), testHB, testHBTimeout, turnDeadline)
	t.Logf("slowest healthy turn meanwhile: %s", slowest())
}

// A worker whose receive loop stalls while it lives (its heartbeats still
// arrive): the unanswered PING fails its in-flight turn within the
// heartbeat timeout; the turn's RESULT, sent later by the still-running
// worker, authenticates under the ended session and goes to LateResult
// (where the host's fences reject it). When the loop resumes the worker
// reads the REJECT and joins again under a new incarnation.
func TestStalledReceiveLoopFailsTurnAndLateResultGoesToLateResult(t *testing.T) {
	e := newEnv(t)
	digest := e.module(wasmtest.Faulty)
	// The worker itself would give up on a silent host after 10 s: here
	// only the host's ping timeout may end the session.
	w1 := e.startWorker("w1", func(c *worker.Config) { c.HeartbeatTimeout = 10 * time.Second })
	e.startWorker("w2", func(c *worker.Config) { c.Pools = []string{"h"} })
	e.mustReply("h", digest, e.request("", "warm"))
	e.mustReply("p", digest, e.request("", "warm")) // w1 has the module: no fetch during the stall
	stop := make(chan struct{})
	slowest := e.healthy(digest, stop)
	inc := e.incarnation("w1")

	out, req := e.runLong(digest, "w1", "sleep 9000") // outlives the ping timeout, then replies late
	w1.gate.close()
	stalled := time.Now()
	err := <-out
	d := time.Since(stalled)
	te := turnError(t, err)
	if te.Kind != KindWorkerLost || te.Code != ReasonPingTimeout || !te.TurnSent() {
		t.Fatalf("turn on the stalled worker: %v", err)
	}
	if d > testHBTimeout+testHB+lossSlack {
		t.Fatalf("failed %s after the stall; heartbeat timeout %s", d, testHBTimeout)
	}
	figure(t, "fabric: in-flight turn failed %s after its worker's receive loop stalled (ping timeout; heartbeat timeout %s)",
		d.Round(time.Millisecond), testHBTimeout)

	select {
	case late := <-e.late:
		if late.TurnRef != req.TurnRef || late.Outcome != abi.OutcomeOK {
			t.Fatalf("late result %+v, want the stalled turn's %s", late, req.TurnRef)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stalled worker's late RESULT did not reach LateResult")
	}
	w1.gate.release()
	e.waitFor("w1 joined again", 10*time.Second, func() bool {
		now := e.incarnation("w1")
		return now != "" && now != inc
	})
	e.mustReply("p", digest, e.request("", "back"))
	close(stop)
	t.Logf("slowest healthy turn meanwhile: %s", slowest())
}

// A new incarnation of a worker (its process restarted) supersedes the old
// one at once: the old incarnation's in-flight turn fails as soon as the
// new one is admitted, without waiting for a heartbeat timeout.
func TestNewIncarnationSupersedesAtOnce(t *testing.T) {
	e := newEnv(t, func(c *BrokerConfig) { c.HeartbeatTimeout = 5 * time.Second })
	digest := e.module(wasmtest.Faulty)
	w1 := e.startWorker("w1")
	out, _ := e.runLong(digest, "w1", "sleep 50000")
	w1.kill()
	start := time.Now()
	e.startWorker("w1")
	err := <-out
	d := time.Since(start)
	te := turnError(t, err)
	if te.Kind != KindWorkerLost || te.Code != ReasonSuperseded || !te.TurnSent() {
		t.Fatalf("turn of the old incarnation: %v", err)
	}
	if d > time.Second {
		t.Fatalf("superseded after %s (heartbeat timeout 5 s)", d)
	}
	figure(t, "fabric: restarted worker admitted and old incarnation's turn failed %s after the restart began", d.Round(time.Millisecond))
	if s := e.b.Stats(); s.Lost.Superseded != 1 {
		t.Fatalf("superseded sessions: %d", s.Lost.Superseded)
	}
	e.mustReply("p", digest, e.request("", "on the new incarnation"))
}

// A host restart: the worker's next message names a session the new
// broker does not know; it answers REJECT unknown_session and the worker
// joins the new broker under a new incarnation.
func TestWorkerRejoinsAfterHostRestart(t *testing.T) {
	e := newEnv(t)
	digest := e.module(wasmtest.Faulty)
	e.startWorker("w1")
	e.mustReply("p", digest, e.request("", "before"))
	ep := e.b.Endpoint()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	cfg := e.b.Config()
	cfg.Endpoint = ep
	var b2 *Broker
	var err error
	for range 50 { // the port may take a moment to be free again
		if b2, err = NewBroker(context.Background(), cfg, testLogger(t).With("side", "host2")); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b2.Close(context.Background()) })
	e.b = b2
	start := time.Now()
	e.waitFor("worker joined the restarted broker", 10*time.Second, func() bool { return e.incarnation("w1") != "" })
	figure(t, "fabric: worker rejoined a restarted host in %s", time.Since(start).Round(time.Millisecond))
	e.mustReply("p", digest, e.request("", "after"))
}
