package host_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/store"
)

// notified counts Options.StreamNotify calls by session.
type notified struct {
	mu sync.Mutex
	n  map[store.ActorKey]int
}

func (n *notified) notify(k store.ActorKey) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.n == nil {
		n.n = map[store.ActorKey]int{}
	}
	n.n[k]++
}

func (n *notified) count(k store.ActorKey) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.n[k]
}

// frames returns the whole stream of key.
func (f *fixture) frames(key store.ActorKey) []store.Frame {
	f.t.Helper()
	var out []store.Frame
	after := int64(0)
	for {
		pg, err := f.st.StreamFrames(context.Background(), store.StreamFramesParams{Key: key, After: after, Limit: 500})
		if err != nil {
			f.t.Fatal(err)
		}
		out = append(out, pg.Frames...)
		if len(pg.Frames) == 0 || pg.Frames[len(pg.Frames)-1].Seq >= pg.Head {
			return out
		}
		after = pg.Frames[len(pg.Frames)-1].Seq
	}
}

// streamLine describes a frame for comparisons: its kind and attempt, and
// for chunk frames each chunk as offset:type:text-or-data[@call_seq].
type streamChunk struct {
	Attempt int
	Offset  int
	abi.Chunk
}

// describeStream checks the frames are numbered 1, 2, 3… and returns a
// compact description (chunk frames merged per attempt, as a client sees
// them) and the chunks in order.
func describeStream(t *testing.T, frames []store.Frame) (kinds []string, chunks []streamChunk) {
	t.Helper()
	for i, fr := range frames {
		if fr.Seq != int64(i+1) {
			t.Fatalf("frame %d has seq %d: the stream has a gap", i, fr.Seq)
		}
		if fr.Kind != store.FrameChunk {
			kinds = append(kinds, fmt.Sprintf("%s#%d", fr.Kind, fr.Attempt))
			continue
		}
		var body store.ChunkBody
		if err := json.Unmarshal(fr.Body, &body); err != nil {
			t.Fatalf("chunk frame %d: %v", fr.Seq, err)
		}
		if k := fmt.Sprintf("chunks#%d", fr.Attempt); len(kinds) == 0 || kinds[len(kinds)-1] != k {
			kinds = append(kinds, k)
		}
		for j, c := range body.Chunks {
			chunks = append(chunks, streamChunk{Attempt: fr.Attempt, Offset: body.Offset + j, Chunk: c})
		}
	}
	return kinds, chunks
}

// checkOffsets: each attempt's chunks have offsets 0, 1, 2… in order.
func checkOffsets(t *testing.T, chunks []streamChunk) {
	t.Helper()
	next := map[int]int{}
	for _, c := range chunks {
		if c.Offset != next[c.Attempt] {
			t.Fatalf("attempt %d: chunk offset %d, want %d (all: %+v)", c.Attempt, c.Offset, next[c.Attempt], chunks)
		}
		next[c.Attempt]++
	}
}

func texts(chunks []streamChunk, attempt int) string {
	var b strings.Builder
	for _, c := range chunks {
		if c.Attempt == attempt && c.Type == abi.ChunkText {
			b.WriteString(c.Text)
		}
	}
	return b.String()
}

// TestEmittedChunksReachTheStreamBeforeTheCommit: a turn's emits are
// stored as chunk frames with offsets 0..n-1 between its turn.started and
// its turn.committed; the host notifies the stream's subscribers; an emit
// needs no capability and no executor; an invalid chunk is refused with
// invalid_request and the turn goes on.
func TestEmittedChunksReachTheStreamBeforeTheCommit(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		var n notified
		var refused string
		f := runHost(t, host.Options{Store: st, Logger: quietLogger(), Policy: testPolicy(), StreamNotify: n.notify,
			Runner: funcRunner{map[string]abi.TurnFunc{"talk": func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
				for _, w := range strings.Fields("one two three four five") {
					if err := abi.Emit(ctx, w+" "); err != nil {
						return nil, err
					}
				}
				if err := abi.EmitJSON(ctx, abi.ChunkTool, map[string]string{"tool": "search", "status": "done"}); err != nil {
					return nil, err
				}
				err := abi.EmitChunk(ctx, &abi.Chunk{Type: abi.ChunkText, Data: json.RawMessage(`1`)})
				var ce *abi.CallError
				if errors.As(err, &ce) {
					refused = string(ce.Code)
				}
				return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "one two three four five"}}}, nil
			}}}})
		key := f.session(f.agent("talk"))
		f.signal(key, "go")
		f.waitFor("the turn to commit", func() bool { return f.get(key).TurnCount == 1 })

		kinds, chunks := describeStream(t, f.frames(key))
		if got, want := strings.Join(kinds, " "), "turn.started#1 chunks#1 turn.committed#1"; got != want {
			t.Errorf("frames: %s, want %s", got, want)
		}
		checkOffsets(t, chunks)
		if len(chunks) != 6 || texts(chunks, 1) != "one two three four five " || chunks[5].Type != abi.ChunkTool ||
			string(chunks[5].Data) != `{"status":"done","tool":"search"}` {
			t.Errorf("chunks = %+v", chunks)
		}
		if refused != string(abi.CallInvalid) {
			t.Errorf("a text chunk with data: %q, want invalid_request", refused)
		}
		// turn.started, at least one chunk frame, turn.committed (the last
		// is notified just after the commit the test saw).
		f.waitFor("StreamNotify for the turn's three writes", func() bool { return n.count(key) >= 3 })
	})
}

// TestARetriedAttemptStreamsAgainAfterTurnRetrying: the first attempt
// emits and then fails; the stream holds its chunks, turn.retrying, the
// second attempt's turn.started, its chunks (offsets from 0 again) and
// turn.committed.
func TestARetriedAttemptStreamsAgainAfterTurnRetrying(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		f := start(t, st, map[string]abi.TurnFunc{"retry": func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			for i := range 3 {
				_ = abi.Emit(ctx, fmt.Sprintf("a%d.%d ", req.Attempt, i))
			}
			if req.Attempt == 1 {
				return &abi.TurnResult{Outcome: abi.OutcomeError, Error: "try again"}, nil
			}
			return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "done"}}}, nil
		}}, testPolicy())
		key := f.session(f.agent("retry"))
		f.signal(key, "go")
		f.waitFor("the retry to commit", func() bool { return f.get(key).TurnCount == 1 })

		frames := f.frames(key)
		kinds, chunks := describeStream(t, frames)
		want := "turn.started#1 chunks#1 turn.retrying#1 turn.started#2 chunks#2 turn.committed#2"
		if got := strings.Join(kinds, " "); got != want {
			t.Errorf("frames: %s, want %s", got, want)
		}
		checkOffsets(t, chunks)
		if a, b := texts(chunks, 1), texts(chunks, 2); a != "a1.0 a1.1 a1.2 " || b != "a2.0 a2.1 a2.2 " {
			t.Errorf("attempt texts %q and %q", a, b)
		}
		for _, fr := range frames {
			if fr.Kind == store.FrameTurnRetrying {
				var body store.AttemptEndedBody
				if err := json.Unmarshal(fr.Body, &body); err != nil || body.Reason != store.EndReasonError || !strings.Contains(body.Error, "try again") {
					t.Errorf("turn.retrying body %s (%v)", fr.Body, err)
				}
			}
		}
	})
}

// TestEmitLimitsAndLateEmits: past stream.max_bytes_per_turn an emit
// answers too_large (the turn goes on and commits); an emit made after
// the turn returned answers cancelled and reaches no frame.
func TestEmitLimitsAndLateEmits(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		pol := testPolicy()
		pol.Stream.MaxBytesPerTurn = 100 << 10
		var mu sync.Mutex
		var codes []string
		var late abi.Caller
		f := start(t, st, map[string]abi.TurnFunc{"big": func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			big := strings.Repeat("x", 40<<10)
			for range 3 {
				code := "ok"
				if err := abi.Emit(ctx, big); err != nil {
					code = string(err.(*abi.CallError).Code)
				}
				mu.Lock()
				codes = append(codes, code)
				mu.Unlock()
			}
			mu.Lock()
			late = abi.CallerOf(ctx)
			mu.Unlock()
			return &abi.TurnResult{}, nil
		}}, pol)
		key := f.session(f.agent("big"))
		f.signal(key, "go")
		f.waitFor("the turn to commit", func() bool { return f.get(key).TurnCount == 1 })
		mu.Lock()
		defer mu.Unlock()
		if got := strings.Join(codes, ","); got != "ok,ok,too_large" {
			t.Errorf("emits answered %s, want ok,ok,too_large", got)
		}
		res := late.Call(context.Background(), &abi.CallRequest{Kind: abi.CallKindEmit, Emit: &abi.Chunk{Type: abi.ChunkText, Text: "late"}})
		if res.Error == nil || res.Error.Code != abi.CallCancelled {
			t.Errorf("an emit after the turn: %+v, want cancelled", res)
		}
		_, chunks := describeStream(t, f.frames(key))
		checkOffsets(t, chunks)
		if len(chunks) != 2 {
			t.Errorf("%d chunks stored, want the 2 accepted", len(chunks))
		}
	})
}

// TestOutcomeWaitSleepsUntilResolvedOrExpired: a turn with outcome wait
// commits and the session sleeps (wait); resolving the wait runs a turn
// whose event is wait.resolved with the wait and the resolver's data; a
// wait with a timeout expires by itself into a wait.expired turn.
func TestOutcomeWaitSleepsUntilResolvedOrExpired(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		var mu sync.Mutex
		var seen []string
		f := start(t, st, map[string]abi.TurnFunc{"ask": func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			e := req.Event
			mu.Lock()
			defer mu.Unlock()
			switch e.Kind {
			case abi.EventMessage:
				seen = append(seen, "message "+e.Message)
				spec := &abi.WaitSpec{ID: "day-" + e.Message, For: "a day", Data: json.RawMessage(`["mon","tue"]`)}
				if e.Message == "short" {
					spec.TimeoutMs = 1
				}
				return &abi.TurnResult{Outcome: abi.OutcomeWait, Wait: spec,
					Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "which day?"}}}, nil
			case abi.EventWaitResolved, abi.EventWaitExpired:
				if e.Wait == nil {
					seen = append(seen, e.Kind+" without wait")
					break
				}
				seen = append(seen, fmt.Sprintf("%s %s for=%q data=%s message=%q", e.Kind, e.Wait.ID, e.Wait.For, e.Wait.Data, e.Message))
			}
			return &abi.TurnResult{}, nil
		}}, testPolicy())
		key := f.session(f.agent("ask"))
		f.signal(key, "long")
		f.waitFor("the waiting turn to commit and the session to sleep", func() bool {
			s := f.get(key)
			return s.TurnCount == 1 && s.Status == store.SessionSleeping
		})
		if s := f.get(key); s.SleepReason != store.SleepReasonWait {
			t.Errorf("sleep reason %q, want wait", s.SleepReason)
		}
		w, err := st.GetWait(context.Background(), key, "day-long")
		if err != nil || w.Status != store.WaitOpen || w.Kind != store.WaitKindWait || string(w.Data) != `["mon","tue"]` {
			t.Fatalf("wait = %+v, %v", w, err)
		}
		if _, err := st.ResolveWait(context.Background(), store.ResolveWaitParams{Key: key, WaitID: "day-long", Resolution: json.RawMessage(`{"day":"tue"}`)}); err != nil {
			t.Fatal(err)
		}
		f.h.Ensure(key)
		f.waitFor("the wait.resolved turn", func() bool { return f.get(key).TurnCount == 2 })

		f.signal(key, "short")
		f.waitFor("the wait.expired turn", func() bool { return f.get(key).TurnCount == 4 })
		mu.Lock()
		got := strings.Join(seen, "\n")
		mu.Unlock()
		want := strings.Join([]string{
			"message long",
			`wait.resolved day-long for="a day" data={"day":"tue"} message=""`,
			"message short",
			`wait.expired day-short for="a day" data= message=""`,
		}, "\n")
		if got != want {
			t.Errorf("the agent saw\n%s\nwant\n%s", got, want)
		}
		kinds, _ := describeStream(t, f.frames(key))
		if s := strings.Join(kinds, " "); !strings.Contains(s, "turn.committed#1 wait.opened#") {
			t.Errorf("frames %s: want wait.opened after the waiting turn's commit", s)
		}
	})
}

// sseChatServer speaks OpenAI's streamed chat completions: it answers
// every request with the deltas "Hel", "lo, ", "world" and counts requests.
type sseChatServer struct {
	*httptest.Server
	n atomic.Int32
}

func newSSEChatServer(t *testing.T) *sseChatServer {
	s := &sseChatServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.n.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for _, d := range []string{"Hel", "lo, ", "world"} {
			b, _ := json.Marshal(map[string]any{"id": "c", "model": "m1", "choices": []any{map[string]any{"index": 0, "delta": map[string]any{"content": d}}}})
			fmt.Fprintf(w, "data: %s\n\n", b)
			w.(http.Flusher).Flush()
		}
		fmt.Fprint(w, `data: {"id":"c","model":"m1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\n")
		fmt.Fprint(w, `data: {"id":"c","model":"m1","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}`+"\n\n")
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(s.Close)
	return s
}

// TestAStreamedModelCallStreamsItsTextAndAReplayStreamsItWhole: a model
// call's deltas reach the stream as text chunks carrying the call's seq;
// the retry, which replays the call from the journal without a request,
// streams the recorded text as one chunk with the same seq.
func TestAStreamedModelCallStreamsItsTextAndAReplayStreamsItWhole(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		srv := newSSEChatServer(t)
		f := startWithCalls(t, st, map[string]abi.TurnFunc{"stream": func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			_ = abi.Emit(ctx, "thinking… ")
			r := ask(ctx, "hi")
			if req.Attempt == 1 {
				return &abi.TurnResult{Outcome: abi.OutcomeError, Error: "again"}, nil
			}
			return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: r}}}, nil
		}}, srv.URL)
		key := f.session(f.agent("stream"))
		f.signal(key, "go")
		f.waitFor("the retry to commit", func() bool {
			if e := f.events(key); len(e) > 0 && e[0].Status == store.EventDeadLetter {
				t.Fatalf("event %s after %d attempts: %s", e[0].Status, e[0].Attempts, e[0].LastError)
			}
			return f.get(key).TurnCount == 1
		})
		if n := srv.n.Load(); n != 1 {
			t.Errorf("the model server got %d requests, want 1 (the retry replays)", n)
		}
		kinds, chunks := describeStream(t, f.frames(key))
		if got, want := strings.Join(kinds, " "), "turn.started#1 chunks#1 turn.retrying#1 turn.started#2 chunks#2 turn.committed#2"; got != want {
			t.Errorf("frames %s, want %s", got, want)
		}
		checkOffsets(t, chunks)
		var live, replayed []string
		for _, c := range chunks {
			d := fmt.Sprintf("%q@%d", c.Text, c.CallSeq)
			if c.Attempt == 1 {
				live = append(live, d)
			} else {
				replayed = append(replayed, d)
			}
		}
		if got, want := strings.Join(live, " "), `"thinking… "@0 "Hel"@1 "lo, "@1 "world"@1`; got != want {
			t.Errorf("attempt 1 chunks %s, want %s", got, want)
		}
		if got, want := strings.Join(replayed, " "), `"thinking… "@0 "Hello, world"@1`; got != want {
			t.Errorf("attempt 2 chunks %s, want %s", got, want)
		}
	})
}

// TestASteeredRerunRestartsTheStream: a worker that does not read steers
// emits "intro ", streams a model call, and is steered; its reply is
// refused as stale_revision and the host reruns the turn in the same
// attempt. The stream says so — turn.retrying with reason steer, then
// turn.started, of the same attempt — and the rerun's chunks (the intro
// again, the replayed call's text whole) start at offset 0, so a client
// that drops the event's chunks at turn.retrying reassembles exactly the
// rerun's output, with no repeat.
func TestASteeredRerunRestartsTheStream(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		srv := newSSEChatServer(t)
		emitted := make(chan struct{}, 1)
		steered := make(chan struct{})
		f := startWithCalls(t, st, map[string]abi.TurnFunc{"steer": func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			if r := abi.Emit(ctx, "intro "); r != nil {
				return nil, r
			}
			r := ask(ctx, "hi")
			if len(req.Steers) == 0 {
				select {
				case emitted <- struct{}{}:
				default:
				}
				select { // busy until steered; never reads steers
				case <-steered:
				case <-ctx.Done():
				}
				return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "unsteered"}}}, nil
			}
			return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: r + " / " + req.Steers[0].Message}}}, nil
		}}, srv.URL)
		key := f.session(f.agent("steer"))
		f.signal(key, "go")
		recv(t, emitted)
		// The first run's chunks are stored before the steer.
		f.waitFor("the first run's chunks", func() bool {
			_, chunks := describeStream(t, f.frames(key))
			return len(chunks) == 4
		})
		payload, _ := json.Marshal(map[string]string{"message": "left"})
		if _, err := st.Steer(context.Background(), store.SteerParams{Key: key, Payload: payload, DeliveryID: "d-" + key.SessionID}); err != nil {
			t.Fatal(err)
		}
		close(steered)
		f.h.Ensure(key)
		f.waitFor("the rerun to commit", func() bool { return f.get(key).TurnCount == 1 })
		if n := srv.n.Load(); n != 1 {
			t.Errorf("the model server got %d requests, want 1 (the rerun replays)", n)
		}
		frames := f.frames(key)
		kinds, _ := describeStream(t, frames)
		if got, want := strings.Join(kinds, " "), "turn.started#1 chunks#1 turn.retrying#1 turn.started#1 chunks#1 turn.committed#1"; got != want {
			t.Fatalf("frames %s, want %s", got, want)
		}
		// A client: chunks in offset order per run, dropped at turn.retrying.
		var runs [][]string
		text, next := "", 0
		for _, fr := range frames {
			switch fr.Kind {
			case store.FrameTurnStarted:
				runs = append(runs, nil)
			case store.FrameTurnRetrying:
				var b store.AttemptEndedBody
				if err := json.Unmarshal(fr.Body, &b); err != nil {
					t.Fatal(err)
				}
				if b.Reason != store.EndReasonSteer || b.NextAttemptAt != nil {
					t.Errorf("turn.retrying %s, want reason steer and no next_attempt_at", fr.Body)
				}
				text, next = "", 0
			case store.FrameChunk:
				var b store.ChunkBody
				if err := json.Unmarshal(fr.Body, &b); err != nil {
					t.Fatal(err)
				}
				if b.Offset != next {
					t.Errorf("chunk frame %d has offset %d, want %d", fr.Seq, b.Offset, next)
				}
				for _, c := range b.Chunks {
					text += c.Text
					runs[len(runs)-1] = append(runs[len(runs)-1], fmt.Sprintf("%q@%d", c.Text, c.CallSeq))
				}
				next = b.Offset + len(b.Chunks)
			}
		}
		if got, want := fmt.Sprint(runs), `[["intro "@0 "Hel"@1 "lo, "@1 "world"@1] ["intro "@0 "Hello, world"@1]]`; got != want {
			t.Errorf("chunks per run %s, want %s", got, want)
		}
		tr := f.transcript(key)[0]
		reply := tr.Messages[len(tr.Messages)-1].Content
		if want := `seq 1 "Hello, world" replayed=true / left`; reply != want {
			t.Errorf("committed reply %q, want %q", reply, want)
		}
		if text != "intro Hello, world" {
			t.Errorf("a client reassembles %q, want the rerun's output %q", text, "intro Hello, world")
		}
	})
}

// TestLargeOutputIsSplitIntoFramesTheStoreAccepts: 600 KiB emitted at
// once — one chunk of control characters that JSON escapes sixfold among
// them — reach the stream in several chunk frames, every one within the
// store's frame limit, with gap-free offsets.
func TestLargeOutputIsSplitIntoFramesTheStoreAccepts(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		f := start(t, st, map[string]abi.TurnFunc{"big": func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			for i := range 10 {
				text := strings.Repeat(string(rune('a'+i)), 60<<10)
				if i == 3 {
					text = strings.Repeat("\x01", 60<<10)
				}
				if err := abi.Emit(ctx, text); err != nil {
					return nil, err
				}
			}
			return &abi.TurnResult{}, nil
		}}, testPolicy())
		key := f.session(f.agent("big"))
		f.signal(key, "go")
		f.waitFor("the turn to commit", func() bool { return f.get(key).TurnCount == 1 })
		frames := f.frames(key)
		_, chunks := describeStream(t, frames)
		checkOffsets(t, chunks)
		if len(chunks) != 10 || texts(chunks, 1) == "" || len(texts(chunks, 1)) != 600<<10 {
			t.Fatalf("%d chunks, %d bytes of text; want 10 and 600 KiB", len(chunks), len(texts(chunks, 1)))
		}
		n := 0
		for _, fr := range frames {
			if fr.Kind == store.FrameChunk {
				n++
				if len(fr.Body) > store.MaxChunkFrameBytes {
					t.Errorf("frame %d is %d bytes", fr.Seq, len(fr.Body))
				}
			}
		}
		if n < 5 {
			t.Errorf("%d chunk frames for 600 KiB, want at least 5 (128 KiB each at most)", n)
		}
	})
}

// fencingStore refuses every AppendChunks with a *store.FenceError, as the
// store does for a stale attempt, and reports the first refusal.
type fencingStore struct {
	store.Store
	once    sync.Once
	refused chan struct{}
}

func (s *fencingStore) AppendChunks(context.Context, store.AppendChunksParams) (store.Frame, error) {
	s.once.Do(func() { close(s.refused) })
	return store.Frame{}, &store.FenceError{Reason: store.FenceStaleEpoch, Detail: "test"}
}

// TestEmitsAfterTheFencesRefusedChunksAnswerCancelled: once the store
// refused the attempt's chunks (a stale attempt), its later emits answer
// cancelled at once.
func TestEmitsAfterTheFencesRefusedChunksAnswerCancelled(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		fs := &fencingStore{Store: st, refused: make(chan struct{})}
		var got string
		f := start(t, fs, map[string]abi.TurnFunc{"zombie": func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			first := abi.Emit(ctx, "before")
			<-fs.refused // the buffer's flush was refused
			var second error
			for second == nil { // the refusal is recorded just after the store answers
				second = abi.Emit(ctx, "after")
			}
			got = fmt.Sprintf("%v / %s", first, second.(*abi.CallError).Code)
			return &abi.TurnResult{}, nil
		}}, testPolicy())
		key := f.session(f.agent("zombie"))
		f.signal(key, "go")
		f.waitFor("the turn to commit", func() bool { return f.get(key).TurnCount == 1 })
		if got != "<nil> / cancelled" {
			t.Errorf("emits answered %s, want <nil> / cancelled", got)
		}
	})
}
