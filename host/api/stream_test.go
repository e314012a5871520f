package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/api"
	"github.com/paddock-dev/paddock/host/api/client"
	"github.com/paddock-dev/paddock/host/runner"
	"github.com/paddock-dev/paddock/host/stream"
	"github.com/paddock-dev/paddock/host/stream/streamtest"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/pgtest"
	"github.com/paddock-dev/paddock/store/postgres"
	"github.com/paddock-dev/paddock/store/sqlite"
)

// streamEnv is an API server over a real listener whose http.Server has
// short read and write timeouts (a stream must outlive them), with a
// stream hub, and a writer of real frames on the same store. No host
// runs: the writer drives the turns.
type streamEnv struct {
	t   *testing.T
	st  store.Store
	hub *stream.Hub
	w   *streamtest.Writer
	url string
	c   *client.Client
}

// serverTimeout is the test server's read and write timeout: a stream must
// outlive it, and every other request must finish well within it on a
// loaded machine (at 300 ms a POST under -race once lost its connection to
// the write deadline and read as EOF).
const serverTimeout = 1500 * time.Millisecond

func newStreamEnv(t *testing.T, driver, token string) *streamEnv {
	t.Helper()
	var st store.Store
	var err error
	if driver == "postgres" {
		st, err = postgres.Open(context.Background(), pgtest.DSN(t))
	} else {
		st, err = sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "p.db"))
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	hub := stream.New(stream.Options{Store: st, PollInterval: 20 * time.Millisecond, Logger: quiet})
	h, err := host.New(host.Options{Store: st, Runner: runner.NewWasm(runtime(t), st), Policy: host.DefaultPolicy(), Logger: quiet, StreamNotify: hub.Poke})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(api.New(api.Options{Host: h, Stream: hub, AuthToken: token, MaxBodyBytes: 1 << 20,
		MaxModuleBytes: 1 << 20, Logger: quiet, StreamHeartbeat: 50 * time.Millisecond}))
	srv.Config.ReadTimeout, srv.Config.WriteTimeout = serverTimeout, serverTimeout
	srv.Config.IdleTimeout = time.Minute // a kept-alive connection outlives the short read timeout
	srv.Start()
	t.Cleanup(func() { hub.Close(); srv.Close() })
	w := streamtest.NewAgent(t, st, "notes")
	return &streamEnv{t: t, st: st, hub: hub, w: w, url: srv.URL, c: client.New(srv.URL, client.WithToken(token))}
}

// open opens the stream of key after lastID, closed at the test's end.
func (e *streamEnv) open(key store.ActorKey, lastID string) *client.EventStream {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	es, err := e.c.Stream(ctx, "notes", key.SessionID, lastID)
	if err != nil {
		cancel()
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { es.Close(); cancel() })
	return es
}

// read reads n events.
func read(t *testing.T, es *client.EventStream, n int) []client.StreamEvent {
	t.Helper()
	var out []client.StreamEvent
	for len(out) < n {
		ev, err := es.Next()
		if err != nil {
			t.Fatalf("after %d events (%s): %v", len(out), sseIDs(out), err)
		}
		out = append(out, ev)
	}
	return out
}

func sseIDs(evs []client.StreamEvent) string {
	var b []string
	for _, e := range evs {
		b = append(b, e.Event+"#"+e.ID)
	}
	return strings.Join(b, " ")
}

func TestStreamServesFramesInOrderAndResumesExactly(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newStreamEnv(t, driver, "")
		key := e.w.Session()
		live := e.open(key, "")
		tr := e.w.Start(key, "hi")
		tr.Emit("Hel", "lo")
		// Longer than the server's read and write timeouts: the stream
		// survives them (heartbeats flow meanwhile).
		time.Sleep(3 * serverTimeout)
		tr.Emit(", world")
		tr.Commit("Hello, world")
		all := read(t, live, 5)
		want := "turn.started#1 chunk#2.0 chunk#2.1 chunk#3.0 turn.committed#4"
		if got := sseIDs(all); got != want {
			t.Fatalf("live stream\n got %s\nwant %s", got, want)
		}
		var c stream.ChunkData
		if err := json.Unmarshal(all[3].Data, &c); err != nil || c.Text != ", world" || c.Offset != 2 || c.EventID != tr.EventID() {
			t.Fatalf("chunk %s: %+v %v", all[3].Data, c, err)
		}
		var committed struct {
			stream.FrameHead
			store.TurnCommittedBody
		}
		if err := json.Unmarshal(all[4].Data, &committed); err != nil || committed.Seq != 4 || committed.EventID != tr.EventID() ||
			committed.TurnNo != 1 || committed.Outcome != abi.OutcomeOK {
			t.Fatalf("turn.committed %s: %+v %v", all[4].Data, committed, err)
		}
		// Resuming at every position gives exactly the events after it.
		for i, ev := range all[:4] {
			es := e.open(key, ev.ID)
			got := read(t, es, 4-i)
			if sseIDs(got) != sseIDs(all[i+1:]) {
				t.Errorf("resume at %s: got %s, want %s", ev.ID, sseIDs(got), sseIDs(all[i+1:]))
			}
			for j := range got {
				if string(got[j].Data) != string(all[i+1+j].Data) {
					t.Errorf("resume at %s: event %s data %s, live %s", ev.ID, got[j].ID, got[j].Data, all[i+1+j].Data)
				}
			}
		}
		// ?after= works as Last-Event-ID.
		resp := e.get("/v1/agents/notes/sessions/"+key.SessionID+"/stream?after=3.0", "")
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		if got := readRaw(t, br, "turn.committed"); !strings.Contains(got, "id: 4\nevent: turn.committed\ndata: {\"seq\":4,") {
			t.Errorf("?after=3.0 answered:\n%s", got)
		}
	})
}

func (e *streamEnv) get(path, token string) *http.Response {
	e.t.Helper()
	req, _ := http.NewRequest("GET", e.url+path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp
}

// readRaw reads the stream's raw text until it holds want.
func readRaw(t *testing.T, br *bufio.Reader, want string) string {
	t.Helper()
	var b strings.Builder
	for !strings.Contains(b.String(), want) {
		line, err := br.ReadString('\n')
		b.WriteString(line)
		if err != nil {
			t.Fatalf("stream ended (%v) before %q:\n%s", err, want, b.String())
		}
	}
	// the rest of the event
	for {
		line, err := br.ReadString('\n')
		b.WriteString(line)
		if err != nil || line == "\n" {
			return b.String()
		}
	}
}

func TestStreamHeadersHeartbeatAndRetryHint(t *testing.T) {
	t.Parallel()
	e := newStreamEnv(t, "sqlite", "tok")
	key := e.w.Session()
	resp := e.get("/v1/agents/notes/sessions/"+key.SessionID+"/stream", "tok")
	defer resp.Body.Close()
	for h, want := range map[string]string{"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"} {
		if got := resp.Header.Get(h); got != want {
			t.Errorf("%s: %q, want %q", h, got, want)
		}
	}
	br := bufio.NewReader(resp.Body)
	got := readRaw(t, br, ": heartbeat")
	if !strings.HasPrefix(got, "retry: 2000\nid: 0\n\n") {
		t.Errorf("the stream does not open with a retry hint:\n%s", got)
	}
}

func TestStreamNeedsTheToken(t *testing.T) {
	t.Parallel()
	e := newStreamEnv(t, "sqlite", "tok")
	key := e.w.Session()
	for _, tok := range []string{"", "wrong"} {
		resp := e.get("/v1/agents/notes/sessions/"+key.SessionID+"/stream", tok)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 401 || !strings.Contains(string(body), "unauthenticated") {
			t.Errorf("token %q: %d %s, want 401 unauthenticated", tok, resp.StatusCode, body)
		}
	}
	es := e.open(key, "")
	e.w.Start(key, "hi")
	if got := sseIDs(read(t, es, 1)); got != "turn.started#1" {
		t.Fatalf("with the token: %s", got)
	}
}

func TestStreamResetWhenTheResumePointWasCompacted(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newStreamEnv(t, driver, "")
		key := e.w.Session()
		tr := e.w.Start(key, "one")
		tr.Emit("x")
		tr.Commit("x")
		if n, err := e.st.CompactStream(context.Background(), store.CompactStreamParams{Before: time.Now().Add(time.Hour), Limit: 100}); err != nil || n != 3 {
			t.Fatalf("CompactStream = %d, %v", n, err)
		}
		e.w.Start(key, "two")
		got := read(t, e.open(key, "2.0"), 2)
		if sseIDs(got) != "stream.reset#3 turn.started#4" || string(got[0].Data) != `{"oldest":4}` {
			t.Fatalf("got %s (%s)", sseIDs(got), got[0].Data)
		}
	})
}

func TestStreamRefusals(t *testing.T) {
	t.Parallel()
	e := newStreamEnv(t, "sqlite", "")
	key := e.w.Session()
	for _, c := range []struct {
		path, lastID string
		status       int
		code, field  string
	}{
		{"/v1/agents/notes/sessions/nope/stream", "", 404, "session_not_found", "session"},
		{"/v1/agents/nope/sessions/" + key.SessionID + "/stream", "", 404, "agent_not_found", ""},
		{"/v1/agents/notes/sessions/" + key.SessionID + "/stream", "x.1", 400, "invalid_parameter", "Last-Event-ID"},
		{"/v1/agents/notes/sessions/" + key.SessionID + "/stream?after=-1", "", 400, "invalid_parameter", "after"},
	} {
		req, _ := http.NewRequest("GET", e.url+c.path, nil)
		if c.lastID != "" {
			req.Header.Set("Last-Event-ID", c.lastID)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body client.ErrorBody
		_ = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != c.status || body.Error == nil || body.Error.Code != c.code || (c.field != "" && body.Error.Field != c.field) {
			t.Errorf("%s (Last-Event-ID %q): %d %+v, want %d %s", c.path, c.lastID, resp.StatusCode, body.Error, c.status, c.code)
		}
	}
	if _, err := e.st.DestroySession(context.Background(), key); err != nil {
		t.Fatal(err)
	}
	_, err := e.c.Stream(context.Background(), "notes", key.SessionID, "")
	if !client.IsCode(err, "session_destroyed") || !client.IsGone(err) {
		t.Fatalf("stream of a destroyed session: %v, want 410 session_destroyed", err)
	}
}

// TestAClientLeavingEndsItsSubscription: when the client disconnects, the
// handler returns and the session is no longer watched.
func TestAClientLeavingEndsItsSubscription(t *testing.T) {
	t.Parallel()
	e := newStreamEnv(t, "sqlite", "")
	key := e.w.Session()
	ctx, cancel := context.WithCancel(context.Background())
	es, err := e.c.Stream(ctx, "notes", key.SessionID, "")
	if err != nil {
		t.Fatal(err)
	}
	e.w.Start(key, "hi")
	read(t, es, 1)
	if e.hub.Watched() != 1 {
		t.Fatalf("watched = %d while streaming", e.hub.Watched())
	}
	cancel()
	es.Close()
	for i := 0; e.hub.Watched() != 0; i++ {
		if i > 1000 {
			t.Fatal("the session is still watched after its only client left")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := es.Next(); err == nil {
		t.Fatal("a closed stream still reads")
	}
}

// TestStreamEndsWhenTheSessionIsDestroyed: a destroyed session's stream
// ends (after its last frames), and a reconnect is refused with 410.
func TestStreamEndsWhenTheSessionIsDestroyed(t *testing.T) {
	t.Parallel()
	e := newStreamEnv(t, "sqlite", "")
	key := e.w.Session()
	e.w.Start(key, "hi").Commit("hello")
	es := e.open(key, "")
	read(t, es, 2)
	if _, err := e.st.DestroySession(context.Background(), key); err != nil {
		t.Fatal(err)
	}
	if ev, err := es.Next(); err != io.EOF {
		t.Fatalf("after the destroy: %+v %v, want the stream's end (EOF)", ev, err)
	}
	if _, err := e.c.Stream(context.Background(), "notes", key.SessionID, "2"); !client.IsCode(err, client.CodeSessionDestroyed) {
		t.Fatalf("reconnect: %v, want 410 session_destroyed", err)
	}
}

// TestStreamAtTheHead: "head" starts after the last frame; the opening
// block gives the client that position as its last event id, so a
// reconnect before any event resumes there.
func TestStreamAtTheHead(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newStreamEnv(t, driver, "")
		key := e.w.Session()
		e.w.Start(key, "one").Commit("1") // frames 1, 2
		es := e.open(key, "head")
		e.w.Start(key, "two") // frame 3
		got := read(t, es, 1)
		if sseIDs(got) != "turn.started#3" {
			t.Fatalf("at the head: %s", sseIDs(got))
		}
		resp := e.get("/v1/agents/notes/sessions/"+key.SessionID+"/stream?after=head", "")
		defer resp.Body.Close()
		if got := readRaw(t, bufio.NewReader(resp.Body), "id: 3\n"); got != "retry: 2000\nid: 3\n\n" {
			t.Fatalf("the opening block at the head (3):\n%q", got)
		}
	})
}
