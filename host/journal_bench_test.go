package host_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/calls"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/pgtest"
	"github.com/paddock-dev/paddock/store/postgres"
	"github.com/paddock-dev/paddock/store/sqlite"
)

// callsPerTurn is how many model calls one benchmark turn makes.
const callsPerTurn = 20

// benchHost runs a host with a real executor against srv on st, every
// agent granted the endpoint "chat", with capacity for many sessions.
func benchHost(b *testing.B, st store.Store, funcs map[string]abi.TurnFunc, url string) *benchFixture {
	b.Helper()
	x, err := calls.New(calls.Config{
		Endpoints: map[string]calls.Endpoint{"chat": {Provider: calls.ProviderOpenAI, BaseURL: url + "/v1", Models: []string{"m1"}}},
		Logger:    quietLogger(),
	})
	if err != nil {
		b.Fatal(err)
	}
	pol := testPolicy()
	pol.Capabilities = calls.Capabilities{Models: []string{"chat"}}
	pol.TurnTimeout = time.Minute
	pol.IdleTimeout = time.Minute
	pol.Pools = map[string]int{"default": 2000}
	h, err := host.New(host.Options{Store: st, Runner: funcRunner{funcs}, Policy: pol, Logger: quietLogger(), Calls: x})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-done })
	return &benchFixture{b: b, st: st}
}

// benchFixture is fixture's counterpart for benchmarks.
type benchFixture struct {
	b  *testing.B
	st store.Store
}

func (f *benchFixture) agent(binding string) store.Agent {
	ctx := context.Background()
	if _, _, err := f.st.PutModule(ctx, store.PutModuleParams{Digest: binding, ABIVersion: abi.Version, Bytes: []byte(binding)}); err != nil {
		f.b.Fatal(err)
	}
	a, err := f.st.CreateAgent(ctx, store.CreateAgentParams{UID: uuid.NewString(), Name: binding, ModuleDigest: binding, CrashPolicy: store.CrashRestart})
	if err != nil {
		f.b.Fatal(err)
	}
	return a
}

func (f *benchFixture) session(a store.Agent) store.ActorKey {
	s, _, err := f.st.CreateSession(context.Background(), store.CreateSessionParams{AgentUID: a.UID, SessionID: uuid.NewString(), CrashPolicy: store.CrashRestart})
	if err != nil {
		f.b.Fatal(err)
	}
	return s.ActorKey
}

func (f *benchFixture) signal(key store.ActorKey) {
	if _, _, err := f.st.AppendEvent(context.Background(), store.AppendEventParams{Key: key, Kind: abi.EventMessage, Payload: []byte(`{"message":"go"}`)}); err != nil {
		f.b.Fatal(err)
	}
}

// committed waits until the session committed a turn.
func (f *benchFixture) committed(key store.ActorKey) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		s, err := f.st.GetSession(context.Background(), key)
		if err == nil && s.TurnCount >= 1 {
			return
		}
		if time.Now().After(deadline) {
			f.b.Fatalf("session %s committed no turn in 2 minutes (last error %v)", key, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// openBench opens a fresh store of the named driver for a benchmark.
func openBench(b *testing.B, driver string) store.Store {
	ctx := context.Background()
	var st store.Store
	var err error
	if driver == "sqlite" {
		st, err = sqlite.Open(ctx, filepath.Join(b.TempDir(), "paddock.db"))
	} else {
		st, err = postgres.Open(ctx, pgtest.DSN(b))
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	return st
}

// instantChat answers every chat request at once (unstreamed), after
// delay.
func instantChat(b *testing.B, delay time.Duration) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if delay > 0 {
			time.Sleep(delay)
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"id": "c", "object": "chat.completion", "model": "m1",
			"choices": []any{map[string]any{"index": 0, "finish_reason": "stop", "message": map[string]any{"role": "assistant", "content": "ok"}}},
			"usage":   map[string]any{"prompt_tokens": 1, "completion_tokens": 1},
		})
	}))
	b.Cleanup(srv.Close)
	return srv
}

// benchStores are the drivers benchmarks run on.
func benchStores(b *testing.B, f func(b *testing.B, st store.Store)) {
	for _, name := range []string{"sqlite", "postgres"} {
		b.Run(name, func(b *testing.B) { f(b, openBench(b, name)) })
	}
}

// BenchmarkJournaledModelCall measures the host-side cost of one host
// call against a local OpenAI-protocol server that answers at once: the
// call as the worker sees it (executor + journal write), and, beside it,
// the executor alone (Executor.Do, no journal), so the journal write's
// share is their difference. Then the same calls replayed by a retry.
// Reported: p50/p99 in µs of live journaled calls, of bare executor calls
// and of replayed calls.
func BenchmarkJournaledModelCall(b *testing.B) {
	benchStores(b, func(b *testing.B, st store.Store) {
		srv := instantChat(b, 0)
		var mu sync.Mutex
		var live, replayed []time.Duration
		req := &abi.CallRequest{Kind: abi.CallKindModel, Model: &abi.ModelRequest{Endpoint: "chat",
			Messages: []abi.ModelMessage{{Role: abi.RoleUser, Content: "hi"}}}}
		f := benchHost(b, st, map[string]abi.TurnFunc{"bench": func(ctx context.Context, r *abi.TurnRequest) (*abi.TurnResult, error) {
			for i := range callsPerTurn {
				q := *req
				m := *req.Model
				m.Messages = []abi.ModelMessage{{Role: abi.RoleUser, Content: fmt.Sprint("hi ", i)}}
				q.Model = &m
				start := time.Now()
				res := abi.Call(ctx, &q)
				d := time.Since(start)
				if res.Error != nil {
					return nil, res.Error
				}
				mu.Lock()
				if res.Replayed {
					replayed = append(replayed, d)
				} else {
					live = append(live, d)
				}
				mu.Unlock()
			}
			if r.Attempt == 1 {
				return nil, errors.New("fail once: the retry replays")
			}
			return &abi.TurnResult{}, nil
		}}, srv.URL)
		a := f.agent("bench")
		turns := max(1, b.N/callsPerTurn)
		b.ResetTimer()
		for range turns {
			key := f.session(a)
			f.signal(key)
			f.committed(key)
		}
		b.StopTimer()
		// The executor alone, for the journal's share.
		x, err := calls.New(calls.Config{
			Endpoints: map[string]calls.Endpoint{"chat": {Provider: calls.ProviderOpenAI, BaseURL: srv.URL + "/v1", Models: []string{"m1"}}},
			Logger:    quietLogger(),
		})
		if err != nil {
			b.Fatal(err)
		}
		var bare []time.Duration
		for range len(live) {
			start := time.Now()
			out := x.Do(context.Background(), "bench", calls.Capabilities{Models: []string{"chat"}}, req, calls.CallOptions{})
			bare = append(bare, time.Since(start))
			if out.Result.Error != nil {
				b.Fatal(out.Result.Error)
			}
		}
		report(b, "live", live)
		report(b, "bare", bare)
		report(b, "replay", replayed)
	})
}

// BenchmarkConcurrentSlowCalls measures the calls per second one host
// sustains with 1,000 sessions each making one model call to a server that
// answers after 200 ms: each turn holds its goroutine (parked on the
// socket, no busy-wait) and its activation slot while it waits. b.N is
// ignored beyond the first round.
func BenchmarkConcurrentSlowCalls(b *testing.B) {
	benchStores(b, func(b *testing.B, st store.Store) {
		srv := instantChat(b, 200*time.Millisecond)
		f := benchHost(b, st, map[string]abi.TurnFunc{"slow": func(ctx context.Context, r *abi.TurnRequest) (*abi.TurnResult, error) {
			res := abi.Call(ctx, &abi.CallRequest{Kind: abi.CallKindModel, Model: &abi.ModelRequest{Endpoint: "chat",
				Messages: []abi.ModelMessage{{Role: abi.RoleUser, Content: r.Session.SessionID}}}})
			if res.Error != nil {
				return nil, res.Error
			}
			return &abi.TurnResult{}, nil
		}}, srv.URL)
		a := f.agent("slow")
		const sessions = 1000
		keys := make([]store.ActorKey, sessions)
		for i := range keys {
			keys[i] = f.session(a)
		}
		b.ResetTimer()
		start := time.Now()
		for _, k := range keys {
			f.signal(k)
		}
		for _, k := range keys {
			f.committed(k)
		}
		wall := time.Since(start)
		b.StopTimer()
		b.ReportMetric(float64(sessions)/wall.Seconds(), "calls/s")
		b.ReportMetric(wall.Seconds(), "wall_s")
	})
}

func report(b *testing.B, name string, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	b.ReportMetric(float64(ds[len(ds)/2].Microseconds()), name+"_p50_us")
	b.ReportMetric(float64(ds[len(ds)*99/100].Microseconds()), name+"_p99_us")
}
