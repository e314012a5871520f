package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store/pgtest"
)

// Process tests of the session stream, waits and approvals (issue 13):
// real `paddock serve` processes on a real PostgreSQL, an SSE client over
// net/http written here from the protocol (not the CLI's client), kill -9.

// sseEvent is one Server-Sent Event.
type sseEvent struct{ ID, Event, Data string }

// sseConn is an open stream of a session.
type sseConn struct {
	resp *http.Response
	r    *bufio.Reader
}

// openStream opens GET …/stream on addr, resuming after lastID when set.
func openStream(t *testing.T, addr, agent, sess, lastID string) *sseConn {
	t.Helper()
	req, err := http.NewRequest("GET", "http://"+addr+"/v1/agents/"+agent+"/sessions/"+sess+"/stream", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/event-stream")
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("open the stream on %s: %v", addr, err)
	}
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("stream on %s: %d %s %s", addr, resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	return &sseConn{resp: resp, r: bufio.NewReader(resp.Body)}
}

// next reads the next event (comments skipped).
func (c *sseConn) next() (sseEvent, error) {
	var ev sseEvent
	var data []string
	for {
		line, err := c.r.ReadString('\n')
		if err != nil {
			return ev, err
		}
		line = strings.TrimRight(line, "\r\n")
		switch {
		case line == "":
			if len(data) == 0 {
				// An event without data is not dispatched (the stream's
				// opening block only sets the last event id).
				ev = sseEvent{}
				continue
			}
			ev.Data = strings.Join(data, "\n")
			return ev, nil
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "id:"):
			ev.ID = strings.TrimSpace(strings.TrimPrefix(line, "id:"))
		case strings.HasPrefix(line, "event:"):
			ev.Event = strings.TrimSpace(strings.TrimPrefix(line, "event:"))
		case strings.HasPrefix(line, "data:"):
			data = append(data, strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " "))
		}
	}
}

func (c *sseConn) close() { c.resp.Body.Close() }

// streamID is an SSE id parsed: frame seq, chunk index (-1: a frame).
type streamID struct {
	seq int64
	j   int
}

func parseStreamID(t *testing.T, id string) streamID {
	t.Helper()
	s, j, dotted := strings.Cut(id, ".")
	seq, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("SSE id %q: %v", id, err)
	}
	out := streamID{seq: seq, j: -1}
	if dotted {
		if out.j, err = strconv.Atoi(j); err != nil {
			t.Fatalf("SSE id %q: %v", id, err)
		}
	}
	return out
}

func (a streamID) less(b streamID) bool { return a.seq < b.seq || a.seq == b.seq && a.j < b.j }

// chunkData is a chunk event's data.
type chunkData struct {
	EventID int64           `json:"event_id"`
	Epoch   int64           `json:"epoch"`
	Attempt int             `json:"attempt"`
	Offset  int             `json:"offset"`
	Type    string          `json:"type"`
	Text    string          `json:"text"`
	Data    json.RawMessage `json:"data"`
}

// frameData is the common part of a non-chunk event's data, with the
// fields of the bodies the tests read.
type frameData struct {
	Seq      int64  `json:"seq"`
	EventID  int64  `json:"event_id"`
	Epoch    int64  `json:"epoch"`
	Attempt  int    `json:"attempt"`
	Reason   string `json:"reason"`
	Outcome  string `json:"outcome"`
	Messages []struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	} `json:"messages"`
}

// reader is a chat client's view of one session's stream: it checks that
// ids strictly increase (so none repeats) and reassembles each event's
// text, dropping what it has of an event at turn.retrying or turn.failed.
type reader struct {
	t       *testing.T
	last    string
	lastID  streamID
	ids     []string
	kinds   []string
	frames  []frameData // non-chunk events, in order
	text    map[int64]*strings.Builder
	offset  map[int64]int // next chunk offset expected per event
	commits map[int64]frameData
	chunks  int
}

func newReader(t *testing.T) *reader {
	return &reader{t: t, lastID: streamID{seq: -1}, text: map[int64]*strings.Builder{}, offset: map[int64]int{}, commits: map[int64]frameData{}}
}

// take handles one event.
func (r *reader) take(ev sseEvent) {
	t := r.t
	t.Helper()
	if ev.ID == "" {
		if ev.Event != "stream.reset" {
			t.Errorf("event %q without an id: %s", ev.Event, ev.Data)
		}
		return
	}
	id := parseStreamID(t, ev.ID)
	if !r.lastID.less(id) {
		t.Errorf("SSE id %s after %s: ids must strictly increase (a repeat is a duplicate)", ev.ID, r.last)
	}
	r.last, r.lastID = ev.ID, id
	r.ids = append(r.ids, ev.ID)
	r.kinds = append(r.kinds, ev.Event)
	if ev.Event == "chunk" {
		var c chunkData
		if err := json.Unmarshal([]byte(ev.Data), &c); err != nil {
			t.Fatalf("chunk %s: %v: %s", ev.ID, err, ev.Data)
		}
		r.chunks++
		if c.Offset != r.offset[c.EventID] {
			t.Errorf("chunk %s of event %d has offset %d, want %d (every chunk once, in order)", ev.ID, c.EventID, c.Offset, r.offset[c.EventID])
		}
		r.offset[c.EventID] = c.Offset + 1
		b := r.text[c.EventID]
		if b == nil {
			b = &strings.Builder{}
			r.text[c.EventID] = b
		}
		b.WriteString(c.Text)
		return
	}
	var f frameData
	if err := json.Unmarshal([]byte(ev.Data), &f); err != nil {
		t.Fatalf("%s %s: %v: %s", ev.Event, ev.ID, err, ev.Data)
	}
	if f.Seq != id.seq {
		t.Errorf("%s: data seq %d, SSE id %s", ev.Event, f.Seq, ev.ID)
	}
	r.frames = append(r.frames, f)
	switch ev.Event {
	case "turn.retrying", "turn.failed":
		// Discard what this event streamed so far (an approval hold reruns
		// it under the same attempt number).
		delete(r.text, f.EventID)
		r.offset[f.EventID] = 0
	case "turn.started":
		delete(r.text, f.EventID)
		r.offset[f.EventID] = 0
	case "turn.committed":
		if _, dup := r.commits[f.EventID]; dup {
			t.Errorf("a second turn.committed for event %d (%s)", f.EventID, ev.ID)
		}
		r.commits[f.EventID] = f
	}
}

// textOf is the reassembled text of an event.
func (r *reader) textOf(event int64) string {
	if b := r.text[event]; b != nil {
		return b.String()
	}
	return ""
}

// follow reads conn into r until stop says so or the stream ends.
func follow(c *sseConn, r *reader, stop func(sseEvent) bool) error {
	for {
		ev, err := c.next()
		if err != nil {
			return err
		}
		r.take(ev)
		if stop(ev) {
			return nil
		}
	}
}

// slowStream writes a streamed chat completion, one content delta per
// part, sleeping delay before each; it gives up when the client went.
func slowStream(w http.ResponseWriter, r *http.Request, delay time.Duration, parts ...string) bool {
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	for _, p := range parts {
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return false
		}
		b, _ := json.Marshal(map[string]any{"id": "c1", "model": "gpt-test",
			"choices": []any{map[string]any{"index": 0, "delta": map[string]any{"content": p}}}})
		fmt.Fprintf(w, "data: %s\n\n", b)
		fl.Flush()
	}
	fmt.Fprint(w, `data: {"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":3}}`+"\n\n")
	fmt.Fprint(w, "data: [DONE]\n\n")
	fl.Flush()
	return true
}

// tokens returns n parts "<prefix>i " for i in 0..n-1.
func tokens(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d ", prefix, i)
	}
	return out
}

// TestStreamClientReconnectingMidTurnGetsEveryChunkOnce follows a turn
// whose model answer streams in bursts, dropping the connection every few
// chunks and reconnecting with Last-Event-ID (mostly inside a chunk frame,
// "<seq>.<j>"), alternately to either of two hosts on one store: the client sees every chunk once, in order, and the text
// it reassembles is the committed answer. Then, from every id of the
// stream, a resumed connection starts exactly at the next id.
func TestStreamClientReconnectingMidTurnGetsEveryChunkOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	t.Parallel()
	parts := tokens("tok", 60)
	model := newModelServer(t, func(n int, body map[string]any, w http.ResponseWriter, r *http.Request) {
		// Bursts of 5 tokens, 40 ms apart: chunk frames of several chunks.
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < len(parts); i += 5 {
			if !slowStream2(w, r, 40*time.Millisecond, parts[i:min(i+5, len(parts))]) {
				return
			}
		}
		fmt.Fprint(w, `data: {"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\ndata: [DONE]\n\n")
	})
	dir := t.TempDir()
	dsn := pgtest.DSN(t)
	addr, addrB := freePort(t), freePort(t)
	srv := startServer(t, hcConfig(t, dir, addr, dsn, model.URL, "", nil, ""), addr)
	// A second host on the same store: the client alternates between the
	// two, so it resumes on a host that may not have seen its position yet.
	startServer(t, hcConfig(t, dir, addrB, dsn, model.URL, "", nil, ""), addrB)
	hosts := []string{addr, addrB}
	sess := srv.cli("session", "create", "hc")
	c := openStream(t, addr, "hc", sess, "")
	srv.cli("signal", "send", "hc", sess, callsMessage(t, modelCall("count")))

	r := newReader(t)
	reconnects, midFrame := 0, 0
	done := false
	for !done {
		n := 0
		err := follow(c, r, func(ev sseEvent) bool {
			if ev.Event == "turn.committed" {
				done = true
				return true
			}
			if ev.Event == "chunk" {
				n++
			}
			return n == 7
		})
		c.close()
		if err != nil {
			t.Fatalf("stream ended: %v", err)
		}
		if done {
			break
		}
		reconnects++
		if strings.Contains(r.last, ".") {
			midFrame++
		}
		c = openStream(t, hosts[reconnects%2], "hc", sess, r.last)
	}
	evs := srv.events("hc", sess)
	out := onlyTurnReply(t, srv, sess)
	want := strings.Join(parts, "")
	if out[0].Content != want {
		t.Fatalf("committed answer %q, want %q", out[0].Content, want)
	}
	if got := r.textOf(evs[0].ID); got != want {
		t.Errorf("reassembled across %d reconnects: %q, want the committed answer %q", reconnects, got, want)
	}
	if r.chunks != len(parts) {
		t.Errorf("received %d chunks, want %d (one per token, each once)", r.chunks, len(parts))
	}
	if reconnects < 3 {
		t.Errorf("only %d reconnects: the test did not exercise resuming", reconnects)
	}
	t.Logf("%d reconnects, %d of them inside a chunk frame; ids %v", reconnects, midFrame, r.ids)

	// Resume from every id, on either host: the first event is the next one.
	for i, id := range r.ids[:len(r.ids)-1] {
		c := openStream(t, hosts[i%2], "hc", sess, id)
		ev, err := c.next()
		c.close()
		if err != nil {
			t.Fatalf("resume after %s: %v", id, err)
		}
		if ev.ID != r.ids[i+1] {
			t.Errorf("resumed after %s: first id %s, want %s", id, ev.ID, r.ids[i+1])
		}
	}
}

// slowStream2 writes content deltas for parts after one delay (a burst).
func slowStream2(w http.ResponseWriter, r *http.Request, delay time.Duration, parts []string) bool {
	select {
	case <-time.After(delay):
	case <-r.Context().Done():
		return false
	}
	for _, p := range parts {
		b, _ := json.Marshal(map[string]any{"id": "c1", "model": "gpt-test",
			"choices": []any{map[string]any{"index": 0, "delta": map[string]any{"content": p}}}})
		fmt.Fprintf(w, "data: %s\n\n", b)
	}
	w.(http.Flusher).Flush()
	return true
}

// TestStreamKillDashNineOfTheHostMidStream runs two hosts on one
// PostgreSQL. Host A streams a slow model answer; a client follows the
// session on host B; A is killed with SIGKILL mid-stream. The client sees
// turn.retrying for A's attempt, then B's attempt's turn.started, its
// chunks, and one turn.committed whose messages are the transcript's; the
// text it reassembles (dropping A's at turn.retrying) is the committed
// answer.
func TestStreamKillDashNineOfTheHostMidStream(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	t.Parallel()
	dsn := pgtest.DSN(t)
	first, second := tokens("a", 600), tokens("b", 25)
	model := newModelServer(t, func(n int, body map[string]any, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			// A's call: tokens 100 ms apart until A dies (a minute at most).
			slowStream(w, r, 100*time.Millisecond, first...)
			return
		}
		slowStream(w, r, 20*time.Millisecond, second...)
	})
	dir := t.TempDir()
	addrA, addrB := freePort(t), freePort(t)
	a := startServer(t, hcConfig(t, dir, addrA, dsn, model.URL, "", nil, ""), addrA)
	sess := a.cli("session", "create", "hc")
	a.cli("signal", "send", "hc", sess, callsMessage(t, modelCall("tell me")))
	waitUntil(t, "host A's model call", time.Minute, func() bool { n, _ := model.counts(); return n >= 1 })
	b := startServer(t, hcConfig(t, dir, addrB, dsn, model.URL, "", nil, ""), addrB)
	if n, _ := model.counts(); n != 1 {
		t.Fatalf("%d model calls before the kill, want A's only", n)
	}

	c := openStream(t, addrB, "hc", sess, "")
	defer c.close()
	r := newReader(t)
	// Follow on B until it has relayed three of A's chunks.
	if err := follow(c, r, func(ev sseEvent) bool { return r.chunks >= 3 }); err != nil {
		t.Fatal(err)
	}
	// A second client follows on A itself, then reconnects to B.
	ca := openStream(t, addrA, "hc", sess, "")
	ra := newReader(t)
	if err := follow(ca, ra, func(ev sseEvent) bool { return ra.chunks >= 3 }); err != nil {
		t.Fatal(err)
	}
	a.kill9()
	killed := time.Now()
	deadline := time.AfterFunc(time.Minute, c.close)
	defer deadline.Stop()
	if err := follow(c, r, func(ev sseEvent) bool { return ev.Event == "turn.committed" }); err != nil {
		t.Fatalf("the stream on B ended before the commit: %v (events %v)", err, r.kinds)
	}
	// A's client: its connection died with A (it may have read more of A's
	// chunks first); it resumes on B after the last id it got.
	_ = follow(ca, ra, func(sseEvent) bool { return false })
	ca.close()
	resumedAt := ra.last
	ca = openStream(t, addrB, "hc", sess, resumedAt)
	deadlineA := time.AfterFunc(time.Minute, ca.close)
	err := follow(ca, ra, func(ev sseEvent) bool { return ev.Event == "turn.committed" })
	deadlineA.Stop()
	ca.close()
	if err != nil {
		t.Fatalf("the client of A resumed on B after %s: %v (events %v)", resumedAt, err, ra.kinds)
	}
	t.Logf("the client of A resumed on B after %s; B's client saw %v", resumedAt, r.kinds)
	if strings.Join(ra.ids, " ") != strings.Join(r.ids, " ") {
		t.Errorf("the client that moved from A to B (resumed after %s) saw ids\n%v\nthe client on B\n%v", resumedAt, ra.ids, r.ids)
	}
	figure(t, "stream: kill -9 of the streaming host → the client on the other host saw turn.committed %.1f s later (lease_ttl 2s)", time.Since(killed).Seconds())

	evs := b.events("hc", sess)
	ev := evs[0].ID
	turns := b.transcript("hc", sess)
	if len(turns) != 1 {
		t.Fatalf("%d turns, want 1", len(turns))
	}
	out := onlyTurnReply(t, b, sess)
	if want := strings.Join(second, ""); out[0].Content != want {
		t.Errorf("committed answer %q, want B's %q", out[0].Content, want)
	}
	if got := r.textOf(ev); got != out[0].Content {
		t.Errorf("the client reassembled %q, want the committed answer %q", got, out[0].Content)
	}
	if got := ra.textOf(ev); got != out[0].Content {
		t.Errorf("the client that moved from A to B reassembled %q, want the committed answer %q", got, out[0].Content)
	}
	// The frame sequence: started (A), retrying (A, lease_expired),
	// started (B), committed (B) — chunks in between.
	var seq []string
	var started []frameData
	var retrying frameData
	fi := 0
	for _, k := range r.kinds {
		if k == "chunk" {
			continue
		}
		seq = append(seq, k)
		f := r.frames[fi]
		fi++
		switch k {
		case "turn.started":
			started = append(started, f)
		case "turn.retrying":
			retrying = f
		}
	}
	if strings.Join(seq, " ") != "turn.started turn.retrying turn.started turn.committed" {
		t.Fatalf("frames %v, want turn.started turn.retrying turn.started turn.committed", seq)
	}
	if retrying.EventID != ev || retrying.Epoch != started[0].Epoch || retrying.Attempt != started[0].Attempt || retrying.Reason != "lease_expired" {
		t.Errorf("turn.retrying %+v: want A's attempt %+v with reason lease_expired", retrying, started[0])
	}
	if started[1].Epoch <= started[0].Epoch || started[1].Epoch != turns[0].ActorEpoch {
		t.Errorf("B's turn.started %+v: want a newer epoch than A's %d, the committing one %d", started[1], started[0].Epoch, turns[0].ActorEpoch)
	}
	commit := r.commits[ev]
	if len(commit.Messages) != len(turns[0].Messages) {
		t.Fatalf("turn.committed messages %+v, transcript %+v", commit.Messages, turns[0].Messages)
	}
	for i, m := range turns[0].Messages {
		if commit.Messages[i].Role != m.Role || commit.Messages[i].Content != m.Content {
			t.Errorf("turn.committed message %d %+v, transcript %+v", i, commit.Messages[i], m)
		}
	}
}

// resolveWait posts a resolution to addr and returns the status and body.
func resolveWait(t *testing.T, addr, sess, id, body string) (int, string) {
	t.Helper()
	resp, err := http.Post("http://"+addr+"/v1/agents/hc/sessions/"+sess+"/waits/"+id, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitStatus reads a wait's status through addr's API ("" if unknown).
func waitStatus(t *testing.T, s *server, sess, id string) string {
	w, err := s.api().GetWait(context.Background(), "hc", sess, id)
	if err != nil {
		return ""
	}
	return string(w.Status)
}

// TestWaitOutlivesHostRestartsAndIsResolvedOnAnotherHost: a turn ends with
// outcome wait on host A; A is killed with SIGKILL, restarted, killed
// again; host B resolves the wait through its API, the wait.resolved event
// runs on B and commits with the resolver's data. Resolving it again
// answers 409; a wait of a destroyed session answers 410. The stream shows
// wait.opened and wait.resolved.
func TestWaitOutlivesHostRestartsAndIsResolvedOnAnotherHost(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	t.Parallel()
	dsn := pgtest.DSN(t)
	model := newModelServer(t, func(int, map[string]any, http.ResponseWriter, *http.Request) {})
	dir := t.TempDir()
	addrA, addrB := freePort(t), freePort(t)
	cfgA := hcConfig(t, dir, addrA, dsn, model.URL, "", nil, "")
	a := startServer(t, cfgA, addrA)
	sess := a.cli("session", "create", "hc")
	a.cli("signal", "send", "hc", sess, `{"wait":{"id":"pick","for":"a day","data":{"choices":["mon","tue"]}}}`)
	waitUntil(t, "the wait to open", time.Minute, func() bool { return waitStatus(t, a, sess, "pick") == "open" })
	if ts := a.transcript("hc", sess); len(ts) != 1 || ts[0].Outcome != "wait" {
		t.Fatalf("transcript %+v: want one turn with outcome wait", ts)
	}
	a.kill9()
	a = startServer(t, cfgA, addrA)
	if got := waitStatus(t, a, sess, "pick"); got != "open" {
		t.Fatalf("after a restart the wait is %q, want open", got)
	}
	a.kill9()

	b := startServer(t, hcConfig(t, dir, addrB, dsn, model.URL, "", nil, ""), addrB)
	if code, body := resolveWait(t, addrB, sess, "pick", `{"data":{"choice":"tue"}}`); code != 200 {
		t.Fatalf("resolve on B: %d %s", code, body)
	}
	waitUntil(t, "the wait.resolved turn to commit on B", time.Minute, func() bool { return len(b.transcript("hc", sess)) == 2 })
	ts := b.transcript("hc", sess)
	got := ts[1].Messages[len(ts[1].Messages)-1].Content
	if !strings.Contains(got, `"kind":"wait.resolved"`) || !strings.Contains(got, `"id":"pick"`) || !strings.Contains(got, `"choice":"tue"`) || !strings.Contains(got, `"for":"a day"`) {
		t.Errorf("the wait.resolved turn answered %q: want the wait's id, for and the resolver's data", got)
	}
	code, body := resolveWait(t, addrB, sess, "pick", `{"data":{"choice":"mon"}}`)
	if code != 409 || !strings.Contains(body, "wait_resolved") {
		t.Errorf("resolved twice: %d %s, want 409 wait_resolved", code, body)
	}

	// The stream, replayed from the start on B.
	c := openStream(t, addrB, "hc", sess, "")
	r := newReader(t)
	deadline := time.AfterFunc(time.Minute, c.close)
	commits := 0
	err := follow(c, r, func(ev sseEvent) bool {
		if ev.Event == "turn.committed" {
			commits++
		}
		return commits == 2
	})
	deadline.Stop()
	c.close()
	if err != nil {
		t.Fatalf("replay: %v (%v)", err, r.kinds)
	}
	if k := strings.Join(r.kinds, " "); !strings.Contains(k, "turn.committed wait.opened") || !strings.Contains(k, "wait.resolved") || strings.Index(k, "wait.resolved") > strings.LastIndex(k, "turn.started") {
		t.Errorf("stream %s: want wait.opened after the first commit, wait.resolved before the second turn", k)
	}

	// A second wait; the session is destroyed; resolving it is 410.
	b.cli("signal", "send", "hc", sess, `{"wait":{"id":"second"}}`)
	waitUntil(t, "the second wait to open", time.Minute, func() bool { return waitStatus(t, b, sess, "second") == "open" })
	if _, err := b.api().DestroySession(context.Background(), "hc", sess); err != nil {
		t.Fatal(err)
	}
	code, body = resolveWait(t, addrB, sess, "second", `{"data":1}`)
	if code != 410 || !strings.Contains(body, "session_destroyed") {
		t.Errorf("resolve a destroyed session's wait: %d %s, want 410 session_destroyed", code, body)
	}
}

// TestApprovalAcrossAHostRestartSendsEachRequestOnce: an http call needs
// approval; the turn (a model call, then that http call) is held; the host
// is killed with SIGKILL and restarted; `paddock wait resolve --approve`
// lets it go. The model server saw its request once (the rerun replays
// it), the destination saw the approved request once, the turn committed
// once.
func TestApprovalAcrossAHostRestartSendsEachRequestOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	t.Parallel()
	dsn := pgtest.DSN(t)
	model := newModelServer(t, func(n int, body map[string]any, w http.ResponseWriter, r *http.Request) {
		streamedCompletion(w, "the model's ", "answer")
	})
	var mu sync.Mutex
	hits := 0
	page := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hits++
		mu.Unlock()
		_, _ = io.WriteString(w, "paid")
	}))
	t.Cleanup(page.Close)
	pu, _ := url.Parse(page.URL)
	dir := t.TempDir()
	addr := freePort(t)
	cfg := hcConfig(t, dir, addr, dsn, model.URL, "", []string{pu.Host}, "")
	editConfig(t, cfg, "      models: [m]\n",
		"      models: [m]\n      approval:\n        http:\n          - host: \"127.0.0.1\"\n            methods: [POST]\n")
	srv := startServer(t, cfg, addr)
	sess := srv.cli("session", "create", "hc")
	// A client follows live, across the hold and the restart.
	live := openStream(t, addr, "hc", sess, "")
	lr := newReader(t)
	pay := httpCall(page.URL+"/pay", nil)
	pay.HTTP.Method = "POST"
	srv.cli("signal", "send", "hc", sess, callsMessage(t, modelCall("how much?"), pay))
	liveDeadline := time.AfterFunc(time.Minute, live.close)
	if err := follow(live, lr, func(ev sseEvent) bool { return ev.Event == "wait.opened" }); err != nil {
		t.Fatalf("the live client: %v (%v)", err, lr.kinds)
	}
	liveDeadline.Stop()
	var waitID string
	waitUntil(t, "the approval wait to open", time.Minute, func() bool {
		evs := srv.events("hc", sess)
		if len(evs) == 0 {
			return false
		}
		waitID = fmt.Sprintf("approval-%d-2", evs[0].ID)
		return waitStatus(t, srv, sess, waitID) == "open"
	})
	if n, _ := model.counts(); n != 1 || hits != 0 {
		t.Fatalf("while held: %d model requests, %d destination requests; want 1 and 0", n, hits)
	}
	srv.kill9()
	live.close()
	srv = startServer(t, cfg, addr)
	live = openStream(t, addr, "hc", sess, lr.last)
	liveDone := make(chan error, 1)
	go func() { liveDone <- follow(live, lr, func(ev sseEvent) bool { return ev.Event == "turn.committed" }) }()
	if out := srv.cli("wait", "resolve", "hc", sess, waitID, "--approve"); !strings.Contains(out, "approved") && !strings.Contains(out, "resolved") {
		t.Errorf("wait resolve --approve printed %q", out)
	}
	waitUntil(t, "the approved turn to commit", time.Minute, func() bool { return len(srv.transcript("hc", sess)) == 1 })
	liveDeadline = time.AfterFunc(time.Minute, live.close)
	if err := <-liveDone; err != nil {
		t.Errorf("the live client after the restart: %v (%v)", err, lr.kinds)
	}
	liveDeadline.Stop()
	live.close()
	t.Logf("the live client saw %v", lr.kinds)
	out := onlyTurnReply(t, srv, sess)
	// The live client dropped the held attempt's text at turn.retrying;
	// the rerun replays the model call and emits its recorded text once.
	if evs := srv.events("hc", sess); len(evs) == 1 {
		if got := lr.textOf(evs[0].ID); got != "the model's answer" {
			t.Errorf("the live client reassembled %q (events %v), want the model's answer once", got, lr.kinds)
		}
	}
	if len(out) != 2 || !out[0].Replayed || out[0].Content != "the model's answer" || out[1].Status != 200 || out[1].Body != "paid" || out[1].Replayed {
		t.Errorf("reply %+v: want the model call replayed, the approved POST live with 200", out)
	}
	// Give a duplicate a moment to show up, then count.
	time.Sleep(500 * time.Millisecond)
	mu.Lock()
	h := hits
	mu.Unlock()
	if total, byKey := model.counts(); total != 1 || h != 1 {
		t.Errorf("the model server got %d requests (%v), the destination %d; want each once", total, byKey, h)
	}
	evs := srv.events("hc", sess)
	if len(evs) != 1 || evs[0].Status != "done" {
		t.Errorf("events %+v: want one, done", evs)
	}
	// The stream: the hold is a turn.retrying with reason approval, then
	// the rerun commits once.
	c := openStream(t, addr, "hc", sess, "")
	r := newReader(t)
	deadline := time.AfterFunc(time.Minute, c.close)
	err := follow(c, r, func(ev sseEvent) bool { return ev.Event == "turn.committed" })
	deadline.Stop()
	c.close()
	if err != nil {
		t.Fatalf("replay: %v (%v)", err, r.kinds)
	}
	reasons := []string{}
	for _, f := range r.frames {
		if f.Reason != "" {
			reasons = append(reasons, f.Reason)
		}
	}
	if k := strings.Join(r.kinds, " "); !strings.HasPrefix(k, "turn.started") || !strings.Contains(k, "turn.retrying") || strings.Join(reasons, ",") != "approval" {
		t.Errorf("stream %s (reasons %v): want the hold as turn.retrying with reason approval, then the rerun's commit", k, reasons)
	}
}

// TestWaitExpiresWhileTheHostIsDown: a wait with a timeout falls due while
// its only host is down (killed with SIGKILL); the restarted host expires
// it once — a wait.expired event runs and commits — and resolving it then
// answers 410 wait_expired.
func TestWaitExpiresWhileTheHostIsDown(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	t.Parallel()
	model := newModelServer(t, func(int, map[string]any, http.ResponseWriter, *http.Request) {})
	dir := t.TempDir()
	addr := freePort(t)
	cfg := hcConfig(t, dir, addr, pgtest.DSN(t), model.URL, "", nil, "")
	srv := startServer(t, cfg, addr)
	sess := srv.cli("session", "create", "hc")
	srv.cli("signal", "send", "hc", sess, `{"wait":{"id":"soon","for":"a quick answer","timeout_ms":1500}}`)
	waitUntil(t, "the wait to open", time.Minute, func() bool { return waitStatus(t, srv, sess, "soon") == "open" })
	w, err := srv.api().GetWait(context.Background(), "hc", sess, "soon")
	if err != nil {
		t.Fatal(err)
	}
	srv.kill9()
	if w.ExpiresAt == nil {
		t.Fatalf("wait %+v has no expiry", w)
	}
	time.Sleep(time.Until(*w.ExpiresAt) + 500*time.Millisecond)
	srv = startServer(t, cfg, addr)
	waitUntil(t, "the wait.expired turn to commit", time.Minute, func() bool { return len(srv.transcript("hc", sess)) == 2 })
	ts := srv.transcript("hc", sess)
	if got := ts[1].Messages[len(ts[1].Messages)-1].Content; !strings.Contains(got, `"kind":"wait.expired"`) || !strings.Contains(got, `"id":"soon"`) {
		t.Errorf("the second turn answered %q, want a wait.expired event of wait soon", got)
	}
	if code, body := resolveWait(t, addr, sess, "soon", `{"data":1}`); code != 410 || !strings.Contains(body, "wait_expired") {
		t.Errorf("resolve an expired wait: %d %s, want 410 wait_expired", code, body)
	}
	time.Sleep(500 * time.Millisecond) // a second expiry would show as a third turn
	if evs := srv.events("hc", sess); len(evs) != 2 || len(srv.transcript("hc", sess)) != 2 {
		t.Errorf("events %+v: want the wait's turn and one wait.expired", evs)
	}
}

// TestStreamSteerMidStream steers a turn (four times) while its model
// answer streams, after the agent emitted "intro ": the agent (hcagent)
// does not take steers in, so its reply is refused as stale and the turn
// runs again with the steers, emitting the intro again and replaying the
// model call. A client following the stream must be able to tell: the
// rerun is announced by turn.retrying (reason steer), what it reassembles
// for the event is the intro and the committed answer once, its chunk
// offsets never go back without a turn.retrying, and the event commits
// once.
func TestStreamSteerMidStream(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	t.Parallel()
	parts := tokens("s", 30)
	model := newModelServer(t, func(n int, body map[string]any, w http.ResponseWriter, r *http.Request) {
		slowStream(w, r, 50*time.Millisecond, parts...)
	})
	dir := t.TempDir()
	addr := freePort(t)
	srv := startServer(t, hcConfig(t, dir, addr, pgtest.DSN(t), model.URL, "", nil, ""), addr)
	sess := srv.cli("session", "create", "hc")
	c := openStream(t, addr, "hc", sess, "")
	defer c.close()
	r := newReader(t)
	// The agent emits "intro " before its model call: the host reruns the
	// steered turn (the agent reads no steers), which emits it again, and
	// the stream must say the first run's output is void (turn.retrying,
	// reason steer) so the client does not reassemble it twice.
	intro := abi.CallRequest{Kind: abi.CallKindEmit, Emit: &abi.Chunk{Type: "text", Text: "intro "}}
	srv.cli("signal", "send", "hc", sess, callsMessage(t, intro, modelCall("go on")))
	if err := follow(c, r, func(ev sseEvent) bool { return r.chunks >= 3 }); err != nil {
		t.Fatal(err)
	}
	// Several steers while the answer streams: each raises the delivery's
	// revision, racing the stream's next chunk write.
	for i := range 4 {
		srv.cli("signal", "send", "hc", sess, fmt.Sprintf("faster please %d", i), "--mid-turn", "steer")
		time.Sleep(100 * time.Millisecond)
	}
	deadline := time.AfterFunc(time.Minute, c.close)
	defer deadline.Stop()
	if err := follow(c, r, func(ev sseEvent) bool { return ev.Event == "turn.committed" }); err != nil {
		t.Fatalf("stream: %v (%v)", err, r.kinds)
	}
	t.Logf("the client saw %v", r.kinds)
	evs := srv.events("hc", sess)
	turns := srv.transcript("hc", sess)
	if len(turns) != 1 {
		t.Fatalf("%d turns, want 1", len(turns))
	}
	out := onlyTurnReply(t, srv, sess)
	if len(out) != 2 || out[0].Error != "" {
		t.Fatalf("reply %+v: want the emit's and the model call's outcomes", out)
	}
	if got, want := r.textOf(evs[0].ID), "intro "+out[1].Content; got != want {
		t.Errorf("the client reassembled %q, want the intro and the committed answer %q", got, want)
	}
	reasons := []string{}
	for _, f := range r.frames {
		if f.Reason != "" {
			reasons = append(reasons, f.Reason)
		}
	}
	if len(reasons) == 0 || strings.Trim(strings.ReplaceAll(strings.Join(reasons, ","), "steer", ""), ",") != "" {
		t.Errorf("frame reasons %v: want turn.retrying with reason steer (the first run streamed), and no other", reasons)
	}
}
