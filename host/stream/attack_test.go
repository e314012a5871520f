package stream_test

// Attacks on the stream hub (branch breaker). Each test states what it
// tries and what the hub must do.

import (
	"context"
	"fmt"
	"testing"

	"github.com/paddock-dev/paddock/host/stream"
	"github.com/paddock-dev/paddock/host/stream/streamtest"
	"github.com/paddock-dev/paddock/store"
)

// Found by attack, fixed: a resume position past the session's head (a
// clumsy client sending the Last-Event-ID of another session's stream,
// or of a session whose store was restored from an older backup) was
// taken as is: the subscriber then skipped every new frame up to that
// number, silently — a chat that shows nothing while its turns run. A
// position past the head now gets stream.reset (reload the transcript)
// and continues after the head.
func TestAttackResumePastTheHeadSkipsNewFrames(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		w := streamtest.New(t, st)
		h := stream.New(stream.Options{Store: st})
		defer h.Close()
		key := w.Session()
		tr := w.Start(key, "hi")
		tr.Emit("a")
		tr.Commit("a") // frames 1–3
		for i, from := range []stream.Cursor{{Seq: 50}, {Seq: 60, Chunk: 2, InFrame: true}} {
			sub, err := h.Subscribe(context.Background(), key, from)
			if err != nil {
				t.Fatal(err)
			}
			tr := w.Start(key, "again")
			tr.Emit("b")
			tr.Commit("b")
			h.Poke(key)
			evs := collect(t, sub, 4)
			h0 := 3 * (i + 1) // the head when it subscribed
			wantIDs(t, evs, fmt.Sprintf("stream.reset#%d turn.started#%d chunk#%d.0 turn.committed#%d", h0, h0+1, h0+2, h0+3))
			sub.Close()
		}
	})
}
