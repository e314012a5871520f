package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/api"
	apiclient "github.com/paddock-dev/paddock/host/api/client"
	"github.com/paddock-dev/paddock/host/runner"
	"github.com/paddock-dev/paddock/host/stream"
	"github.com/paddock-dev/paddock/host/stream/streamtest"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/sqlite"
	"github.com/paddock-dev/paddock/wasm"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// streamAPI is a running host on SQLite behind the real API with a stream
// hub, like `paddock serve` wires them; the first stream request that
// carries a chunk is cut after it (a dropped connection).
type streamAPI struct {
	*realAPI
	st      store.Store
	streams atomic.Int64 // stream requests received
	resumes chan string  // Last-Event-ID of each stream request after the first
	cut     atomic.Bool  // cut the first stream after its first chunk
}

// startStreamAPI starts it; with idle the host does not run (tests that
// drive turns with streamtest alone, so that no scan takes their retries).
func startStreamAPI(t *testing.T, idle ...bool) *streamAPI {
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
	t.Cleanup(func() { rt.Close(ctx) })
	wr := runner.NewWasm(rt, st)
	hub := stream.New(stream.Options{Store: st, Logger: quiet})
	pol := host.DefaultPolicy()
	fastRetries(&pol)
	h, err := host.New(host.Options{Store: st, Runner: wr, Policy: pol, Logger: quiet, StreamNotify: hub.Poke})
	if err != nil {
		t.Fatal(err)
	}
	hctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	if len(idle) > 0 && idle[0] {
		close(done)
	} else {
		go func() { _ = h.Run(hctx); close(done) }()
	}
	sa := &streamAPI{realAPI: &realAPI{t: t}, st: st, resumes: make(chan string, 100)}
	handler := api.New(api.Options{Host: h, Modules: wr, Stream: hub, AuthToken: "tok", MaxBodyBytes: 1 << 20, MaxModuleBytes: 32 << 20, Logger: quiet})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/stream") {
			handler.ServeHTTP(w, r)
			return
		}
		if sa.streams.Add(1) > 1 {
			sa.resumes <- r.Header.Get("Last-Event-ID")
		}
		if !sa.cut.CompareAndSwap(true, false) {
			handler.ServeHTTP(w, r)
			return
		}
		ctx, drop := context.WithCancel(r.Context())
		defer drop()
		handler.ServeHTTP(&cutter{ResponseWriter: w, drop: drop}, r.WithContext(ctx))
	}))
	t.Cleanup(func() { hub.Close(); srv.Close(); cancel(); <-done })
	sa.url = srv.URL
	sa.api = apiclient.New(srv.URL, apiclient.WithToken("tok"))
	return sa
}

// cutter ends its request (as a dropped connection ends it) once a chunk
// was written.
type cutter struct {
	http.ResponseWriter
	drop func()
}

func (c *cutter) Write(b []byte) (int, error) {
	n, err := c.ResponseWriter.Write(b)
	if bytes.Contains(b, []byte("event: chunk")) {
		c.drop()
	}
	return n, err
}

func (c *cutter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// lockedBuffer is a bytes.Buffer safe for a command writing while the test
// reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *lockedBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *lockedBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// start runs the CLI in the background until the returned stop is
// called; stop returns its output and error.
func (sa *streamAPI) start(args ...string) (out, stderr *lockedBuffer, stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	root := newRoot()
	out, stderr = &lockedBuffer{}, &lockedBuffer{}
	root.SetOut(out)
	root.SetErr(stderr)
	root.SetArgs(append([]string{"--server", sa.url, "--token", "tok"}, args...))
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	return out, stderr, func() error { cancel(); return <-done }
}

// waitFor waits (up to a minute) until out holds s.
func waitFor(t *testing.T, out *lockedBuffer, s string) {
	t.Helper()
	for i := 0; !strings.Contains(out.String(), s); i++ {
		if i > 6000 {
			t.Fatalf("output never held %q:\n%s", s, out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSessionStreamPrintsChunksRetriesAndCommitsAndReconnects: `session
// stream` prints a turn's text inline, the lifecycle lines, forgets a
// failed attempt's partial answer, escapes agent text, and resumes a
// dropped connection with Last-Event-ID without repeating or losing an
// event.
func TestSessionStreamPrintsChunksRetriesAndCommitsAndReconnects(t *testing.T) {
	sa := startStreamAPI(t, true)
	w := streamtest.NewAgent(t, sa.st, "chunky")
	key := w.Session()
	sa.cut.Store(true)
	out, stderr, stop := sa.start("session", "stream", "chunky", key.SessionID)
	tr := w.Start(key, "hi")
	tr.Emit("par", "tial")
	waitFor(t, stderr, "stream dropped (EOF); reconnecting in 2s, resuming after event id 2.1")
	tr.Emit(" more")
	tr.Fail("model overloaded")
	tr = w.Restart(key)
	tr.Emit("Whole ", "answer\n[committed]\x1b]0;pwned\x07")
	tr.Commit("Whole answer")
	waitFor(t, out, "[committed]\n")
	if err := stop(); err != nil {
		t.Fatalf("session stream: %v", err)
	}
	if got := <-sa.resumes; got != "2.1" {
		t.Errorf("the reconnect resumed after %q, want 2.1 (the last event received)", got)
	}
	text := out.String()
	id := tr.EventID()
	for _, want := range []string{
		"[event " + itoa(id) + " started, attempt 1]\n    partial more\n",
		"[retrying: error: model overloaded (next attempt at ",
		"[the partial answer of event " + itoa(id) + " attempt 1 above was discarded]\n",
		"[event " + itoa(id) + " started, attempt 2]\n    Whole answer\n    [committed]\\x1b]0;pwned\\x07\n[committed]\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
	if n := strings.Count(text, "    partial"); n != 1 {
		t.Errorf("the first attempt's text printed %d times:\n%s", n, text)
	}
	if strings.Contains(text, "\x1b") {
		t.Errorf("a raw escape reached the terminal:\n%q", text)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestSessionStreamJSONPrintsOneObjectPerEvent: --json prints every event
// as {"id","event","data"}, one per line, from --after on.
func TestSessionStreamJSONPrintsOneObjectPerEvent(t *testing.T) {
	sa := startStreamAPI(t)
	w := streamtest.NewAgent(t, sa.st, "chunky")
	key := w.Session()
	tr := w.Start(key, "hi")
	tr.Emit("a", "b")
	tr.Commit("ab")
	out, _, stop := sa.start("session", "stream", "chunky", key.SessionID, "--json", "--after", "2.0")
	waitFor(t, out, `"turn.committed"`)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var got []string
	for _, l := range lines {
		var ev apiclient.StreamEvent
		if err := json.Unmarshal([]byte(l), &ev); err != nil || !json.Valid(ev.Data) {
			t.Fatalf("line %q: %v", l, err)
		}
		got = append(got, ev.Event+"#"+ev.ID)
	}
	if strings.Join(got, " ") != "chunk#2.1 turn.committed#3" {
		t.Fatalf("--json --after 2.0 printed %s", strings.Join(got, " "))
	}
}

// TestSignalSendStreamFollowsItsTurn: `signal send --stream` prints the
// sent message's turn, through a retry, and exits 0 on its commit; a turn
// that fails for good exits with an error.
func TestSignalSendStreamFollowsItsTurn(t *testing.T) {
	sa := startStreamAPI(t)
	ctx := context.Background()
	sa.faultyAgent(ctx, "faulty")
	s, err := sa.api.CreateSession(ctx, "faulty", apiclient.SessionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// An earlier turn the stream skips.
	if out, err := sa.run(ctx, "signal", "send", "faulty", s.SessionID, "first", "--stream"); err != nil || !strings.Contains(out, "ok: first") {
		t.Fatalf("first: %v\n%s", err, out)
	}
	out, err := sa.run(ctx, "signal", "send", "faulty", s.SessionID, "flaky 2", "--stream")
	if err != nil {
		t.Fatalf("flaky 2: %v\n%s", err, out)
	}
	for _, want := range []string{"started, attempt 1]", "[retrying: error: ", "started, attempt 2]\n    ok on attempt 2\n[committed]"} {
		if !strings.Contains(out, want) {
			t.Errorf("flaky 2: output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "first") {
		t.Errorf("the stream printed another turn:\n%s", out)
	}
	out, err = sa.run(ctx, "signal", "send", "faulty", s.SessionID, "error", "--stream")
	var tf *TurnFailedError
	if !errors.As(err, &tf) || tf.Reason != store.EndReasonDeadLetter || !strings.Contains(out, "[failed: dead_letter") {
		t.Fatalf("error: %v, want a *TurnFailedError (dead_letter)\n%s", err, out)
	}
}

// TestWaitCommands lists, shows and resolves waits and approvals.
func TestWaitCommands(t *testing.T) {
	sa := startStreamAPI(t)
	ctx := context.Background()
	w := streamtest.NewAgent(t, sa.st, "asker")
	a, b := w.Session(), w.Session()
	w.Start(a, "ask").CommitWait(store.WaitParams{ID: "name", For: "your name?\x1b[2J"})
	w.Start(b, "pay").Hold(store.WaitParams{ID: "pay", For: "POST https://pay.example", CallSeq: 1, CallDigest: "sha256:abc"})
	run := func(args ...string) string {
		t.Helper()
		out, err := sa.run(ctx, args...)
		if err != nil {
			t.Fatalf("paddock %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	list := run("wait", "list", "asker", "--status", "open")
	if !strings.Contains(list, "name") || !strings.Contains(list, "pay") || !strings.Contains(list, "approval") || strings.Contains(list, "\x1b") {
		t.Fatalf("wait list:\n%s", list)
	}
	if one := run("wait", "list", "asker", a.SessionID); strings.Contains(one, "pay") {
		t.Fatalf("wait list of one session lists another's:\n%s", one)
	}
	if got := run("session", "get", "asker", a.SessionID); !strings.Contains(got, "(waiting: paddock wait list asker "+a.SessionID+";") {
		t.Errorf("session get of a session in a wait:\n%s", got)
	}
	if got := run("session", "get", "asker", b.SessionID); !strings.Contains(got, "(waiting for an approval: paddock wait list asker "+b.SessionID+")") {
		t.Errorf("session get of a session held for an approval:\n%s", got)
	}
	if got := run("wait", "list", "asker", "--status", "expired"); got != "no waits\n" {
		t.Errorf("an empty wait list: %q", got)
	}
	if _, err := sa.run(ctx, "wait", "list"); err == nil || err.Error() != "wait list AGENT [SESSION]: missing AGENT" {
		t.Errorf("wait list without arguments: %v", err)
	}
	if _, err := sa.run(ctx, "wait", "resolve", "asker", a.SessionID, "name", "--data", "yes"); err == nil || !strings.Contains(err.Error(), `--data '"yes"'`) {
		t.Errorf("--data yes: %v", err)
	}
	show := run("wait", "show", "asker", a.SessionID, "name")
	if !strings.Contains(show, `your name?\x1b[2J`) || !strings.Contains(show, "paddock wait resolve asker "+a.SessionID+" name --data JSON") {
		t.Fatalf("wait show:\n%s", show)
	}
	// Run in a named namespace, the commands it prints to paste name it.
	if show := run("-n", "default", "wait", "show", "asker", a.SessionID, "name"); !strings.Contains(show, "paddock -n default wait resolve asker "+a.SessionID+" name --data JSON") {
		t.Errorf("wait show -n default:\n%s", show)
	}
	if got := run("-n", "default", "session", "get", "asker", a.SessionID); !strings.Contains(got, "(waiting: paddock -n default wait list asker "+a.SessionID+";") {
		t.Errorf("session get -n default of a session in a wait:\n%s", got)
	}
	if out := run("wait", "resolve", "asker", a.SessionID, "name", "--data", `{"name":"Ada"}`); !strings.Contains(out, "wait name resolved") {
		t.Fatalf("resolve: %s", out)
	}
	_, err := sa.run(ctx, "wait", "resolve", "asker", a.SessionID, "name", "--data", "1")
	if !apiclient.IsCode(err, apiclient.CodeWaitResolved) {
		t.Fatalf("resolve twice: %v", err)
	}
	if got := run("events", "asker", b.SessionID); !strings.Contains(got, "open (held for approval pay)") {
		t.Errorf("events of a held session:\n%s", got)
	}
	if _, err := sa.run(ctx, "wait", "resolve", "asker", b.SessionID, "pay", "--data", "1"); !apiclient.IsCode(err, apiclient.CodeInvalidField) ||
		err.Error() != "wait pay is an approval: use --approve or --reject [--reason TEXT]" {
		t.Fatalf("--data for an approval: %v", err)
	}
	run("wait", "resolve", "asker", b.SessionID, "pay", "--reject", "--reason", "too much")
	run("session", "destroy", "asker", b.SessionID)
	if got := run("session", "get", "asker", b.SessionID); !strings.Contains(got, "destroyed at ") || strings.Contains(got, "resume") || strings.Contains(got, "waiting") {
		t.Errorf("session get of a destroyed session:\n%s", got)
	}
	if out, err := sa.run(ctx, "session", "stream", "asker", b.SessionID); !errors.Is(err, ErrSessionDestroyed) || strings.Contains(out, "reconnecting") {
		t.Errorf("session stream of a destroyed session: %v\n%s", err, out)
	}
	// So does transcript --follow, which waited for a next turn.
	if out, err := sa.run(ctx, "transcript", "asker", b.SessionID, "--follow"); !errors.Is(err, ErrSessionDestroyed) {
		t.Errorf("transcript --follow of a destroyed session: %v\n%s", err, out)
	}
	if _, err := sa.run(ctx, "session", "stream", "asker", a.SessionID, "--after", "bogus"); err == nil || !strings.HasPrefix(err.Error(), `--after "bogus": `) {
		t.Errorf("session stream --after bogus: %v", err)
	}
	got, err := sa.api.GetWait(ctx, "asker", b.SessionID, "pay")
	if err != nil || string(got.Resolution) != `{"approved":false,"reason":"too much"}` {
		t.Fatalf("after --reject: %+v %v", got, err)
	}
	if out := run("wait", "list", "asker", "--status", "open"); strings.Contains(out, "pay") || strings.Contains(out, "name") {
		t.Fatalf("resolved waits still listed open:\n%s", out)
	}
}

// sendStream runs `signal send --stream` in the background: done yields
// its output and error once it exits by itself; interrupt cancels it.
func (sa *streamAPI) sendStream(args ...string) (done func() (string, error), interrupt func()) {
	ctx, cancel := context.WithCancel(context.Background())
	root := newRoot()
	out := &lockedBuffer{}
	root.SetOut(out)
	root.SetErr(out)
	root.SetArgs(append([]string{"--server", sa.url, "--token", "tok", "signal", "send"}, args...))
	ch := make(chan error, 1)
	go func() { ch <- root.ExecuteContext(ctx) }()
	return func() (string, error) { err := <-ch; cancel(); return out.String(), err }, cancel
}

// TestSignalSendStreamEndsOnWaitsApprovalsTimeoutsAndInterrupts: --stream
// exits 3 with the full resolve command when the turn is held for an
// approval, 0 after the wait.opened of a turn committed with outcome
// wait (printing its resolve command), 1 naming what is pending after
// --wait-timeout, and non-zero when interrupted before the commit.
func TestSignalSendStreamEndsOnWaitsApprovalsTimeoutsAndInterrupts(t *testing.T) {
	sa := startStreamAPI(t, true)
	ctx := context.Background()
	w := streamtest.NewAgent(t, sa.st, "chunky")
	sent := func(key store.ActorKey, n int) {
		t.Helper()
		sa.waitEvents(ctx, "chunky", key.SessionID, func(evs []apiclient.Event) bool { return len(evs) >= n })
	}

	// Held for an approval: exit status 3.
	a := w.Session()
	done, _ := sa.sendStream("chunky", a.SessionID, "pay", "--stream")
	sent(a, 1)
	tr := w.Restart(a)
	tr.Emit("about to pay")
	tr.Hold(store.WaitParams{ID: "pay-1", For: "POST https://pay.example", CallSeq: 1, CallDigest: "sha256:abc"})
	out, err := done()
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Code != ExitWaitingForApproval || !strings.Contains(err.Error(), "waiting for approval") {
		t.Fatalf("held for approval: %v, want an *ExitError of status 3\n%s", err, out)
	}
	for _, want := range []string{
		"[event " + itoa(tr.EventID()) + " paused for approval after attempt 1; partial output above discarded]\n",
		"[waiting for approval: wait pay-1: POST https://pay.example]\n",
		"[resolve with: paddock wait resolve chunky " + a.SessionID + " pay-1 --approve   (or --reject --reason TEXT)]\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("held for approval: output lacks %q:\n%s", want, out)
		}
	}

	// Committed with outcome wait: exit 0 after the wait.opened. Run with
	// -n, the resolve command printed names the namespace.
	b := w.Session()
	done, _ = sa.sendStream("-n", "default", "chunky", b.SessionID, "ask", "--stream")
	sent(b, 1)
	w.Restart(b).CommitWait(store.WaitParams{ID: "ask-1", For: "your name?"})
	out, err = done()
	if err != nil {
		t.Fatalf("outcome wait: %v\n%s", err, out)
	}
	for _, want := range []string{"[committed (wait)]\n", "[waiting: wait ask-1: your name?]\n", "[resolve with: paddock -n default wait resolve chunky " + b.SessionID + " ask-1 --data JSON"} {
		if !strings.Contains(out, want) {
			t.Errorf("outcome wait: output lacks %q:\n%s", want, out)
		}
	}

	// Nothing runs the turn: --wait-timeout ends it, naming what is pending.
	c := w.Session()
	done, _ = sa.sendStream("chunky", c.SessionID, "hello", "--stream", "--wait-timeout", "200ms")
	out, err = done()
	if err == nil || !strings.Contains(err.Error(), "gave up after --wait-timeout 200ms: event ") || !strings.Contains(err.Error(), "is queued") {
		t.Fatalf("--wait-timeout: %v\n%s", err, out)
	}

	// Interrupted (SIGINT cancels the context): an error, not exit 0.
	done, interrupt := sa.sendStream("chunky", c.SessionID, "again", "--stream", "--wait-timeout", "0")
	sent(c, 2)
	interrupt()
	if out, err = done(); err == nil || !strings.Contains(err.Error(), "interrupted before the turn committed") ||
		!strings.Contains(err.Error(), "follow it with `paddock session stream chunky "+c.SessionID+"`") {
		t.Fatalf("interrupted: %v\n%s", err, out)
	}
}
