package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/api"
	"github.com/paddock-dev/paddock/host/api/client"
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

const token = "s3cret"

// newServer starts the real API — a host on a SQLite store, running wasm
// modules and plugin workers — behind httptest and returns its URL.
func newServer(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	quiet := slog.New(slog.DiscardHandler)
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "p.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	rt, err := wasm.New(ctx, wasm.Config{CacheDir: wasmtest.CacheDir(t), MemoryLimitPages: 1024, TurnTimeout: time.Minute}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Close(context.Background()) })
	pm := pluginhost.NewManager(quiet, pluginhost.Options{})
	t.Cleanup(func() { _ = pm.Close(context.Background()) })
	r := runner.New(runner.NewWasm(rt, st), pm, st)
	pol := host.DefaultPolicy()
	pol.IdleTimeout, pol.ScanInterval, pol.LeaseTTL = time.Second, 100*time.Millisecond, 3*time.Second
	pol.BackoffMin, pol.BackoffMax, pol.MaxAttempts = 20*time.Millisecond, 100*time.Millisecond, 2
	h, err := host.New(host.Options{Store: st, Runner: r, Policy: pol, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	hctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = h.Run(hctx); close(done) }()
	srv := httptest.NewServer(api.New(api.Options{Host: h, Modules: r, Plugins: r, AuthToken: token,
		MaxBodyBytes: 1 << 20, MaxModuleBytes: 32 << 20, Logger: quiet}))
	t.Cleanup(func() { srv.Close(); cancel(); <-done })
	return srv.URL
}

// wantCode fails t unless err is an *client.Error with status and code.
func wantCode(t *testing.T, what string, err error, status int, code string) *client.Error {
	t.Helper()
	e := client.AsError(err)
	if e == nil || e.Status != status || e.Code != code {
		t.Fatalf("%s: %v, want HTTP %d %s", what, err, status, code)
	}
	if !errors.Is(err, &client.Error{Code: code}) || !errors.Is(err, &client.Error{Status: status}) || !client.IsCode(err, code) {
		t.Fatalf("%s: errors.Is does not match code %s / status %d", what, code, status)
	}
	return e
}

// poll calls f every 50 ms until it reports true or a minute passed.
func poll(t *testing.T, what string, f func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !f(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestClientAgainstTheRealAPI calls every method of the client against a
// real host and API: the typed answers, the raw body and status options,
// and the decoded errors.
func TestClientAgainstTheRealAPI(t *testing.T) {
	base := newServer(t)
	ctx := context.Background()
	c := client.New(base+"/", client.WithToken(token), client.WithUserAgent("paddock-client-test"),
		client.WithHTTPClient(&http.Client{Transport: http.DefaultTransport}))
	if c.BaseURL() != base {
		t.Errorf("BaseURL %q, want %q", c.BaseURL(), base)
	}

	// Health needs no token.
	hl, err := client.New(base).Health(ctx)
	if err != nil || hl.Status != "ok" || hl.Store != "sqlite" || hl.HostID == "" {
		t.Fatalf("Health: %+v %v", hl, err)
	}

	// 401 with a wrong or missing token.
	_, err = client.New(base, client.WithToken("wrong")).ListAgents(ctx)
	wantCode(t, "wrong token", err, 401, client.CodeUnauthenticated)
	if !client.IsUnauthenticated(err) {
		t.Error("IsUnauthenticated is false for a 401")
	}
	_, err = client.New(base).ListModules(ctx)
	wantCode(t, "no token", err, 401, client.CodeUnauthenticated)

	// Modules.
	_, notesWasm := wasmtest.BuildExample(t, wasmtest.Notes)
	_, faultyWasm := wasmtest.BuildExample(t, wasmtest.Faulty)
	var raw json.RawMessage
	var status int
	m, err := c.UploadModule(ctx, notesWasm, client.Raw(&raw), client.Status(&status))
	if err != nil || !strings.HasPrefix(m.Digest, "sha256:") || (m.Created == nil || !*m.Created) || m.Size != int64(len(notesWasm)) || m.ABIVersion == 0 || status != 201 {
		t.Fatalf("UploadModule: %+v status %d %v", m, status, err)
	}
	var rawModule map[string]any
	if err := json.Unmarshal(raw, &rawModule); err != nil || rawModule["digest"] != m.Digest {
		t.Errorf("Raw body of UploadModule: %s (%v)", raw, err)
	}
	again, err := c.UploadModule(ctx, notesWasm, client.Status(&status))
	if err != nil || again.Created == nil || *again.Created || again.Digest != m.Digest || status != 200 {
		t.Errorf("UploadModule again: %+v status %d %v", again, status, err)
	}
	fm, err := c.UploadModule(ctx, faultyWasm)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.UploadModule(ctx, []byte("not wasm"))
	wantCode(t, "UploadModule of junk", err, 400, client.CodeInvalidModule)
	ms, err := c.ListModules(ctx)
	if err != nil || len(ms) != 2 {
		t.Errorf("ListModules: %+v %v", ms, err)
	}
	if got, err := c.GetModule(ctx, m.Digest); err != nil || got.Digest != m.Digest || got.Size != m.Size || got.Created != nil {
		t.Errorf("GetModule: %+v %v", got, err)
	}
	_, err = c.GetModule(ctx, "sha256:"+strings.Repeat("0", 64))
	if e := wantCode(t, "GetModule of an unknown digest", err, 404, client.CodeModuleNotFound); e.Field != "digest" || !client.IsNotFound(err) {
		t.Errorf("GetModule 404: %+v", e)
	}

	// Plugins.
	path, sum := plugintest.Build(t, plugintest.Notes)
	p, err := c.RegisterPlugin(ctx, client.PluginRegistration{Name: "notesp", Path: path, SHA256: sum, Env: map[string]string{"X": "1"}, Processes: 1}, client.Status(&status))
	if err != nil || p.Name != "notesp" || p.SHA256 != sum || p.Processes != 1 || len(p.EnvNames) != 1 || p.EnvNames[0] != "X" || status != 201 {
		t.Fatalf("RegisterPlugin: %+v status %d %v", p, status, err)
	}
	_, err = c.RegisterPlugin(ctx, client.PluginRegistration{Name: "bad", Path: path, SHA256: "ABC"})
	if e := wantCode(t, "RegisterPlugin with a bad checksum", err, 400, client.CodeInvalidField); e.Field != "sha256" || !client.IsBadRequest(err) {
		t.Errorf("RegisterPlugin 400: %+v", e)
	}
	if ps, err := c.ListPlugins(ctx); err != nil || len(ps) != 1 || ps[0].Name != "notesp" {
		t.Errorf("ListPlugins: %+v %v", ps, err)
	}
	if gp, err := c.GetPlugin(ctx, "notesp"); err != nil || gp.Path != p.Path {
		t.Errorf("GetPlugin: %+v %v", gp, err)
	}
	_, err = c.GetPlugin(ctx, "nope")
	wantCode(t, "GetPlugin of an unknown name", err, 404, client.CodePluginNotFound)

	// Agents.
	a, err := c.CreateAgent(ctx, client.CreateAgentRequest{Name: "notes", Module: m.Digest})
	if err != nil || a.Name != "notes" || a.Kind != store.KindWasm || a.Module != m.Digest || a.UID == "" || a.CrashPolicy == "" {
		t.Fatalf("CreateAgent: %+v %v", a, err)
	}
	_, err = c.CreateAgent(ctx, client.CreateAgentRequest{Name: "notes", Module: m.Digest})
	if e := wantCode(t, "CreateAgent of a taken name", err, 409, client.CodeAgentExists); e.Field != "name" || !client.IsConflict(err) {
		t.Errorf("CreateAgent 409: %+v", e)
	}
	_, err = c.CreateAgent(ctx, client.CreateAgentRequest{Name: "Bad Name", Module: m.Digest})
	if e := wantCode(t, "CreateAgent with a bad name", err, 400, client.CodeInvalidField); e.Field != "name" {
		t.Errorf("CreateAgent 400 field %q, want name", e.Field)
	}
	if _, err := c.CreateAgent(ctx, client.CreateAgentRequest{Name: "faulty", Module: fm.Digest, CrashPolicy: "restart"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateAgent(ctx, client.CreateAgentRequest{Name: "viaplugin", Module: fm.Digest}); err != nil {
		t.Fatal(err)
	}
	up, err := c.UpdateAgent(ctx, "viaplugin", client.UpdateAgentRequest{Plugin: "notesp", CrashPolicy: "sleep"})
	if err != nil || up.Kind != store.KindPlugin || up.Plugin == "" || up.Module != "" || up.CrashPolicy != store.CrashSleep {
		t.Errorf("UpdateAgent: %+v %v", up, err)
	}
	_, err = c.UpdateAgent(ctx, "nobody", client.UpdateAgentRequest{Module: m.Digest})
	wantCode(t, "UpdateAgent of an unknown agent", err, 404, client.CodeAgentNotFound)
	if as, err := c.ListAgents(ctx); err != nil || len(as) != 3 {
		t.Errorf("ListAgents: %+v %v", as, err)
	}
	if ga, err := c.GetAgent(ctx, "notes"); err != nil || ga.UID != a.UID {
		t.Errorf("GetAgent: %+v %v", ga, err)
	}
	_, err = c.GetAgent(ctx, "nobody")
	if e := wantCode(t, "GetAgent of an unknown agent", err, 404, client.CodeAgentNotFound); e.Field != "agent" {
		t.Errorf("GetAgent 404 field %q", e.Field)
	}

	// Sessions.
	s, err := c.CreateSession(ctx, "notes", client.SessionRequest{Key: "k1", Input: []byte("in")})
	if err != nil || s.SessionID == "" || s.Agent != "notes" || s.AgentUID != a.UID || s.Key != "k1" || string(s.Input) != "in" || (s.Created == nil || !*s.Created) || s.Status == "" {
		t.Fatalf("CreateSession: %+v %v", s, err)
	}
	_, err = c.CreateSession(ctx, "notes", client.SessionRequest{Key: "k1"})
	wantCode(t, "CreateSession with a taken key", err, 409, client.CodeSessionExists)
	g, err := c.GetOrCreateSession(ctx, "notes", client.SessionRequest{Key: "k1"}, client.Status(&status))
	if err != nil || g.SessionID != s.SessionID || g.Created == nil || *g.Created || status != 200 {
		t.Errorf("GetOrCreateSession of k1: %+v status %d %v", g, status, err)
	}
	_, err = c.GetOrCreateSession(ctx, "notes", client.SessionRequest{})
	if e := wantCode(t, "GetOrCreateSession without a key", err, 400, client.CodeMissingField); e.Field != "key" {
		t.Errorf("GetOrCreateSession 400 field %q, want key", e.Field)
	}
	for i := range 2 {
		if _, err := c.CreateSession(ctx, "notes", client.SessionRequest{CrashPolicy: []string{"sleep", "destroy"}[i]}); err != nil {
			t.Fatal(err)
		}
	}
	var seen []string
	for cursor := ""; ; {
		page, err := c.ListSessions(ctx, "notes", client.ListSessionsOptions{Limit: 2, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range page.Sessions {
			seen = append(seen, x.SessionID)
		}
		if page.NextCursor == "" {
			break
		}
		cursor = page.NextCursor
	}
	if len(seen) != 3 {
		t.Errorf("ListSessions pages: %v, want 3 sessions", seen)
	}
	_, err = c.ListSessions(ctx, "notes", client.ListSessionsOptions{Limit: 501})
	if e := wantCode(t, "ListSessions with limit 501", err, 400, client.CodeInvalidParameter); e.Field != "limit" {
		t.Errorf("ListSessions 400 field %q, want limit", e.Field)
	}
	if byKey, err := c.SessionByKey(ctx, "notes", "k1"); err != nil || byKey.SessionID != g.SessionID {
		t.Errorf("SessionByKey k1: %+v %v, want %s", byKey, err, g.SessionID)
	}
	_, err = c.SessionByKey(ctx, "notes", "no-such-key")
	wantCode(t, "SessionByKey of an unknown key", err, 404, client.CodeSessionNotFound)
	_, err = c.GetSession(ctx, "notes", "no-such-session")
	if e := wantCode(t, "GetSession of an unknown session", err, 404, client.CodeSessionNotFound); e.Field != "session" {
		t.Errorf("GetSession 404 field %q", e.Field)
	}

	// Signals, events, transcript, alarms.
	r1, err := c.SendSignal(ctx, "notes", s.SessionID, client.Signal{Message: "remember milk", IdempotencyKey: "i1", ForceAllocation: true})
	if err != nil || r1.Kind != client.SignalMessage || r1.EventID == 0 || r1.Seq == 0 || !r1.Created {
		t.Fatalf("SendSignal: %+v %v", r1, err)
	}
	if again, err := c.SendSignal(ctx, "notes", s.SessionID, client.Signal{Message: "remember milk", IdempotencyKey: "i1"}); err != nil || again.Created || again.EventID != r1.EventID {
		t.Errorf("SendSignal replay: %+v %v", again, err)
	}
	_, err = c.SendSignal(ctx, "notes", s.SessionID, client.Signal{Message: "something else", IdempotencyKey: "i1"})
	wantCode(t, "SendSignal with a reused key", err, 409, client.CodeIdempotencyKeyReused)
	_, err = c.SendSignal(ctx, "notes", s.SessionID, client.Signal{})
	if e := wantCode(t, "SendSignal without a message", err, 400, client.CodeMissingField); e.Field != "message" {
		t.Errorf("SendSignal 400 field %q, want message", e.Field)
	}
	r2, err := c.SendSignal(ctx, "notes", s.SessionID, client.Signal{Message: "remind 3600 call home", Data: json.RawMessage(`{"n":1}`)})
	if err != nil {
		t.Fatal(err)
	}
	page, err := c.Transcript(ctx, "notes", s.SessionID, client.TranscriptOptions{Wait: 30 * time.Second})
	if err != nil || len(page.Turns) == 0 || page.Turns[0].EventID != r1.EventID || page.NextAfter != page.Turns[len(page.Turns)-1].TurnNo {
		t.Fatalf("Transcript (long-poll): %+v %v", page, err)
	}
	poll(t, "the second turn", func() bool {
		p, err := c.Transcript(ctx, "notes", s.SessionID, client.TranscriptOptions{After: 1, Limit: 10, Wait: time.Second})
		return err == nil && len(p.Turns) == 1 && p.Turns[0].EventID == r2.EventID && p.NextAfter == 2
	})
	_, err = c.Transcript(ctx, "notes", s.SessionID, client.TranscriptOptions{Wait: 2 * time.Minute})
	if e := wantCode(t, "Transcript with wait 2m", err, 400, client.CodeInvalidParameter); e.Field != "wait" {
		t.Errorf("Transcript 400 field %q, want wait", e.Field)
	}
	als, err := c.ListAlarms(ctx, "notes", s.SessionID)
	if err != nil || len(als) != 1 || !strings.HasPrefix(als[0].Name, "remind-") {
		t.Errorf("ListAlarms: %+v %v", als, err)
	}
	evs, err := c.ListEvents(ctx, "notes", s.SessionID, client.ListEventsOptions{Status: store.EventDone})
	if err != nil || len(evs) != 2 || evs[0].ID != r1.EventID || evs[0].IdempotencyKey != "i1" || evs[1].ID != r2.EventID {
		t.Errorf("ListEvents done: %+v %v", evs, err)
	}
	if evs, err := c.ListEvents(ctx, "notes", s.SessionID, client.ListEventsOptions{After: r1.EventID, Limit: 1}); err != nil || len(evs) != 1 || evs[0].ID != r2.EventID {
		t.Errorf("ListEvents after %d: %+v %v", r1.EventID, evs, err)
	}
	_, err = c.ListEvents(ctx, "notes", s.SessionID, client.ListEventsOptions{Status: "bogus"})
	if e := wantCode(t, "ListEvents with a bad status", err, 400, client.CodeInvalidParameter); e.Field != "status" {
		t.Errorf("ListEvents 400 field %q", e.Field)
	}
	ev, err := c.GetEvent(ctx, "notes", s.SessionID, r2.EventID)
	if err != nil || ev.ID != r2.EventID || ev.Status != store.EventDone || !strings.Contains(string(ev.Payload), "call home") {
		t.Errorf("GetEvent: %+v %v", ev, err)
	}
	_, err = c.GetEvent(ctx, "notes", s.SessionID, 9999)
	wantCode(t, "GetEvent of an unknown event", err, 404, client.CodeEventNotFound)
	_, err = c.Redrive(ctx, "notes", s.SessionID, r1.EventID)
	wantCode(t, "Redrive of a done event", err, 409, client.CodeNotDeadLetter)
	_, err = c.Cancel(ctx, "notes", s.SessionID, r1.EventID)
	wantCode(t, "Cancel of a done event", err, 409, client.CodeEventClosed)
	_, err = c.SendSignal(ctx, "notes", s.SessionID, client.Signal{Kind: client.SignalCancel})
	wantCode(t, "cancel with nothing in flight", err, 409, client.CodeNothingInFlight)

	// Dead letters, redrive, discard, and a cancel of a queued event.
	fs, err := c.CreateSession(ctx, "faulty", client.SessionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	bad, err := c.SendSignal(ctx, "faulty", fs.SessionID, client.Signal{Message: "error"})
	if err != nil {
		t.Fatal(err)
	}
	poll(t, "a dead letter", func() bool {
		x, err := c.GetSession(ctx, "faulty", fs.SessionID)
		return err == nil && x.DeadLetters == 1 && x.OpenEvents == 0
	})
	for name, list := range map[string]func() ([]client.DeadLetter, error){
		"AgentDeadLetters": func() ([]client.DeadLetter, error) {
			return c.AgentDeadLetters(ctx, "faulty", client.DeadLetterOptions{Session: fs.SessionID, Limit: 10})
		},
		"SessionDeadLetters": func() ([]client.DeadLetter, error) {
			return c.SessionDeadLetters(ctx, "faulty", fs.SessionID, client.DeadLetterOptions{})
		},
	} {
		dls, err := list()
		if err != nil || len(dls) != 1 || dls[0].SessionID != fs.SessionID || dls[0].Event.ID != bad.EventID || len(dls[0].Event.Errors) != 2 {
			t.Errorf("%s: %+v %v", name, dls, err)
		}
	}
	if ev, err := c.GetEvent(ctx, "faulty", fs.SessionID, bad.EventID); err != nil || ev.Status != store.EventDeadLetter || len(ev.Errors) != 2 || ev.Errors[0].Error == "" {
		t.Errorf("GetEvent of a dead letter: %+v %v", ev, err)
	}
	if ev, err := c.Redrive(ctx, "faulty", fs.SessionID, bad.EventID); err != nil || ev.Status != store.EventOpen {
		t.Errorf("Redrive: %+v %v", ev, err)
	}
	poll(t, "the redriven event to dead-letter again", func() bool {
		x, err := c.GetSession(ctx, "faulty", fs.SessionID)
		return err == nil && x.DeadLetters == 1 && x.OpenEvents == 0
	})
	if ev, err := c.Discard(ctx, "faulty", fs.SessionID, bad.EventID); err != nil || ev.Status != store.EventDiscarded {
		t.Errorf("Discard: %+v %v", ev, err)
	}
	_, err = c.Discard(ctx, "faulty", fs.SessionID, bad.EventID)
	wantCode(t, "Discard of a discarded event", err, 409, client.CodeNotDeadLetter)
	think, err := c.SendSignal(ctx, "faulty", fs.SessionID, client.Signal{Message: "think 20000"})
	if err != nil {
		t.Fatal(err)
	}
	queued, err := c.SendSignal(ctx, "faulty", fs.SessionID, client.Signal{Message: "queued"})
	if err != nil {
		t.Fatal(err)
	}
	if cr, err := c.Cancel(ctx, "faulty", fs.SessionID, queued.EventID); err != nil || cr.Kind != client.SignalCancel || cr.EventID != queued.EventID || cr.Status != string(store.EventCancelled) {
		t.Errorf("Cancel of a queued event: %+v %v", cr, err)
	}
	poll(t, "the think turn to start", func() bool {
		ev, err := c.GetEvent(ctx, "faulty", fs.SessionID, think.EventID)
		return err == nil && ev.Binding != ""
	})
	steer, err := c.SendSignal(ctx, "faulty", fs.SessionID, client.Signal{Kind: client.SignalSteer, Message: "stop"})
	if err != nil || steer.Kind != client.SignalSteer || !steer.Created {
		t.Errorf("steer: %+v %v", steer, err)
	}

	// Destroy, then 410 on a signal; a wake of a live session.
	w, err := c.SendSignal(ctx, "faulty", fs.SessionID, client.Signal{Kind: client.SignalWake})
	if err != nil || w.Kind != client.SignalWake || w.Status == "" {
		t.Errorf("wake: %+v %v", w, err)
	}
	d, err := c.DestroySession(ctx, "faulty", fs.SessionID)
	if err != nil || d.Status != store.SessionDestroyed || d.DestroyTS == nil {
		t.Errorf("DestroySession: %+v %v", d, err)
	}
	_, err = c.SendSignal(ctx, "faulty", fs.SessionID, client.Signal{Message: "hello?"})
	wantCode(t, "signal to a destroyed session", err, 410, client.CodeSessionDestroyed)
	if !client.IsGone(err) {
		t.Error("IsGone is false for a 410")
	}
}

// TestErrorsWithoutTheAPIBody covers answers that are not the API's error
// body, transport errors and cancellation: they are told apart from API
// errors.
func TestErrorsWithoutTheAPIBody(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "bad gateway", http.StatusBadGateway)
	}))
	defer srv.Close()
	_, err := client.New(srv.URL).Health(context.Background())
	e := client.AsError(err)
	if e == nil || e.Status != 502 || e.Code != client.CodeHTTPError || e.Message != "bad gateway" || !client.IsServerError(err) {
		t.Errorf("502 text answer: %#v", err)
	}
	if got := e.Error(); got != "http_error (HTTP 502): bad gateway" {
		t.Errorf("Error() = %q", got)
	}
	if got := (&client.Error{Status: 400, Code: "invalid_field", Message: "m", Field: "f"}).Error(); got != "invalid_field (HTTP 400): m [field f]" {
		t.Errorf("Error() with a field = %q", got)
	}

	srv.Close()
	_, err = client.New(srv.URL).Health(context.Background())
	var ue *url.Error
	if err == nil || client.AsError(err) != nil || !errors.As(err, &ue) {
		t.Errorf("transport error: %#v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := client.New(srv.URL).Health(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled call: %v", err)
	}
}
