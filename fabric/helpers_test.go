package fabric

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/fabric/guard"
	"github.com/paddock-dev/paddock/fabric/internal/workerhooks"
	"github.com/paddock-dev/paddock/fabric/wire"
	"github.com/paddock-dev/paddock/fabric/worker"
	"github.com/paddock-dev/paddock/plugins/pluginhost"
	"github.com/paddock-dev/paddock/plugins/plugintest"
	"github.com/paddock-dev/paddock/wasm"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if d, err := plugintest.Dir(); err == nil {
		os.RemoveAll(d)
	}
	os.Exit(code)
}

// Test timing: short heartbeats so that loss is detected in well under a
// second; turn deadlines are long, so a test that passes proves the
// heartbeat (not the deadline) ended a turn.
const (
	// Generous for a loaded CI machine (race detector, other packages'
	// tests on 2 cores): a healthy worker must never be evicted by a
	// starved goroutine. The loss tests check "within the heartbeat
	// timeout, far below the turn deadline", with slack, not exact times.
	testHB        = 200 * time.Millisecond
	testHBTimeout = 3 * time.Second
	testAccept    = 5 * time.Second
	testSend      = 3 * time.Second
	turnDeadline  = 60 * time.Second
	// lossSlack is what a loss may take beyond the heartbeat timeout.
	lossSlack = 5 * time.Second
)

// testLogger logs to t until the test ends (later lines are dropped, so
// goroutines that outlive a test cannot panic it). FABRIC_DEBUG=1 shows
// debug lines.
func testLogger(t testing.TB) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(func() { w.mu.Lock(); w.done = true; w.mu.Unlock() })
	level := slog.LevelInfo
	if os.Getenv("FABRIC_DEBUG") != "" {
		level = slog.LevelDebug
	}
	if os.Getenv("FABRIC_QUIET") != "" {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

type testWriter struct {
	t    testing.TB
	mu   sync.Mutex
	done bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

// env is a broker on loopback with configured worker ids w1…w6.
type env struct {
	t       testing.TB
	b       *Broker
	guarded bool // the broker binds through the guard transport (withGuard)
	keys    map[string][]byte
	late    chan *abi.TurnResult
	modules sync.Map // digest → []byte
	fetches atomic.Int64
	seq     atomic.Int64
}

func newEnv(t testing.TB, tweak ...func(*BrokerConfig)) *env {
	t.Helper()
	e := &env{t: t, keys: map[string][]byte{}, late: make(chan *abi.TurnResult, 16)}
	for i := 1; i <= 6; i++ {
		e.keys[fmt.Sprintf("w%d", i)] = wire.NewKey()
	}
	cfg := BrokerConfig{
		Endpoint: "tcp://127.0.0.1:0", Workers: e.keys,
		HeartbeatInterval: testHB, HeartbeatTimeout: testHBTimeout, AcceptTimeout: testAccept, SendTimeout: testSend,
		Modules: func(_ context.Context, digest string) ([]byte, error) {
			e.fetches.Add(1)
			if b, ok := e.modules.Load(digest); ok {
				return b.([]byte), nil
			}
			return nil, fmt.Errorf("module %s not found", digest)
		},
		LateResult: func(r *abi.TurnResult) {
			select {
			case e.late <- r:
			default:
			}
		},
	}
	for _, f := range tweak {
		f(&cfg)
	}
	e.guarded = !strings.HasPrefix(cfg.Endpoint, "tcp://")
	b, err := NewBroker(context.Background(), cfg, testLogger(t).With("side", "host"))
	if err != nil {
		t.Fatal(err)
	}
	e.b = b
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := b.Close(ctx); err != nil {
			t.Errorf("broker close: %v", err)
		}
	})
	return e
}

// prodGuard is the guard transport the broker binds through in
// production (cmd/paddock startBroker): default limits and timeouts, and
// DuplicateDistinct, so that a client claiming a worker's id gets a
// connection of its own. zmq4's transport registry is process-global and
// cannot unregister, so it is registered once per test binary (scheme
// "gtcp-prod") and its counters are shared: compare deltas.
var prodGuard = sync.OnceValue(func() *guard.Guard {
	g, err := guard.New(guard.Options{DuplicateIdentity: guard.DuplicateDistinct})
	if err == nil {
		err = g.Register("gtcp-prod")
	}
	if err != nil {
		panic(err)
	}
	return g
})

// withGuard binds the broker as production does: through prodGuard, with
// the broker cutting connections through it (BrokerConfig.Disconnect).
func withGuard(c *BrokerConfig) {
	c.Endpoint = prodGuard().Endpoint("127.0.0.1:0")
	c.Disconnect = prodGuard().Disconnect
}

// withHandoverGuard binds the broker through guard.Default() ("gtcp",
// DuplicateHandover: the newest connection of an identity wins).
func withHandoverGuard(c *BrokerConfig) {
	if err := guard.Register(); err != nil {
		panic(err)
	}
	c.Endpoint = guard.DefaultScheme + "://127.0.0.1:0"
}

// shortGuard is a second guard transport, scheme "gtcp-w1s", with a 1 s
// WriteTimeout: below the broker's send and heartbeat timeouts (the
// configuration abi/FABRIC.md recommends). Registered once per test
// binary, like the default one.
var shortGuard = sync.OnceValue(func() *guard.Guard {
	g, err := guard.New(guard.Options{WriteTimeout: time.Second})
	if err == nil {
		err = g.Register("gtcp-w1s")
	}
	if err != nil {
		panic(err)
	}
	return g
})

func withShortGuard(c *BrokerConfig) { c.Endpoint = shortGuard().Endpoint("127.0.0.1:0") }

// tguard is the guard the broker binds through (nil on plain tcp://).
func (e *env) tguard() *guard.Guard {
	switch scheme, _, _ := strings.Cut(e.b.Endpoint(), "://"); scheme {
	case guard.DefaultScheme:
		return guard.Default()
	case shortGuard().Scheme():
		return shortGuard()
	case prodGuard().Scheme():
		return prodGuard()
	}
	return nil
}

// addr is the broker's bound host:port.
func (e *env) addr() string {
	_, a, _ := strings.Cut(e.b.Endpoint(), "://")
	return a
}

// connect is the endpoint workers dial: plain tcp:// whatever transport
// the broker binds (production workers, libzmq ones included, never dial
// gtcp://).
func (e *env) connect() string { return "tcp://" + e.addr() }

// module builds an example wasm agent and offers it to workers; it
// returns the digest (the binding).
func (e *env) module(pkg string) string {
	_, body := wasmtest.BuildExample(e.t, pkg)
	d := wasm.Digest(body)
	e.modules.Store(d, body)
	return d
}

// plugin builds a plugin main and returns its config and binding.
func (e *env) plugin(name, pkg string) (pluginhost.Config, string) {
	path, sum := plugintest.Build(e.t, pkg)
	return pluginhost.Config{Name: name, Path: path, SHA256: sum}, pluginhost.Binding(name, sum)
}

// testWorker is a worker.Run goroutine.
type testWorker struct {
	id     string
	cancel context.CancelFunc
	done   chan error
	die    chan struct{}
	gate   *gate
	cfg    worker.Config
	once   sync.Once
}

// gate stalls a worker's receive loop while closed.
type gate struct {
	mu   sync.Mutex
	open chan struct{}
}

func newGate() *gate {
	g := &gate{open: make(chan struct{})}
	close(g.open)
	return g
}

func (g *gate) wait() {
	g.mu.Lock()
	ch := g.open
	g.mu.Unlock()
	<-ch
}

func (g *gate) close() {
	g.mu.Lock()
	g.open = make(chan struct{})
	g.mu.Unlock()
}

func (g *gate) release() {
	g.mu.Lock()
	select {
	case <-g.open:
	default:
		close(g.open)
	}
	g.mu.Unlock()
}

// startWorker runs a worker with id in pool "p" (capacity 2) unless
// tweaked, and waits until the broker admitted it.
func (e *env) startWorker(id string, tweak ...func(*worker.Config)) *testWorker {
	e.t.Helper()
	return e.startHookedWorker(id, nil, tweak...)
}

// startHookedWorker is startWorker with hook applied to the worker's test
// hooks (workerhooks), whose gate and die channel the testWorker holds.
func (e *env) startHookedWorker(id string, hook func(*workerhooks.Hooks), tweak ...func(*worker.Config)) *testWorker {
	e.t.Helper()
	tw := &testWorker{id: id, done: make(chan error, 1), die: make(chan struct{}), gate: newGate()}
	cfg := worker.Config{
		Connect: e.connect(), ID: id, Key: e.keys[id], Pools: []string{"p"}, Capacity: 2,
		CacheDir: e.t.TempDir(), Wasm: wasm.Config{CacheDir: wasmtest.CacheDir(e.t), TurnTimeout: turnDeadline},
		ReconnectMin: 20 * time.Millisecond, ReconnectMax: 200 * time.Millisecond,
	}
	for _, f := range tweak {
		f(&cfg)
	}
	hooks := &workerhooks.Hooks{RecvGate: tw.gate.wait, Die: tw.die}
	if hook != nil {
		hook(hooks)
	}
	tw.cfg = cfg
	before := e.incarnation(id)
	ctx, cancel := context.WithCancel(workerhooks.With(context.Background(), hooks))
	tw.cancel = cancel
	go func() { tw.done <- worker.Run(ctx, cfg, testLogger(e.t).With("side", id)) }()
	e.t.Cleanup(func() {
		tw.gate.release()
		tw.stop(e.t)
	})
	e.waitFor(fmt.Sprintf("worker %s admitted", id), 30*time.Second, func() bool {
		inc := e.incarnation(id)
		return inc != "" && inc != before
	})
	return tw
}

// stop cancels the worker and waits for worker.Run to return (idempotent).
func (tw *testWorker) stop(t testing.TB) {
	tw.once.Do(func() {
		tw.cancel()
		select {
		case err := <-tw.done:
			if err != nil && !errors.Is(err, workerhooks.ErrKilled) {
				t.Errorf("worker %s: %v", tw.id, err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("worker %s did not stop", tw.id)
		}
	})
}

// kill drops the worker's connection without GOODBYE and stops it.
func (tw *testWorker) kill() { close(tw.die) }

// incarnation returns the admitted incarnation of worker id, "" if none.
func (e *env) incarnation(id string) string {
	for _, w := range e.b.Workers() {
		if w.ID == id {
			return w.Incarnation
		}
	}
	return ""
}

func (e *env) inflight(id string) int {
	for _, w := range e.b.Workers() {
		if w.ID == id {
			return w.InFlight
		}
	}
	return -1
}

// accepted is the broker's count of worker id's turns it acknowledged
// (ACCEPTED) and not finished (-1 if it has no live session).
func (e *env) accepted(id string) int {
	for _, w := range e.b.Workers() {
		if w.ID == id {
			return w.Accepted
		}
	}
	return -1
}

func (e *env) waitFor(what string, limit time.Duration, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out after %s waiting for %s", limit, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// request returns a turn request of a new session (or of session s) with
// a unique turn_ref.
func (e *env) request(session, message string) *abi.TurnRequest {
	n := e.seq.Add(1)
	if session == "" {
		session = fmt.Sprintf("s%d", n)
	}
	return &abi.TurnRequest{
		ABIVersion: abi.Version,
		TurnRef: abi.TurnRef{DeliveryID: fmt.Sprintf("d%d", n), ActivationUID: "act-" + session, ActorEpoch: 1,
			ActorEventID: n, AgentUID: "agent", SessionID: session},
		Session: abi.Session{AgentName: "agent", SessionID: session},
		Event:   abi.Event{ID: n, Kind: abi.EventMessage, Message: message, AcceptedAt: time.Now().UTC()},
		Attempt: 1,
	}
}

// turn runs req on pool p with binding under turnDeadline.
func (e *env) turn(binding string, req *abi.TurnRequest) (*abi.TurnResult, error) {
	return e.turnIn("p", binding, req)
}

func (e *env) turnIn(pool, binding string, req *abi.TurnRequest) (*abi.TurnResult, error) {
	inst, err := e.b.Instance(pool, binding)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), turnDeadline)
	defer cancel()
	return inst.Turn(ctx, req)
}

// mustReply runs a turn on pool and returns its single assistant message.
func (e *env) mustReply(pool, binding string, req *abi.TurnRequest) string {
	e.t.Helper()
	res, err := e.turnIn(pool, binding, req)
	return reply(e.t, res, err)
}

// reply is the single assistant message of a result.
func reply(t testing.TB, res *abi.TurnResult, err error) string {
	t.Helper()
	if err != nil {
		t.Fatalf("turn: %v", err)
	}
	if res.Outcome != abi.OutcomeOK || len(res.Messages) != 1 {
		t.Fatalf("result %+v", res)
	}
	return res.Messages[0].Content
}

func turnError(t testing.TB, err error) *TurnError {
	t.Helper()
	var te *TurnError
	if !errors.As(err, &te) {
		t.Fatalf("error %v (%T) is not a *TurnError", err, err)
	}
	return te
}

// figure records a measured figure: logged, and appended to the file named
// by FIGURES_FILE (make test prints it at the end).
func figure(t *testing.T, format string, args ...any) {
	t.Helper()
	line := fmt.Sprintf(format, args...)
	t.Log(line)
	if path := os.Getenv("FIGURES_FILE"); path != "" {
		f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err == nil {
			fmt.Fprintln(f, line)
			f.Close()
		}
	}
}
