package fabric

import (
	"context"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/fabric/worker"
)

// TestWorkerGoodbyeOnStop checks that a worker whose context ends (paddock
// worker on SIGINT or SIGTERM) says GOODBYE: the broker counts it lost for
// reason goodbye at once, not after the heartbeat timeout. The broker's
// heartbeat timeout is set far above the wait so that only a GOODBYE can
// end the session in time; several workers stop in turn, so a stop path
// that skips the GOODBYE some of the time shows up.
func TestWorkerGoodbyeOnStop(t *testing.T) {
	const hbTimeout = 2 * time.Minute
	e := newEnv(t, func(c *BrokerConfig) { c.HeartbeatTimeout = hbTimeout })
	for i, id := range []string{"w1", "w2", "w3", "w4", "w5", "w6"} {
		tw := e.startWorker(id)
		start := time.Now()
		tw.stop(t)
		e.waitFor(id+" lost for reason goodbye", 30*time.Second, func() bool {
			return e.b.Stats().Lost.Goodbye == uint64(i+1) && e.incarnation(id) == ""
		})
		if d := time.Since(start); d >= hbTimeout {
			t.Fatalf("%s: lost %s after its stop, not before the heartbeat timeout %s", id, d, hbTimeout)
		}
	}
	if lost := e.b.Stats().Lost; lost.HeartbeatTimeout != 0 || lost.Goodbye != 6 {
		t.Fatalf("lost %+v, want 6 goodbyes and no heartbeat timeouts", lost)
	}
}

// TestWorkerGoodbyeWhileJoining checks that a worker stopped before it
// joined returns promptly (nil) instead of waiting out its dial or the
// HelloTimeout.
func TestWorkerGoodbyeWhileJoining(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	done := make(chan error, 1)
	go func() {
		done <- worker.Run(ctx, worker.Config{Connect: e.connect(), ID: "w1", Key: e.keys["w1"], Pools: []string{"p"},
			CacheDir: t.TempDir(), HelloTimeout: time.Minute}, testLogger(t))
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("worker.Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a worker stopped while joining did not return")
	}
}
