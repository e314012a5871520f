package examples_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// streamOf reads a session's whole stream and describes it per turn, as a
// client following it sees it: the frame kinds in order (a run of chunk
// frames as one "chunks"), and per attempt its chunks merged — the text of
// each streamed model call (by call_seq) and each tool chunk. It fails
// the test on a gap in the frame numbers or in an attempt's offsets.
func (w *world) streamOf(key store.ActorKey) []string {
	w.t.Helper()
	var frames []store.Frame
	for after := int64(0); ; {
		pg, err := w.st.StreamFrames(context.Background(), store.StreamFramesParams{Key: key, After: after, Limit: 500})
		if err != nil {
			w.t.Fatal(err)
		}
		frames = append(frames, pg.Frames...)
		if len(pg.Frames) == 0 || pg.Frames[len(pg.Frames)-1].Seq >= pg.Head {
			break
		}
		after = pg.Frames[len(pg.Frames)-1].Seq
	}
	var out []string
	next := map[string]int{} // next offset by event/attempt
	var text strings.Builder
	textSeq := 0
	endText := func() {
		if text.Len() > 0 {
			out = append(out, fmt.Sprintf("  text@%d %q", textSeq, text.String()))
			text.Reset()
		}
	}
	for i, f := range frames {
		if f.Seq != int64(i+1) {
			w.t.Fatalf("frame %d has seq %d: a gap", i, f.Seq)
		}
		if f.Kind == store.FrameTurnStarted {
			// An attempt held for an approval runs again under the same
			// attempt number: its stream starts again at offset 0.
			next[fmt.Sprintf("%d/%d", f.EventID, f.Attempt)] = 0
		}
		if f.Kind != store.FrameChunk {
			endText()
			out = append(out, fmt.Sprintf("%s attempt %d", f.Kind, f.Attempt))
			continue
		}
		var body store.ChunkBody
		if err := json.Unmarshal(f.Body, &body); err != nil {
			w.t.Fatal(err)
		}
		at := fmt.Sprintf("%d/%d", f.EventID, f.Attempt)
		if body.Offset != next[at] {
			w.t.Fatalf("event/attempt %s: a chunk frame at offset %d, want %d", at, body.Offset, next[at])
		}
		next[at] += len(body.Chunks)
		for _, c := range body.Chunks {
			switch c.Type {
			case abi.ChunkText:
				if c.CallSeq != textSeq {
					endText()
				}
				textSeq = c.CallSeq
				text.WriteString(c.Text)
			default:
				endText()
				out = append(out, fmt.Sprintf("  %s %s", c.Type, c.Data))
			}
		}
	}
	endText()
	return out
}

// TestTheChatAgentStreamsItsTurnsOnEveryWorkerKind: the chat agent's
// turns reach the session stream as chunk frames between turn.started and
// turn.committed — the model's streamed text with its call's seq, and the
// agent's own tool chunks (emit) — with offsets 0..n-1 per attempt, and
// identically as a wasm module, a plugin worker and a remote worker over
// the fabric (emit rides each kind's host-call lane).
func TestTheChatAgentStreamsItsTurnsOnEveryWorkerKind(t *testing.T) {
	t.Parallel()
	r := startChatHost(t)
	script := r.chatScript()
	streams := map[string][]string{}
	for _, agent := range []string{"chat", "chat-plugin", "chat-remote"} {
		key := r.run(agent, script)
		streams[agent] = r.streamOf(key)
	}
	want := []string{
		"turn.started attempt 1",
		`  tool {"tool":"add_note","id":"call_2","status":"running"}`,
		`  tool {"tool":"add_note","id":"call_2","status":"done"}`,
		`  text@2 "tool said: noted (1)"`,
		"turn.committed attempt 1",
		"turn.started attempt 1",
		`  tool {"tool":"fetch_url","id":"call_6","status":"running"}`,
		`  tool {"tool":"fetch_url","id":"call_6","status":"done"}`,
		fmt.Sprintf("  text@3 %q", "tool said: status 200\n"+pageBody),
		"turn.committed attempt 1",
		"turn.started attempt 1",
		`  tool {"tool":"list_notes","id":"call_10","status":"running"}`,
		`  tool {"tool":"list_notes","id":"call_10","status":"done"}`,
		`  text@2 "tool said: 1. buy milk\n"`,
		"turn.committed attempt 1",
		"turn.started attempt 1",
		`  text@1 "you said: thanks"`,
		"turn.committed attempt 1",
	}
	for agent, got := range streams {
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("%s's stream:\n%s\n\nwant:\n%s", agent, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
}
