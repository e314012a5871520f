// Package examples_test runs the example agents as real wasm modules
// through a real host (SQLite store, wazero runtime, controllers), the way
// `make run` does.
package examples_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/fabric"
	"github.com/paddock-dev/paddock/fabric/wire"
	"github.com/paddock-dev/paddock/fabric/worker"
	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/calls"
	"github.com/paddock-dev/paddock/host/runner"
	"github.com/paddock-dev/paddock/plugins/pluginhost"
	"github.com/paddock-dev/paddock/plugins/plugintest"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/sqlite"
	"github.com/paddock-dev/paddock/wasm"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if dir, err := plugintest.Dir(); err == nil {
		_ = os.RemoveAll(dir)
	}
	os.Exit(code)
}

type world struct {
	t       testing.TB
	plugins *pluginhost.Manager
	st      store.Store
	h       *host.Host
	stop    func()
	agents  map[string]store.Agent
}

// startHost runs a host over the SQLite database at path with both example
// agents registered (idempotently, as `paddock serve` does at start).
func startHost(t *testing.T, path string) *world {
	return startHostWith(t, path, 30*time.Second, nil)
}

// startHostWith is startHost with a given turn timeout. Tests never rely on
// a turn finishing within a short time, except for the loop case, which is
// what the timeout is for.
func startHostWith(t testing.TB, path string, turnTimeout time.Duration, wrap func(host.Runner) host.Runner) *world {
	t.Helper()
	return startHostOpts(t, path, hostOpts{turnTimeout: turnTimeout, wrap: wrap})
}

// hostOpts are startHostOpts's options.
type hostOpts struct {
	// turnTimeout is every agent's turn timeout.
	turnTimeout time.Duration
	// wrap, when set, wraps the host's runner.
	wrap func(host.Runner) host.Runner
	// calls is the host's host-call executor (host.Options.Calls); nil:
	// turns have no host-call channel.
	calls *calls.Executor
	// chatCaps, when chat is set, are the capabilities of the chat agents.
	chatCaps calls.Capabilities
	// chat registers the chat example as "chat" (wasm), "chat-plugin"
	// (plugin worker) and "chat-remote" (wasm on the remote pool).
	chat bool
}

// startHostOpts runs a host over the SQLite database at path with the
// example agents registered, as startHostWith, and the chat agents when
// o.chat is set.
func startHostOpts(t testing.TB, path string, o hostOpts) *world {
	t.Helper()
	turnTimeout, wrap := o.turnTimeout, o.wrap
	ctx := context.Background()
	st, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	rt, err := wasm.New(ctx, wasm.Config{CacheDir: wasmtest.CacheDir(t), MemoryLimitPages: 512, TurnTimeout: turnTimeout, MaxResultBytes: 64 << 10}, log)
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, st: st, agents: map[string]store.Agent{}}
	pm := pluginhost.NewManager(log, pluginhost.Options{})
	wr := runner.New(runner.NewWasm(rt, st), pm, st)
	for name, pkg := range map[string]string{"notes": wasmtest.Notes, "faulty": wasmtest.Faulty} {
		_, b := wasmtest.BuildExample(t, pkg)
		digest, version, err := wr.Inspect(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := st.PutModule(ctx, store.PutModuleParams{Digest: digest, ABIVersion: version, Bytes: b}); err != nil {
			t.Fatal(err)
		}
		a, err := st.CreateAgent(ctx, store.CreateAgentParams{UID: uuid.NewString(), Name: name, ModuleDigest: digest, CrashPolicy: store.CrashRestart, Upsert: true})
		if err != nil {
			t.Fatal(err)
		}
		w.agents[name] = a
	}
	// The notes agent again, as a plugin worker.
	path, sum := plugintest.Build(t, "./examples/notes/plugin")
	pw := store.PluginWorker{Name: "notes-plugin", Path: path, SHA256: sum, Processes: 2}
	if err := wr.CheckPlugin(ctx, pw); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.PutPluginWorker(ctx, pw); err != nil {
		t.Fatal(err)
	}
	a, err := st.CreateAgent(ctx, store.CreateAgentParams{UID: uuid.NewString(), Name: "notes-plugin", Kind: store.KindPlugin, Plugin: "notes-plugin", CrashPolicy: store.CrashRestart, Upsert: true})
	if err != nil {
		t.Fatal(err)
	}
	w.agents["notes-plugin"] = a
	fpath, fsum := plugintest.Build(t, "./examples/faulty/plugin")
	fw := store.PluginWorker{Name: "faulty-plugin", Path: fpath, SHA256: fsum, Processes: 1}
	if err := wr.CheckPlugin(ctx, fw); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.PutPluginWorker(ctx, fw); err != nil {
		t.Fatal(err)
	}
	a, err = st.CreateAgent(ctx, store.CreateAgentParams{UID: uuid.NewString(), Name: "faulty-plugin", Kind: store.KindPlugin, Plugin: "faulty-plugin", CrashPolicy: store.CrashRestart, Upsert: true})
	if err != nil {
		t.Fatal(err)
	}
	w.agents["faulty-plugin"] = a
	w.plugins = pm
	// A remote pool served by one fabric worker over loopback: the notes
	// module again, as agent "notes-remote".
	key := wire.NewKey()
	broker, err := fabric.NewBroker(ctx, fabric.BrokerConfig{
		Endpoint: "tcp://127.0.0.1:0", Workers: map[string][]byte{"w1": key},
		Modules: func(ctx context.Context, digest string) ([]byte, error) {
			m, err := st.GetModule(ctx, store.DefaultNamespace, digest)
			return m.Bytes, err
		},
	}, log)
	if err != nil {
		t.Fatal(err)
	}
	wr.WithFabric(broker, []string{"remote"})
	workerCtx, stopWorker := context.WithCancel(ctx)
	workerDone := make(chan struct{})
	go func() {
		defer close(workerDone)
		_ = worker.Run(workerCtx, worker.Config{
			Connect: broker.Endpoint(), ID: "w1", Key: key, Pools: []string{"remote"}, Capacity: 4,
			CacheDir: filepath.Join(t.TempDir(), "worker"), Wasm: wasm.Config{CacheDir: wasmtest.CacheDir(t), MemoryLimitPages: 512},
		}, log)
	}()
	ra, err := st.CreateAgent(ctx, store.CreateAgentParams{UID: uuid.NewString(), Name: "notes-remote", Kind: store.KindWasm,
		ModuleDigest: w.agents["notes"].ModuleDigest, CrashPolicy: store.CrashRestart, Upsert: true})
	if err != nil {
		t.Fatal(err)
	}
	w.agents["notes-remote"] = ra
	if o.chat {
		w.registerChat(wr)
	}

	pol := host.DefaultPolicy()
	pol.LeaseTTL, pol.IdleTimeout, pol.ScanInterval = 3*time.Second, time.Second, 50*time.Millisecond
	pol.TurnTimeout, pol.MaxAttempts = turnTimeout, 3
	pol.BackoffMin, pol.BackoffMax = 20*time.Millisecond, 100*time.Millisecond
	remote := pol.AgentPolicy
	remote.Pool = "remote"
	pol.Agents = map[string]host.AgentPolicy{"notes-remote": remote}
	if o.chat {
		chatPol := pol.AgentPolicy
		chatPol.Capabilities = o.chatCaps
		chatRemote := remote
		chatRemote.Capabilities = o.chatCaps
		pol.Agents["chat"], pol.Agents["chat-plugin"], pol.Agents["chat-remote"] = chatPol, chatPol, chatRemote
	}
	pol.Pools = map[string]int{"default": 64, "remote": 64}
	var r host.Runner = wr
	if wrap != nil {
		r = wrap(wr)
	}
	w.h, err = host.New(host.Options{Store: st, Runner: r, Policy: pol, Logger: log, Calls: o.calls})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = w.h.Run(runCtx); close(done) }()
	stopped := false
	w.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		<-done
		stopWorker()
		<-workerDone
		_ = broker.Close(ctx)
		_ = pm.Close(ctx)
		_ = rt.Close(ctx)
		_ = st.Close()
	}
	t.Cleanup(w.stop)
	return w
}

func (w *world) session(agent string) store.ActorKey {
	w.t.Helper()
	s, _, err := w.st.CreateSession(context.Background(), store.CreateSessionParams{AgentUID: w.agents[agent].UID, SessionID: uuid.NewString()})
	if err != nil {
		w.t.Fatal(err)
	}
	return s.ActorKey
}

func (w *world) send(key store.ActorKey, msg string) {
	w.t.Helper()
	payload, _ := json.Marshal(map[string]string{"message": msg})
	if _, _, err := w.st.AppendEvent(context.Background(), store.AppendEventParams{Key: key, Kind: abi.EventMessage, Payload: payload}); err != nil {
		w.t.Fatal(err)
	}
	w.h.Ensure(key)
}

// settle waits until the session has no open event and returns its events.
func (w *world) settle(key store.ActorKey) []store.Event {
	w.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		s, err := w.st.GetSession(context.Background(), key)
		if err != nil {
			w.t.Fatal(err)
		}
		if s.OpenEvents == 0 {
			es, err := w.st.ListEvents(context.Background(), store.ListEventsParams{Key: key, Limit: 100})
			if err != nil {
				w.t.Fatal(err)
			}
			return es
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("session %s still has %d open events", key, s.OpenEvents)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// replies returns the last assistant message of each turn.
func (w *world) replies(key store.ActorKey) []string {
	w.t.Helper()
	turns, err := w.st.Transcript(context.Background(), store.TranscriptParams{Key: key, Limit: 100})
	if err != nil {
		w.t.Fatal(err)
	}
	var out []string
	for _, tr := range turns {
		out = append(out, tr.Messages[len(tr.Messages)-1].Content)
	}
	return out
}

func TestNotesStateSurvivesAHostRestart(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "paddock.db")
	w := startHost(t, db)
	key := w.session("notes")
	w.send(key, "note buy milk")
	w.send(key, "note call mum")
	w.settle(key)
	w.stop()

	w = startHost(t, db)
	w.send(key, "list")
	w.send(key, "count")
	w.settle(key)
	got := w.replies(key)
	if len(got) != 4 {
		t.Fatalf("replies %q, want 4", got)
	}
	if !strings.Contains(got[2], "1. buy milk") || !strings.Contains(got[2], "2. call mum") {
		t.Errorf("list after restart = %q", got[2])
	}
	if !strings.Contains(got[3], "2 notes") || !strings.Contains(got[3], "4 turns") {
		t.Errorf("count after restart = %q, want 2 notes and 4 turns", got[3])
	}
}

func TestALoopingTurnTimesOutAndIsDeadLettered(t *testing.T) {
	t.Parallel()
	w := startHostWith(t, filepath.Join(t.TempDir(), "paddock.db"), time.Second, nil)
	f := w.session("faulty")
	w.send(f, "loop")
	e := w.settle(f)[0]
	if e.Status != store.EventDeadLetter || e.Attempts != 3 || !strings.Contains(e.LastError, "timeout") {
		t.Errorf("loop: %s after %d attempts (%q), want dead_letter after 3 timeouts", e.Status, e.Attempts, e.LastError)
	}
}

func TestFaultyMisbehavioursFailAttemptsAndTheHostServesOn(t *testing.T) {
	t.Parallel()
	w := startHost(t, filepath.Join(t.TempDir(), "paddock.db"))
	notes := w.session("notes")
	cases := []struct {
		msg        string
		wantStatus store.EventStatus
		wantErr    string
	}{
		{"trap", store.EventDeadLetter, "trap"},
		{"crash", store.EventDeadLetter, "trap"},
		{"exit 3", store.EventDeadLetter, "exit"},
		{"oom", store.EventDeadLetter, "memory"},
		{"big 100000", store.EventDeadLetter, "result"}, // over the 64 KiB result cap
		{"error", store.EventDeadLetter, "error"},
		{"flaky 2", store.EventDone, ""},
		{"hello", store.EventDone, ""},
	}
	for _, c := range cases {
		t.Run(c.msg, func(t *testing.T) {
			t.Parallel()
			f := w.session("faulty")
			w.send(f, c.msg)
			w.send(notes, "note "+c.msg) // other sessions keep working meanwhile
			es := w.settle(f)
			e := es[0]
			if e.Status != c.wantStatus {
				t.Fatalf("%q ended %s (attempts %d, %q), want %s", c.msg, e.Status, e.Attempts, e.LastError, c.wantStatus)
			}
			if c.wantStatus == store.EventDeadLetter && (e.Attempts != 3 || !strings.Contains(strings.ToLower(e.LastError), c.wantErr)) {
				t.Errorf("%q: attempts %d last_error %q, want 3 attempts and an error mentioning %q", c.msg, e.Attempts, e.LastError, c.wantErr)
			}
			if c.msg == "flaky 2" && e.Attempts != 1 {
				t.Errorf("flaky 2 took %d failed attempts, want 1", e.Attempts)
			}
		})
	}
	t.Cleanup(func() {
		es := w.settle(notes)
		if len(es) != len(cases) {
			t.Errorf("notes session: %d events, want %d", len(es), len(cases))
		}
		for _, e := range es {
			if e.Status != store.EventDone {
				t.Errorf("notes event %d ended %s while faulty sessions failed: %s", e.ID, e.Status, e.LastError)
			}
		}
		if got := w.replies(notes); !strings.Contains(got[len(got)-1], fmt.Sprint(len(cases))) {
			t.Errorf("last notes reply %q does not count %d notes", got[len(got)-1], len(cases))
		}
	})
}

// startedRunner reports the moment each turn reaches the worker.
type startedRunner struct {
	host.Runner
	started chan time.Time
}

func (r startedRunner) Instantiate(ctx context.Context, binding string) (host.Instance, error) {
	inst, err := r.Runner.Instantiate(ctx, binding)
	if err != nil {
		return nil, err
	}
	return startedInstance{inst, r.started}, nil
}

type startedInstance struct {
	host.Instance
	started chan time.Time
}

func (i startedInstance) Turn(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
	i.started <- time.Now()
	return i.Instance.Turn(ctx, req)
}

// BenchmarkWakeLatency measures, for a sleeping session (idle-stopped: no
// controller, no activation, no wasm instance) of the notes agent whose
// module is already compiled, the time from a signal accepted (the event
// committed) to its turn starting on the worker: controller start, agent
// and session reads, capacity, activation claim, delivery, instantiation.
// SQLite store. Reports p50 and p99 in ms.
//
//	go test -run '^$' -bench WakeLatency -benchtime 200x ./examples/
func BenchmarkWakeLatency(b *testing.B) {
	// session: the default instance_reuse (a fresh instance per wake);
	// agent: warm instances lent to the agent's sessions.
	for _, scope := range []host.InstanceScope{host.ScopeSession, host.ScopeAgent} {
		b.Run("reuse="+string(scope), func(b *testing.B) { wakeLatency(b, scope) })
	}
}

func wakeLatency(b *testing.B, scope host.InstanceScope) {
	started := make(chan time.Time, 1)
	w := startHostWith(b, filepath.Join(b.TempDir(), "paddock.db"), 30*time.Second, func(r host.Runner) host.Runner {
		return startedRunner{r, started}
	})
	pol := *w.h.Policy()
	pol.IdleTimeout = time.Millisecond // sleep right after each turn
	pol.InstanceReuse = scope
	pol.Agents = nil // the default policy for every agent
	w.h.SetPolicy(pol)
	key := w.session("notes")
	payload, _ := json.Marshal(map[string]string{"message": "count"})
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		for w.h.Running(key) { // asleep: no controller left
			time.Sleep(100 * time.Microsecond)
		}
		if _, _, err := w.st.AppendEvent(context.Background(), store.AppendEventParams{Key: key, Kind: abi.EventMessage, Payload: payload}); err != nil {
			b.Fatal(err)
		}
		accepted := time.Now()
		w.h.Ensure(key)
		lat = append(lat, (<-started).Sub(accepted))
		w.settle(key)
	}
	b.StopTimer()
	// Every signal ran once and committed: the last turn counts them all.
	s, err := w.st.GetSession(context.Background(), key)
	if err != nil {
		b.Fatal(err)
	}
	turns, err := w.st.Transcript(context.Background(), store.TranscriptParams{Key: key, AfterTurn: int64(b.N - 1), Limit: 1})
	if err != nil {
		b.Fatal(err)
	}
	want := fmt.Sprintf("0 notes, %d turns", b.N)
	if s.TurnCount != int64(b.N) || s.DeadLetters != 0 || len(turns) != 1 || turns[0].Outcome != abi.OutcomeOK ||
		turns[0].Messages[len(turns[0].Messages)-1].Content != want {
		b.Fatalf("after %d signals: %d turns, %d dead letters, last turn %+v; want its reply %q", b.N, s.TurnCount, s.DeadLetters, turns, want)
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50_ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99_ms")
}

// script is the scripted conversation every worker kind of the notes agent
// must answer identically (the cross-kind conformance test; the remote
// worker kind joins it later).
var script = []string{"note buy milk", "note call mum", "list", "count", "note water plants", "list"}

// conversation runs the script through a session of agent and returns its
// transcript (role: content per message, turn by turn) and final state.
func (w *world) conversation(agent string) ([]string, []byte) {
	w.t.Helper()
	key := w.session(agent)
	for _, m := range script {
		w.send(key, m)
	}
	es := w.settle(key)
	for _, e := range es {
		if e.Status != store.EventDone {
			w.t.Fatalf("%s: event %d ended %s: %s", agent, e.ID, e.Status, e.LastError)
		}
	}
	turns, err := w.st.Transcript(context.Background(), store.TranscriptParams{Key: key, Limit: 100})
	if err != nil {
		w.t.Fatal(err)
	}
	var lines []string
	for _, tr := range turns {
		for _, m := range tr.Messages {
			lines = append(lines, fmt.Sprintf("%d %s: %s", tr.TurnNo, m.Role, m.Content))
		}
	}
	state, err := w.st.SessionState(context.Background(), key)
	if err != nil {
		w.t.Fatal(err)
	}
	return lines, state
}

func TestTheSameAgentAsWasmPluginAndRemoteWorkerGivesIdenticalTranscriptsAndStates(t *testing.T) {
	t.Parallel()
	w := startHost(t, filepath.Join(t.TempDir(), "paddock.db"))
	wasmLines, wasmState := w.conversation("notes")
	if len(wasmLines) != 2*len(script) || len(wasmState) == 0 {
		t.Fatalf("wasm run: %d transcript lines (want %d), state %q", len(wasmLines), 2*len(script), wasmState)
	}
	for _, kind := range []string{"notes-plugin", "notes-remote"} {
		lines, state := w.conversation(kind)
		if strings.Join(wasmLines, "\n") != strings.Join(lines, "\n") {
			t.Errorf("transcripts differ\nwasm:\n%s\n\n%s:\n%s", strings.Join(wasmLines, "\n"), kind, strings.Join(lines, "\n"))
		}
		if string(wasmState) != string(state) {
			t.Errorf("states differ: wasm %s, %s %s", wasmState, kind, state)
		}
	}
}

func TestKillDashNineOfThePluginProcessMidTurnFailsTheAttemptAndTheRetryRunsOnAFreshProcess(t *testing.T) {
	t.Parallel()
	w := startHost(t, filepath.Join(t.TempDir(), "paddock.db"))
	key := w.session("faulty-plugin")
	w.send(key, "sleep 3000")
	deadline := time.Now().Add(time.Minute)
	var victim int
	for victim == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the plugin turn did not start")
		}
		st, err := w.plugins.Status("faulty-plugin")
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range st.Processes {
			if p.Turns > 0 {
				victim = p.PID
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	e := w.settle(key)[0]
	if e.Status != store.EventDone || e.Attempts != 1 || !strings.Contains(e.LastError, "crash") {
		t.Errorf("event after its plugin process was killed: %s, attempts %d, last error %q; want done after 1 failed attempt", e.Status, e.Attempts, e.LastError)
	}
	if got := w.replies(key); len(got) != 1 {
		t.Errorf("transcript holds %d turns, want the turn exactly once", len(got))
	}
	st, _ := w.plugins.Status("faulty-plugin")
	for _, p := range st.Processes {
		if p.PID == victim && !p.Retired {
			t.Errorf("the killed process %d still serves", victim)
		}
	}
}
