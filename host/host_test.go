package host_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/pgtest"
	"github.com/paddock-dev/paddock/store/postgres"
	"github.com/paddock-dev/paddock/store/sqlite"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// drivers opens a fresh store of each driver for a test.
var drivers = map[string]func(t *testing.T) store.Store{
	"sqlite": func(t *testing.T) store.Store {
		st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "paddock.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	},
	"postgres": func(t *testing.T) store.Store {
		st, err := postgres.Open(context.Background(), pgtest.DSN(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	},
}

// eachDriver runs f as a parallel subtest per store driver.
func eachDriver(t *testing.T, f func(t *testing.T, st store.Store)) {
	t.Parallel()
	for name, open := range drivers {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f(t, open(t))
		})
	}
}

// funcRunner runs Go turn functions in-process, through the JSON wire form,
// as a worker kind would. The binding is the function's name.
type funcRunner struct{ funcs map[string]abi.TurnFunc }

// InProcess: Go functions run in this process, so their turns are
// dispatched deferred like a wasm module's (host.InProcessRunner).
func (funcRunner) InProcess(string) bool { return true }

func (r funcRunner) Binding(b store.AgentBinding, _ string) (string, error) {
	return b.ModuleDigest, nil
}

func (r funcRunner) Instantiate(_ context.Context, binding string) (host.Instance, error) {
	if binding == "panic" {
		return panicInstance{}, nil
	}
	f, ok := r.funcs[binding]
	if !ok {
		return nil, fmt.Errorf("no function %q", binding)
	}
	return funcInstance{f}, nil
}

type funcInstance struct{ f abi.TurnFunc }

func (i funcInstance) Turn(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	var in abi.TurnRequest
	if err := json.Unmarshal(b, &in); err != nil {
		return nil, err
	}
	res := abi.Run(ctx, i.f, &in)
	b, err = json.Marshal(res)
	if err != nil {
		return nil, err
	}
	var out abi.TurnResult
	return &out, json.Unmarshal(b, &out)
}

func (funcInstance) Close(context.Context) error { return nil }

// panicInstance panics in the controller's own goroutine, as a bug in host
// code would.
type panicInstance struct{}

func (panicInstance) Turn(context.Context, *abi.TurnRequest) (*abi.TurnResult, error) {
	panic("bug in a worker adapter")
}

func (panicInstance) Close(context.Context) error { return nil }

// counter is a stateful agent: it counts turns in its state and answers
// "<n>: <message>".
func counter(_ context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
	n := 0
	if len(req.State) > 0 {
		if err := json.Unmarshal(req.State, &n); err != nil {
			return nil, err
		}
	}
	n++
	st, _ := json.Marshal(n)
	return &abi.TurnResult{
		Messages: []abi.Message{{Role: abi.RoleAssistant, Content: fmt.Sprintf("%d: %s", n, req.Event.Message)}},
		State:    st,
	}, nil
}

func testPolicy() host.Policy {
	p := host.DefaultPolicy()
	p.LeaseTTL = 3 * time.Second
	p.IdleTimeout = 300 * time.Millisecond
	p.ScanInterval = 50 * time.Millisecond
	p.TurnTimeout = 5 * time.Second
	p.BackoffMin, p.BackoffMax = 20*time.Millisecond, 100*time.Millisecond
	p.MaxAttempts = 3
	p.ShutdownTimeout = 2 * time.Second
	return p
}

type fixture struct {
	t  *testing.T
	st store.Store
	h  *host.Host
}

// start runs a host over st with the given turn functions.
func start(t *testing.T, st store.Store, funcs map[string]abi.TurnFunc, pol host.Policy) *fixture {
	t.Helper()
	return runHost(t, host.Options{Store: st, Runner: funcRunner{funcs}, Policy: pol, Logger: quietLogger()})
}

// runHost runs a host with o until the test ends.
func runHost(t *testing.T, o host.Options) *fixture {
	t.Helper()
	st := o.Store
	h, err := host.New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("host.Run: %v", err)
		}
	})
	return &fixture{t: t, st: st, h: h}
}

// agent registers an agent bound to binding (a fake module named so).
func (f *fixture) agent(binding string) store.Agent {
	f.t.Helper()
	ctx := context.Background()
	if _, _, err := f.st.PutModule(ctx, store.PutModuleParams{Digest: binding, ABIVersion: abi.Version, Bytes: []byte(binding)}); err != nil {
		f.t.Fatal(err)
	}
	a, err := f.st.CreateAgent(ctx, store.CreateAgentParams{UID: uuid.NewString(), Name: "a-" + uuid.NewString()[:8], ModuleDigest: binding, CrashPolicy: store.CrashRestart})
	if err != nil {
		f.t.Fatal(err)
	}
	return a
}

func (f *fixture) session(a store.Agent) store.ActorKey {
	f.t.Helper()
	s, _, err := f.st.CreateSession(context.Background(), store.CreateSessionParams{AgentUID: a.UID, SessionID: uuid.NewString(), CrashPolicy: store.CrashRestart})
	if err != nil {
		f.t.Fatal(err)
	}
	return s.ActorKey
}

func (f *fixture) signal(key store.ActorKey, msg string) store.Event {
	f.t.Helper()
	payload, _ := json.Marshal(map[string]string{"message": msg})
	e, created, err := f.st.AppendEvent(context.Background(), store.AppendEventParams{Key: key, Kind: abi.EventMessage, Payload: payload})
	if err != nil {
		f.t.Fatal(err)
	}
	if created {
		f.h.Appended(e) // as host/service does
	}
	return e
}

// waitFor polls cond until it holds or a minute passes (generous: this is
// a liveness check, not a timing one; CI machines are shared).
func (f *fixture) waitFor(what string, cond func() bool) {
	f.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			f.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitStarted waits until key's stream holds n turn.started frames. A
// turn of an in-process worker is dispatched deferred and written
// (promoted) Policy.PromoteAfter after it started, or at its first host
// call or chunk: only then is it in flight for a steer or a cancel
// (docs/DESIGN.md "Deferred dispatch").
func (f *fixture) waitStarted(key store.ActorKey, n int) {
	f.t.Helper()
	f.waitFor(fmt.Sprintf("%d turn.started frames", n), func() bool {
		pg, err := f.st.StreamFrames(context.Background(), store.StreamFramesParams{Key: key, Limit: 1000})
		if err != nil {
			f.t.Fatal(err)
		}
		got := 0
		for _, fr := range pg.Frames {
			if fr.Kind == store.FrameTurnStarted {
				got++
			}
		}
		return got >= n
	})
}

// recv receives from ch, failing the test after a minute (a liveness
// bound: a lost wake-up must fail the test, not hang the binary).
func recv[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(time.Minute):
		t.Fatalf("timed out after a minute waiting on a %T channel", *new(T))
		panic("unreachable")
	}
}

func (f *fixture) get(key store.ActorKey) store.Session {
	f.t.Helper()
	s, err := f.st.GetSession(context.Background(), key)
	if err != nil {
		f.t.Fatal(err)
	}
	return s
}

func (f *fixture) transcript(key store.ActorKey) []store.Turn {
	f.t.Helper()
	turns, err := f.st.Transcript(context.Background(), store.TranscriptParams{Key: key, Limit: 1000})
	if err != nil {
		f.t.Fatal(err)
	}
	return turns
}

func (f *fixture) events(key store.ActorKey) []store.Event {
	f.t.Helper()
	es, err := f.st.ListEvents(context.Background(), store.ListEventsParams{Key: key, Limit: 1000})
	if err != nil {
		f.t.Fatal(err)
	}
	return es
}

func TestTurnsCommitInAcceptanceOrderWithStateCarried(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		f := start(t, st, map[string]abi.TurnFunc{"counter": counter}, testPolicy())
		key := f.session(f.agent("counter"))
		for _, m := range []string{"one", "two", "three"} {
			f.signal(key, m)
		}
		f.waitFor("three turns", func() bool { return f.get(key).TurnCount == 3 })
		turns := f.transcript(key)
		if len(turns) != 3 {
			t.Fatalf("got %d turns, want 3", len(turns))
		}
		for i, m := range []string{"one", "two", "three"} {
			tr := turns[i]
			if tr.TurnNo != int64(i+1) || len(tr.Messages) != 2 {
				t.Fatalf("turn %d: %+v", i+1, tr)
			}
			if tr.Messages[0].Role != abi.RoleUser || tr.Messages[0].Content != m {
				t.Errorf("turn %d message 0 = %+v, want the user's %q", i+1, tr.Messages[0], m)
			}
			if want := fmt.Sprintf("%d: %s", i+1, m); tr.Messages[1].Content != want {
				t.Errorf("turn %d reply = %q, want %q (state carried across turns)", i+1, tr.Messages[1].Content, want)
			}
		}
		for _, e := range f.events(key) {
			if e.Status != store.EventDone {
				t.Errorf("event %d is %s, want done", e.ID, e.Status)
			}
		}
	})
}

func TestFailedAttemptRetriesUnderHigherEpochAndCommitsOnce(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		var calls atomic.Int32
		var firstRef atomic.Value
		flaky := func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			if calls.Add(1) == 1 {
				firstRef.Store(req.TurnRef)
				return nil, errors.New("first attempt fails")
			}
			return counter(ctx, req)
		}
		f := start(t, st, map[string]abi.TurnFunc{"flaky": flaky}, testPolicy())
		key := f.session(f.agent("flaky"))
		f.signal(key, "hello")
		f.waitFor("the retry to commit", func() bool { return f.get(key).TurnCount == 1 })

		ev := f.events(key)[0]
		if ev.Status != store.EventDone || ev.Attempts != 1 || ev.LastError == "" {
			t.Fatalf("event after one failure and a retry: %+v", ev)
		}
		turns := f.transcript(key)
		if len(turns) != 1 {
			t.Fatalf("transcript holds %d turns, want exactly 1", len(turns))
		}
		old := firstRef.Load().(abi.TurnRef)
		if turns[0].ActorEpoch <= old.ActorEpoch {
			t.Errorf("retry committed under epoch %d, not above the failed attempt's %d", turns[0].ActorEpoch, old.ActorEpoch)
		}

		// The failed attempt's late reply, replayed now, is rejected by the
		// fences and counted; nothing is written.
		before := testutil.ToFloat64(f.h.Metrics().FenceRejections.WithLabelValues(string(store.FenceStaleEpoch)))
		late := &abi.TurnResult{TurnRef: old, Outcome: abi.OutcomeOK, State: []byte(`99`),
			Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "late"}}}
		_, err := f.h.Commit(context.Background(), late)
		var fe *store.FenceError
		if !errors.As(err, &fe) {
			t.Fatalf("late reply: err = %v, want a fence rejection", err)
		}
		if fe.Reason != store.FenceStaleEpoch && fe.Reason != store.FenceSupersededDelivery {
			t.Errorf("late reply rejected for %s, want stale_epoch or superseded_delivery", fe.Reason)
		}
		after := testutil.ToFloat64(f.h.Metrics().FenceRejections.WithLabelValues(string(fe.Reason)))
		if fe.Reason == store.FenceStaleEpoch && after != before+1 {
			t.Errorf("stale_epoch rejections went %v → %v, want +1", before, after)
		}
		if got := f.transcript(key); len(got) != 1 {
			t.Errorf("transcript holds %d turns after the late reply, want 1", len(got))
		}
	})
}

func TestPoisonEventIsDeadLetteredAndTheSessionMovesOn(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		poison := func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			if req.Event.Message == "poison" {
				return &abi.TurnResult{Outcome: abi.OutcomeError, Error: "cannot digest poison"}, nil
			}
			return counter(ctx, req)
		}
		f := start(t, st, map[string]abi.TurnFunc{"poison": poison}, testPolicy())
		key := f.session(f.agent("poison"))
		f.signal(key, "poison")
		f.signal(key, "fine")
		f.waitFor("the next event to commit", func() bool { return f.get(key).TurnCount == 1 })
		es := f.events(key)
		if es[0].Status != store.EventDeadLetter || es[0].Attempts != 3 {
			t.Errorf("poison event: status %s attempts %d, want dead_letter after 3", es[0].Status, es[0].Attempts)
		}
		if es[1].Status != store.EventDone {
			t.Errorf("next event: %s, want done", es[1].Status)
		}
		if s := f.get(key); s.ActorEpoch < 4 {
			t.Errorf("epoch %d after 3 failed attempts and a commit, want ≥ 4", s.ActorEpoch)
		}
	})
}

func TestControllerPanicTouchesNoOtherSession(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		pol := testPolicy()
		pol.RestartIntensity, pol.RestartPeriod = 1, time.Minute
		f := start(t, st, map[string]abi.TurnFunc{"counter": counter}, pol)
		bad := f.session(f.agent("panic"))
		good := f.session(f.agent("counter"))
		f.signal(bad, "x")
		for i := range 5 {
			f.signal(good, fmt.Sprint(i))
		}
		f.waitFor("the healthy session's turns", func() bool { return f.get(good).TurnCount == 5 })
		// Past the restart intensity the panics count as crashes, so the
		// event dead-letters instead of looping forever.
		f.waitFor("the panicking session's event to dead-letter", func() bool {
			return f.events(bad)[0].Status == store.EventDeadLetter
		})
		if n := testutil.ToFloat64(f.h.Metrics().ControllerPanics); n < 3 {
			t.Errorf("recovered panics = %v, want ≥ 3", n)
		}
	})
}

func TestIdleActivationStopsAndASignalWakesIt(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		f := start(t, st, map[string]abi.TurnFunc{"counter": counter}, testPolicy())
		key := f.session(f.agent("counter"))
		f.signal(key, "a")
		f.waitFor("the first turn", func() bool { return f.get(key).TurnCount == 1 })
		f.waitFor("the idle controller to stop", func() bool { return !f.h.Running(key) })
		epoch := f.get(key).ActorEpoch
		f.signal(key, "b")
		f.waitFor("the woken session's turn", func() bool { return f.get(key).TurnCount == 2 })
		if got := f.get(key).ActorEpoch; got != epoch+1 {
			t.Errorf("epoch after wake = %d, want %d (a new activation)", got, epoch+1)
		}
		if got := f.transcript(key)[1].Messages[1].Content; got != "2: b" {
			t.Errorf("reply after wake = %q, want the state to survive the stop (\"2: b\")", got)
		}
	})
}

func TestConcurrentEnsureRunsOneControllerAndCommitsEachEventOnce(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		f := start(t, st, map[string]abi.TurnFunc{"counter": counter}, testPolicy())
		key := f.session(f.agent("counter"))
		var wg sync.WaitGroup
		for i := range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				f.signal(key, fmt.Sprint(i))
				f.h.Ensure(key)
			}()
		}
		wg.Wait()
		f.waitFor("20 turns", func() bool { return f.get(key).TurnCount == 20 })
		turns := f.transcript(key)
		seen := map[int64]bool{}
		for i, tr := range turns {
			if seen[tr.EventID] {
				t.Fatalf("event %d committed twice", tr.EventID)
			}
			seen[tr.EventID] = true
			if i > 0 && tr.EventID <= turns[i-1].EventID {
				t.Errorf("turn %d handles event %d after event %d: not in acceptance order", tr.TurnNo, tr.EventID, turns[i-1].EventID)
			}
			if want := fmt.Sprintf("%d: ", i+1); len(tr.Messages) < 2 || tr.Messages[1].Content[:len(want)] != want {
				t.Errorf("turn %d reply %q does not continue the state", tr.TurnNo, tr.Messages[1].Content)
			}
		}
	})
}

func TestBackoffIsBoundedExponentialWithJitter(t *testing.T) {
	t.Parallel()
	min, max := 5*time.Second, 120*time.Second
	cases := []struct {
		n      int
		j      float64
		lo, hi time.Duration
	}{
		{1, 0.5, 5 * time.Second, 5 * time.Second},
		{1, 0, 5 * time.Second, 5 * time.Second}, // jitter never goes below min
		{2, 0.5, 10 * time.Second, 10 * time.Second},
		{3, 0, 16 * time.Second, 16 * time.Second},
		{3, 0.999, 23 * time.Second, 24 * time.Second},
		{10, 0.5, 120 * time.Second, 120 * time.Second},
		{60, 0.999, 120 * time.Second, 120 * time.Second},
	}
	for _, c := range cases {
		got := host.Backoff(c.n, min, max, c.j)
		if got < c.lo || got > c.hi {
			t.Errorf("Backoff(%d, j=%v) = %v, want within [%v, %v]", c.n, c.j, got, c.lo, c.hi)
		}
	}
}

// TestAgentTranscriptTailOverridesTheHosts: an agent whose policy sets a
// transcript tail gets that many messages in its requests (0: none), the
// others the host's.
func TestAgentTranscriptTailOverridesTheHosts(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		tails := make(chan int, 16)
		seen := func(_ context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			tails <- len(req.Transcript)
			return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "ok"}}}, nil
		}
		pol := testPolicy()
		pol.TranscriptTail = 3
		f := start(t, st, map[string]abi.TurnFunc{"seen": seen}, pol)
		quiet, chatty := f.agent("seen"), f.agent("seen")
		zero := 0
		pol.Agents = map[string]host.AgentPolicy{quiet.Name: func() host.AgentPolicy { p := pol.AgentPolicy; p.TranscriptTail = &zero; return p }()}
		f.h.SetPolicy(pol)
		for _, c := range []struct {
			a    store.Agent
			want int
		}{{quiet, 0}, {chatty, 3}} {
			key := f.session(c.a)
			for i := range 3 {
				f.signal(key, fmt.Sprint("m", i))
				got := recv(t, tails)
				// A request carries at most the tail, and at most what the
				// session's transcript holds: the earlier turns' two
				// messages each.
				if want := min(c.want, 2*i); got != want {
					t.Fatalf("agent %s turn %d: %d transcript messages, want %d", c.a.Name, i+1, got, want)
				}
			}
		}
	})
}

// TestLeasesBeyondOneRenewalSliceStayHeld: a host renews its leases in
// slices (renewChunk); with 150 live activations — two slices — every
// lease is still held a whole TTL after the last was claimed: each
// session's next signal runs under the epoch of its first (a lost lease
// would stop the activation, and the next signal would claim a new epoch).
func TestLeasesBeyondOneRenewalSliceStayHeld(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		const n = 150
		pol := testPolicy()
		// A TTL that a loaded machine under -race does not miss (3 s did on
		// SQLite, where turns and renewals share one writer).
		pol.LeaseTTL = 6 * time.Second
		pol.IdleTimeout = time.Hour
		pol.Pools = map[string]int{pol.Pool: n + 10}
		f := start(t, st, map[string]abi.TurnFunc{"counter": counter}, pol)
		a := f.agent("counter")
		keys := make([]store.ActorKey, n)
		for i := range keys {
			keys[i] = f.session(a)
			f.signal(keys[i], "a")
		}
		epochs := make([]int64, n)
		for i, key := range keys {
			f.waitFor("the first turns", func() bool { return f.get(key).TurnCount == 1 })
			epochs[i] = f.get(key).ActorEpoch
		}
		// A whole TTL since the last claim (three renewal rounds): a lease
		// not renewed has expired by now.
		time.Sleep(pol.LeaseTTL + 500*time.Millisecond)
		for _, key := range keys {
			f.signal(key, "b")
		}
		for i, key := range keys {
			f.waitFor("the second turns", func() bool { return f.get(key).TurnCount == 2 })
			if got := f.get(key).ActorEpoch; got != epochs[i] {
				t.Fatalf("session %d: epoch %d after the renewal rounds, want %d (its lease was lost)", i, got, epochs[i])
			}
		}
	})
}
