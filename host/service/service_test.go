package service_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/runner"
	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/sqlite"
	"github.com/paddock-dev/paddock/wasm"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// These tests drive the service as a second front door would: no HTTP,
// the real SQLite store in a temp dir, the real wasm runner and the notes
// example module. A host that is not running takes Ensure as a no-op, so
// a test sees exactly the store effects of each operation; TestSignalsRun
// runs the host to see Ensure wake it.

type fixture struct {
	// path is the SQLite database file.
	path  string
	svc   *service.Service
	st    store.Store
	h     *host.Host
	agent store.Agent
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	path := filepath.Join(t.TempDir(), "p.db")
	st, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	rt, err := wasm.New(ctx, wasm.Config{CacheDir: wasmtest.CacheDir(t), MemoryLimitPages: 1024, TurnTimeout: time.Minute}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(context.Background()) })
	wr := runner.NewWasm(rt, st)
	pol := host.DefaultPolicy()
	pol.IdleTimeout, pol.ScanInterval, pol.LeaseTTL = time.Second, 100*time.Millisecond, 3*time.Second
	h, err := host.New(host.Options{Store: st, Runner: wr, Policy: pol, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{path: path, svc: service.New(h, wr, nil), st: st, h: h}
	_, b := wasmtest.BuildExample(t, wasmtest.Notes)
	m, created, err := f.svc.UploadModule(ctx, b)
	if err != nil || !created {
		t.Fatalf("upload: %v (created %v)", err, created)
	}
	if f.agent, err = f.svc.CreateAgent(ctx, "notes", service.Binding{Module: m.Digest}); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) session(t *testing.T) store.Session {
	t.Helper()
	x, err := f.svc.CreateSession(context.Background(), f.agent, service.SessionParams{})
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// events returns the session's stored events.
func (f *fixture) events(t *testing.T, x store.Session) []store.Event {
	t.Helper()
	es, err := f.svc.ListEvents(context.Background(), x, "", service.Page{})
	if err != nil {
		t.Fatal(err)
	}
	return es
}

// invalidField asserts err is an *InvalidError naming field.
func invalidField(t *testing.T, err error, field string) {
	t.Helper()
	var ie *service.InvalidError
	if !errors.As(err, &ie) || ie.Field != field || ie.Message == "" {
		t.Fatalf("got %v (%T), want an *InvalidError for %q", err, err, field)
	}
}

func conflict(t *testing.T, err error, want service.Conflict) {
	t.Helper()
	var ce *service.ConflictError
	if !errors.As(err, &ce) || ce.Reason != want || !errors.Is(err, store.ErrConflict) {
		t.Fatalf("got %v (%T), want a *ConflictError %s", err, err, want)
	}
}

func TestASignalOverTheSizeLimitIsRefusedNamingTheFieldAndWritesNothing(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	x := f.session(t)
	_, err := f.svc.Signal(ctx, f.agent, x.SessionID, service.SignalParams{Message: strings.Repeat("x", service.MaxEventPayloadBytes)})
	var tl *service.TooLargeError
	if !errors.As(err, &tl) || tl.Field != "message" || tl.Limit != service.MaxEventPayloadBytes || tl.Size <= tl.Limit {
		t.Fatalf("got %v, want a *TooLargeError for message over %d", err, service.MaxEventPayloadBytes)
	}
	if es := f.events(t, x); len(es) != 0 {
		t.Fatalf("a refused signal stored %d events", len(es))
	}
	// Just under the limit (the encoding adds {"message":""}) is accepted.
	res, err := f.svc.Signal(ctx, f.agent, x.SessionID, service.SignalParams{Message: strings.Repeat("x", service.MaxEventPayloadBytes-64)})
	if err != nil || !res.Created || res.Kind != abi.EventMessage {
		t.Fatalf("a signal under the limit: %+v %v", res, err)
	}
}

func TestAnIdempotentResendReturnsTheFirstEventAndAReusedKeyIsAConflict(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	x := f.session(t)
	p := service.SignalParams{Message: "note buy milk", IdempotencyKey: "k-1"}
	first, err := f.svc.Signal(ctx, f.agent, x.SessionID, p)
	if err != nil || !first.Created {
		t.Fatalf("first: %+v %v", first, err)
	}
	again, err := f.svc.Signal(ctx, f.agent, x.SessionID, p)
	if err != nil || again.Created || again.Event.ID != first.Event.ID {
		t.Fatalf("re-send: %+v %v, want event %d, created false", again, err, first.Event.ID)
	}
	_, err = f.svc.Signal(ctx, f.agent, x.SessionID, service.SignalParams{Message: "note other", IdempotencyKey: "k-1"})
	conflict(t, err, service.ConflictIdempotencyKeyReused)
	// A steer with the key of a message is another signal too.
	_, err = f.svc.Signal(ctx, f.agent, x.SessionID, service.SignalParams{Kind: abi.EventSteer, Message: "note buy milk", IdempotencyKey: "k-1"})
	conflict(t, err, service.ConflictIdempotencyKeyReused)
	if es := f.events(t, x); len(es) != 1 {
		t.Fatalf("%d events stored, want 1", len(es))
	}
}

func TestADestroyedSessionRefusesSignalsAndCancels(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	x := f.session(t)
	queued, err := f.svc.Signal(ctx, f.agent, x.SessionID, service.SignalParams{Message: "note a"})
	if err != nil {
		t.Fatal(err)
	}
	d, err := f.svc.DestroySession(ctx, x)
	if err != nil || d.Status != store.SessionDestroyed || d.DestroyTS == nil {
		t.Fatalf("destroy: %+v %v", d, err)
	}
	for _, p := range []service.SignalParams{
		{Message: "note b"}, {Kind: abi.EventSteer, Message: "louder"}, {Kind: service.SignalWake},
		{Kind: service.SignalCancel}, {Kind: service.SignalCancel, EventID: queued.Event.ID},
	} {
		if _, err := f.svc.Signal(ctx, f.agent, x.SessionID, p); !errors.Is(err, store.ErrSessionDestroyed) {
			t.Errorf("signal %+v to a destroyed session: %v, want ErrSessionDestroyed", p, err)
		}
	}
	es := f.events(t, x)
	if len(es) != 1 || es[0].Status != store.EventDiscarded {
		t.Fatalf("events after destroy: %+v, want the one discarded", es)
	}
}

func TestSignalValidationNamesTheField(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	x := f.session(t)
	for field, p := range map[string]service.SignalParams{
		"kind":            {Kind: "alarm", Message: "x"},
		"message":         {Message: "nul \x00"},
		"idempotency_key": {Message: "x", IdempotencyKey: "has space"},
		"event_id":        {Message: "x", EventID: 1},
	} {
		_, err := f.svc.Signal(ctx, f.agent, x.SessionID, p)
		invalidField(t, err, field)
	}
	_, err := f.svc.Signal(ctx, f.agent, x.SessionID, service.SignalParams{Data: []byte("null")})
	var ie *service.InvalidError
	if !errors.As(err, &ie) || !ie.Missing || ie.Field != "message" {
		t.Fatalf("a message without message or data: %v, want a missing message", err)
	}
	_, err = f.svc.Signal(ctx, f.agent, "no-such-session", service.SignalParams{Message: "x"})
	var nf *service.NotFoundError
	if !errors.As(err, &nf) || nf.Resource != service.ResourceSession || !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a signal to an unknown session: %v", err)
	}
	_, err = f.svc.Signal(ctx, f.agent, x.SessionID, service.SignalParams{Kind: service.SignalCancel})
	conflict(t, err, service.ConflictNothingInFlight)
	if es := f.events(t, x); len(es) != 0 {
		t.Fatalf("refused signals stored %d events", len(es))
	}
}

func TestCancelAQueuedEventAndRedriveOnlyDeadLetters(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	x := f.session(t)
	res, err := f.svc.Signal(ctx, f.agent, x.SessionID, service.SignalParams{Message: "note a"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := f.svc.CancelEvent(ctx, f.agent, x.ActorKey, res.Event.ID)
	if err != nil || c.Event.Status != store.EventCancelled || c.InFlight {
		t.Fatalf("cancel queued: %+v %v", c, err)
	}
	_, err = f.svc.CancelEvent(ctx, f.agent, x.ActorKey, res.Event.ID)
	conflict(t, err, service.ConflictEventClosed)
	_, err = f.svc.RedriveEvent(ctx, x, res.Event.ID)
	conflict(t, err, service.ConflictNotDeadLetter)
	_, err = f.svc.DiscardEvent(ctx, x, res.Event.ID+1)
	var nf *service.NotFoundError
	if !errors.As(err, &nf) || nf.Resource != service.ResourceEvent || nf.Field != "event" {
		t.Fatalf("discard of an unknown event: %v", err)
	}
	e, chain, err := f.svc.GetEvent(ctx, x, res.Event.ID)
	if err != nil || e.Status != store.EventCancelled || len(chain) != 0 {
		t.Fatalf("get event: %+v %v %v", e, chain, err)
	}
}

func TestAgentsAndSessionsRefuseBadInputNamingTheField(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	_, err := f.svc.CreateAgent(ctx, "notes", service.Binding{Module: f.agent.ModuleDigest})
	conflict(t, err, service.ConflictAgentExists)
	_, err = f.svc.CreateAgent(ctx, "Bad Name", service.Binding{Module: f.agent.ModuleDigest})
	invalidField(t, err, "name")
	_, err = f.svc.CreateAgent(ctx, "other", service.Binding{Module: f.agent.ModuleDigest, CrashPolicy: "explode"})
	invalidField(t, err, "crash_policy")
	_, err = f.svc.CreateAgent(ctx, "other", service.Binding{Module: "sha256:" + strings.Repeat("0", 64)})
	var nf *service.NotFoundError
	if !errors.As(err, &nf) || !nf.Referenced || nf.Resource != service.ResourceModule || nf.Field != "module" {
		t.Fatalf("an agent of an unknown module: %v", err)
	}
	up, err := f.svc.UpdateAgent(ctx, f.agent, service.Binding{Module: f.agent.ModuleDigest, CrashPolicy: "sleep"})
	if err != nil || up.CrashPolicy != store.CrashSleep {
		t.Fatalf("update: %+v %v", up, err)
	}
	_, _, err = f.svc.UploadModule(ctx, []byte("not wasm"))
	var rj *service.RejectedError
	if !errors.As(err, &rj) || rj.Resource != service.ResourceModule {
		t.Fatalf("a bad module: %v", err)
	}
	_, _, err = f.svc.RegisterPlugin(ctx, service.PluginParams{Name: "p1", Path: "/bin/true", SHA256: strings.Repeat("0", 64)})
	if !errors.Is(err, service.ErrPluginsDisabled) {
		t.Fatalf("a plugin on a host without plugins: %v", err)
	}
	_, _, err = f.svc.RegisterPlugin(ctx, service.PluginParams{Name: "p1", Path: "/bin/true", SHA256: "abc"})
	invalidField(t, err, "sha256")

	_, err = f.svc.CreateSession(ctx, f.agent, service.SessionParams{Key: "has space"})
	invalidField(t, err, "key")
	_, err = f.svc.CreateSession(ctx, f.agent, service.SessionParams{Input: make([]byte, abi.MaxStateBytes+1)})
	invalidField(t, err, "input")
	_, _, err = f.svc.GetOrCreateSession(ctx, f.agent, service.SessionParams{})
	invalidField(t, err, "key")
	a, created, err := f.svc.GetOrCreateSession(ctx, f.agent, service.SessionParams{Key: "user-42"})
	if err != nil || !created || a.CrashPolicy != f.agent.CrashPolicy {
		t.Fatalf("get-or-create: %+v %v %v", a, created, err)
	}
	b, created, err := f.svc.GetOrCreateSession(ctx, f.agent, service.SessionParams{Key: "user-42"})
	if err != nil || created || b.SessionID != a.SessionID {
		t.Fatalf("get-or-create again: %+v %v %v, want session %s", b, created, err, a.SessionID)
	}
	_, err = f.svc.CreateSession(ctx, f.agent, service.SessionParams{Key: "user-42"})
	conflict(t, err, service.ConflictSessionExists)
}

func TestPagesHaveDefaultsBoundsAndACursor(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	for range 3 {
		f.session(t)
	}
	_, _, err := f.svc.ListSessions(ctx, f.agent, "", service.MaxSessionLimit+1)
	invalidField(t, err, "limit")
	seen := map[string]bool{}
	for cursor := ""; ; {
		xs, next, err := f.svc.ListSessions(ctx, f.agent, cursor, 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range xs {
			seen[x.SessionID] = true
		}
		if next == "" {
			break
		}
		cursor = next
	}
	if len(seen) != 3 {
		t.Fatalf("paged %d sessions, want 3", len(seen))
	}
	x := f.session(t)
	_, err = f.svc.ListEvents(ctx, x, "finished", service.Page{})
	invalidField(t, err, "status")
	_, err = f.svc.ListEvents(ctx, x, "", service.Page{Limit: service.MaxPageLimit + 1})
	invalidField(t, err, "limit")
	_, err = f.svc.ListDeadLetters(ctx, f.agent, "", service.Page{After: -1})
	invalidField(t, err, "after")
	_, _, err = f.svc.Transcript(ctx, x, service.Page{}, 2*service.MaxTranscriptWait)
	invalidField(t, err, "wait")
}

func TestTranscriptWaitEndsAtItsDeadlineOrWithTheContext(t *testing.T) {
	f := newFixture(t)
	x := f.session(t)
	start := time.Now()
	turns, next, err := f.svc.Transcript(context.Background(), x, service.Page{After: 4}, 300*time.Millisecond)
	if err != nil || turns == nil || len(turns) != 0 || next != 4 || time.Since(start) < 300*time.Millisecond {
		t.Fatalf("an idle wait: %v %d %v after %v", turns, next, err, time.Since(start))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, _, err := f.svc.Transcript(ctx, x, service.Page{}, time.Minute); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a wait whose context ends: %v", err)
	}
}

// TestSignalsRunOnARunningHost: an accepted signal wakes the runtime
// (Ensure) and the transcript long-poll returns its turn.
func TestSignalsRunOnARunningHost(t *testing.T) {
	f := newFixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = f.h.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	x := f.session(t)
	for _, m := range []string{"note buy milk", "list"} {
		if _, err := f.svc.Signal(ctx, f.agent, x.SessionID, service.SignalParams{Message: m}); err != nil {
			t.Fatal(err)
		}
	}
	var turns []store.Turn
	var after int64
	for deadline := time.Now().Add(2 * time.Minute); len(turns) < 2 && time.Now().Before(deadline); {
		got, next, err := f.svc.Transcript(ctx, x, service.Page{After: after}, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		turns, after = append(turns, got...), next
	}
	if len(turns) != 2 {
		t.Fatalf("%d turns committed, want 2", len(turns))
	}
	last := turns[1].Messages
	if len(last) == 0 || !strings.Contains(last[len(last)-1].Content, "buy milk") {
		t.Fatalf("the list turn does not carry the note: %+v", last)
	}
}
