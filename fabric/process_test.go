package fabric

import (
	"bytes"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// startProcessWorker builds fabric/internal/testworker and runs it as a
// worker process of its own with id in pool p.
func (e *env) startProcessWorker(bin, id string) *exec.Cmd {
	e.t.Helper()
	before := e.incarnation(id)
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(),
		"FABRIC_CONNECT="+e.connect(), "FABRIC_ID="+id, "FABRIC_KEY="+hex.EncodeToString(e.keys[id]),
		"FABRIC_POOL=p", "FABRIC_CAPACITY=2", "FABRIC_CACHE_DIR="+e.t.TempDir(),
		"FABRIC_WASM_CACHE_DIR="+wasmtest.CacheDir(e.t))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if e.t.Failed() {
			e.t.Logf("worker %s stderr:\n%s", id, stderr.String())
		}
	})
	e.waitFor("process worker "+id+" admitted", 30*time.Second, func() bool {
		inc := e.incarnation(id)
		return inc != "" && inc != before
	})
	return cmd
}

// kill -9 of a worker process mid-turn: the attempt fails within the
// heartbeat timeout, counted as an attempt, and a retry of the same turn
// runs on the other worker of the pool.
func TestKill9WorkerProcessMidTurn(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs worker processes")
	}
	bin := filepath.Join(t.TempDir(), "testworker")
	build := exec.Command("go", "build", "-o", bin, "./internal/testworker")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build testworker: %v\n%s", err, out)
	}
	e := newEnv(t)
	digest := e.module(wasmtest.Faulty)
	a := e.startProcessWorker(bin, "w1")
	e.mustReply("p", digest, e.request("", "warm")) // w1 has the module
	out, req := e.runLong(digest, "w1", "sleep 50000")
	e.startProcessWorker(bin, "w2")
	if err := a.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	err := <-out
	d := time.Since(killed)
	te := turnError(t, err)
	if te.Kind != KindWorkerLost || !te.TurnSent() || te.Worker != "w1" {
		t.Fatalf("turn on the killed process: %v", err)
	}
	if d > testHBTimeout+lossSlack {
		t.Fatalf("failed %s after kill -9 (heartbeat timeout %s)", d, testHBTimeout)
	}
	figure(t, "fabric: kill -9 of a worker process mid-turn → attempt failed after %s (heartbeat timeout %s)", d.Round(time.Millisecond), testHBTimeout)

	// The retry (the host's controller would raise the epoch; the same
	// event) runs on the surviving worker.
	retry := e.request(req.TurnRef.SessionID, "after kill")
	retry.Attempt = 2
	if got := e.mustReply("p", digest, retry); got != "ok: after kill" {
		t.Fatalf("retry: %q", got)
	}
}
