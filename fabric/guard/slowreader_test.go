package guard

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// stalledPeer connects a raw DEALER with identity "stuck" and a 4 KiB
// receive buffer that will never read after the handshake.
func stalledPeer(t *testing.T, addr string) net.Conn {
	t.Helper()
	c := dialRaw(t, addr, "")
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4 << 10)
	}
	rawHandshake(t, c, "stuck")
	return c
}

// flood sends 256 KiB messages to "stuck" until a Send fails; it reports the
// number of successful sends in *ok and the failing Send's error and duration
// on the returned channel.
type floodResult struct {
	err  error
	took time.Duration
}

func floodStuck(r zmq4.Socket, ok *atomic.Int64) <-chan floodResult {
	res := make(chan floodResult, 1)
	payload := make([]byte, 256<<10)
	go func() {
		for {
			start := time.Now()
			err := r.Send(zmq4.NewMsgFrom([]byte("stuck"), payload))
			if err != nil {
				res <- floodResult{err, time.Since(start)}
				return
			}
			ok.Add(1)
		}
	}()
	return res
}

// (c) With the guard's WriteTimeout W, a peer that stops reading delays the
// sends to a healthy peer by about W once, then it is dropped and zmq4's
// ROUTER send lock is released.
func TestSlowReaderBoundedByWriteTimeout(t *testing.T) {
	const w = 300 * time.Millisecond
	g := newTestGuard(t, Options{WriteTimeout: w})
	r, addr := startRouter(t, g.Scheme(), zmq4.WithTimeout(200*time.Millisecond))
	healthy := dialDealer(t, "healthy", "tcp://"+addr, 2*time.Second)
	stuck := stalledPeer(t, addr)
	waitFor(t, "both admitted", time.Second, func() bool { return g.Stats().Open == 2 })

	// Probe: ROUTER -> healthy every 10 ms, latency = send start to receipt.
	var (
		mu       sync.Mutex
		maxDelay time.Duration
		probes   int
	)
	stop := make(chan struct{})
	probeDone := make(chan struct{})
	go func() {
		defer close(probeDone)
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			start := time.Now()
			if err := r.Send(zmq4.NewMsgFrom([]byte("healthy"), []byte("ping"))); err != nil {
				t.Errorf("send to healthy: %v", err)
				return
			}
			if _, err := recvTimeout(healthy, 5*time.Second); err != nil {
				t.Errorf("healthy recv: %v", err)
				return
			}
			d := time.Since(start)
			mu.Lock()
			maxDelay, probes = max(maxDelay, d), probes+1
			mu.Unlock()
		}
	}()

	var sent atomic.Int64
	start := time.Now()
	var res floodResult
	select {
	case res = <-floodStuck(r, &sent):
	case <-time.After(10 * time.Second):
		t.Fatal("send to the stalled peer never failed")
	}
	t.Logf("stalled peer: %d x 256 KiB accepted in %v, then a Send failed after %v: %v",
		sent.Load(), time.Since(start).Round(time.Millisecond), res.took.Round(time.Millisecond), res.err)
	if !errors.Is(res.err, ErrWriteStalled) {
		t.Fatalf("stalled send error = %v, want ErrWriteStalled", res.err)
	}
	time.Sleep(200 * time.Millisecond) // keep probing after the cut
	close(stop)
	<-probeDone

	mu.Lock()
	t.Logf("healthy peer: %d probes, worst delay %v (WriteTimeout %v)", probes, maxDelay.Round(time.Millisecond), w)
	if maxDelay < w/2 || maxDelay > w+500*time.Millisecond {
		t.Errorf("worst healthy delay %v, want about %v", maxDelay, w)
	}
	mu.Unlock()

	// zmq4 dropped the stalled peer: its TCP connection is closed, the guard
	// counts one write timeout, and sends to it no longer block.
	expectClosed(t, stuck, 3*time.Second)
	waitFor(t, "stalled conn removed", 2*time.Second, func() bool { return g.Stats().Open == 1 })
	if s := g.Stats(); s.WriteTimeouts != 1 {
		t.Fatalf("WriteTimeouts = %d", s.WriteTimeouts)
	}
	t0 := time.Now()
	if err := r.Send(zmq4.NewMsgFrom([]byte("stuck"), []byte("gone"))); err != nil {
		t.Fatalf("send to removed peer: %v", err)
	}
	if err := r.Send(zmq4.NewMsgFrom([]byte("healthy"), []byte("after"))); err != nil {
		t.Fatalf("send to healthy: %v", err)
	}
	if _, err := recvTimeout(healthy, time.Second); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d > 100*time.Millisecond {
		t.Fatalf("sends after the cut took %v", d)
	}
}

// Control for (c): zmq4's tcp transport with WithTimeout(200ms). The ROUTER
// writes under one mutex and never applies the timeout to the write, so one
// peer that stops reading blocks the sends to every peer indefinitely.
func TestPlainTCPSlowReaderBlocksAllSends(t *testing.T) {
	r, addr := startRouter(t, "tcp", zmq4.WithTimeout(200*time.Millisecond))
	healthy := dialDealer(t, "healthy", "tcp://"+addr, 2*time.Second)
	stuck := stalledPeer(t, addr)
	time.Sleep(50 * time.Millisecond)

	var sent atomic.Int64
	res := floodStuck(r, &sent)
	// Wait until the flood stops making progress (TCP buffers full).
	last, since := int64(-1), time.Now()
	for time.Since(since) < 300*time.Millisecond {
		if n := sent.Load(); n != last {
			last, since = n, time.Now()
		}
		time.Sleep(10 * time.Millisecond)
	}
	blockedAt := time.Now()
	healthyDone := make(chan error, 1)
	go func() { healthyDone <- r.Send(zmq4.NewMsgFrom([]byte("healthy"), []byte("ping"))) }()
	select {
	case err := <-healthyDone:
		t.Fatalf("send to healthy returned (%v) while the stalled peer holds the lock", err)
	case fr := <-res:
		t.Fatalf("stalled send returned (%v) — expected it to block", fr.err)
	case <-time.After(1500 * time.Millisecond):
		t.Logf("plain tcp: after %d x 256 KiB the send to the stalled peer and a send to a healthy peer are both blocked for %v despite WithTimeout(200ms)",
			sent.Load(), time.Since(blockedAt).Round(time.Millisecond))
	}
	_ = stuck.Close() // RST: the blocked write fails, the lock is released
	select {
	case <-res:
	case <-time.After(3 * time.Second):
		t.Fatal("stalled send still blocked after the peer closed")
	}
	select {
	case err := <-healthyDone:
		if err != nil {
			t.Fatalf("healthy send: %v", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("healthy send still blocked after the stalled peer closed")
	}
	if _, err := recvTimeout(healthy, 2*time.Second); err != nil {
		t.Fatal(err)
	}
}
