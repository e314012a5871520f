package wasm_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/wasm"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// Test-binary state: the examples are compiled into the shared cache once
// (warm) before the tests' Runtimes load them from it, and tests that need
// no special configuration share one Runtime (shared), closed by TestMain.
var (
	warm struct {
		once sync.Once
		err  error
	}
	sharedRT struct {
		once sync.Once
		b    *bundle
	}
)

func TestMain(m *testing.M) {
	code := m.Run()
	if b := sharedRT.b; b != nil {
		b.rt.Close(context.Background())
	}
	os.Exit(code)
}

// warmCache compiles the examples into wasmtest.CacheDir once per binary,
// so that parallel tests do not all compile them cold at the same time.
func warmCache(t testing.TB) {
	t.Helper()
	_, notes := wasmtest.BuildExample(t, wasmtest.Notes)
	_, faulty := wasmtest.BuildExample(t, wasmtest.Faulty)
	dir := wasmtest.CacheDir(t)
	warm.once.Do(func() {
		ctx := context.Background()
		rt, err := wasm.New(ctx, wasm.Config{CacheDir: dir}, nil)
		if err != nil {
			warm.err = err
			return
		}
		defer rt.Close(ctx)
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i, body := range [][]byte{notes, faulty} {
			wg.Go(func() { _, errs[i] = rt.Validate(ctx, body) })
		}
		wg.Wait()
		warm.err = errors.Join(errs...)
	})
	if warm.err != nil {
		t.Fatalf("warm the compilation cache: %v", warm.err)
	}
}

// shared returns the binary's shared Runtime (default test configuration,
// see setup). Tests using it must not close it or unload modules.
func shared(t testing.TB) *bundle {
	t.Helper()
	warmCache(t)
	sharedRT.once.Do(func() { sharedRT.b = newBundle(t, wasm.Config{}) })
	if sharedRT.b == nil {
		t.Fatal("shared runtime failed to start")
	}
	return sharedRT.b
}

// logRecorder is a slog.Handler that keeps records for assertions.
type logRecorder struct {
	mu      sync.Mutex
	records []slog.Record
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecorder) WithGroup(string) slog.Handler            { return l }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, r.Clone())
	return nil
}

// find returns the records whose message contains substr.
func (l *logRecorder) find(substr string) []slog.Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []slog.Record
	for _, r := range l.records {
		if strings.Contains(r.Message, substr) {
			out = append(out, r)
		}
	}
	return out
}

func attr(r slog.Record, key string) string {
	var v string
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value.String()
			return false
		}
		return true
	})
	return v
}

// bundle is a Runtime and its log, from setup or shared.
type bundle struct {
	rt   *wasm.Runtime
	logs *logRecorder
}

// setup makes a Runtime for one test, closed at cleanup. Unset cfg fields
// get test defaults: the shared cache dir, a 32 MiB memory cap and a 5 s
// turn timeout.
func setup(t testing.TB, cfg wasm.Config) *bundle {
	t.Helper()
	warmCache(t)
	b := newBundle(t, cfg)
	t.Cleanup(func() {
		if err := b.rt.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return b
}

func newBundle(t testing.TB, cfg wasm.Config) *bundle {
	t.Helper()
	if cfg.CacheDir == "" {
		cfg.CacheDir = wasmtest.CacheDir(t)
	}
	if cfg.MemoryLimitPages == 0 {
		cfg.MemoryLimitPages = 512
	}
	if cfg.TurnTimeout == 0 {
		cfg.TurnTimeout = time.Minute // generous: a loaded machine must not turn work into timeouts
	}
	logs := &logRecorder{}
	rt, err := wasm.New(context.Background(), cfg, slog.New(logs))
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{rt: rt, logs: logs}
}

// notes loads the notes example (once per Runtime) and returns its digest.
func (b *bundle) notes(t testing.TB) string { return b.load(t, wasmtest.Notes) }

// faulty loads the faulty example (once per Runtime) and returns its digest.
func (b *bundle) faulty(t testing.TB) string { return b.load(t, wasmtest.Faulty) }

func (b *bundle) load(t testing.TB, pkg string) string {
	t.Helper()
	_, body := wasmtest.BuildExample(t, pkg)
	info, err := b.rt.Load(context.Background(), wasm.Digest(body), body)
	if err != nil {
		t.Fatalf("load %s: %v", pkg, err)
	}
	return info.Digest
}

func (b *bundle) instance(t testing.TB, digest string) *wasm.Instance {
	t.Helper()
	inst, err := b.rt.Instantiate(context.Background(), digest)
	if err != nil {
		t.Fatalf("instantiate: %v", err)
	}
	t.Cleanup(func() { inst.Close(context.Background()) })
	return inst
}

// request builds a message TurnRequest with a fresh turn_ref.
func request(msg string, state []byte, attempt int) *abi.TurnRequest {
	n := rand.Int64N(1 << 40)
	return &abi.TurnRequest{
		ABIVersion: abi.Version,
		TurnRef: abi.TurnRef{DeliveryID: fmt.Sprintf("dlv_%d", n), ActivationUID: "act_1", ActorEpoch: 1,
			ActorEventID: n, Revision: 0, AgentUID: "agt_1", SessionID: "ses_1"},
		Session:    abi.Session{AgentName: "test", SessionID: "ses_1"},
		Event:      abi.Event{ID: n, Kind: abi.EventMessage, Message: msg, AcceptedAt: time.Now().UTC()},
		State:      state,
		Transcript: []abi.Message{{Role: abi.RoleUser, Content: msg}},
		Attempt:    attempt,
	}
}

// reply returns a function that returns the single message of an ok
// result, failing t otherwise: reply(t)(inst.Turn(ctx, req)).
func reply(t testing.TB) func(*abi.TurnResult, error) string {
	return func(res *abi.TurnResult, err error) string {
		t.Helper()
		return replyOf(t, res, err)
	}
}

func replyOf(t testing.TB, res *abi.TurnResult, err error) string {
	t.Helper()
	if err != nil {
		t.Fatalf("turn: %v", err)
	}
	if res.Outcome != abi.OutcomeOK || len(res.Messages) != 1 || res.Messages[0].Role != abi.RoleAssistant {
		t.Fatalf("want one assistant message and outcome ok, got %+v", res)
	}
	return res.Messages[0].Content
}

// turnError asserts err is a *wasm.TurnError of kind.
func turnError(t testing.TB, err error, kind string) *wasm.TurnError {
	t.Helper()
	var te *wasm.TurnError
	if !errors.As(err, &te) {
		t.Fatalf("want a *wasm.TurnError of kind %s, got %T: %v", kind, err, err)
	}
	if te.Kind != kind {
		t.Fatalf("want kind %s, got %s: %v", kind, te.Kind, te)
	}
	return te
}
