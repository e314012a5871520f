package examples_test

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/host/calls"
	"github.com/paddock-dev/paddock/store"
)

// heldApproval waits until the session sleeps for an approval and returns
// its open approval wait.
func (w *world) heldApproval(key store.ActorKey) store.Wait {
	w.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		pg, err := w.st.ListWaits(context.Background(), store.ListWaitsParams{AgentUID: key.AgentUID, SessionID: key.SessionID, Status: store.WaitOpen})
		if err != nil {
			w.t.Fatal(err)
		}
		s, err := w.st.GetSession(context.Background(), key)
		if err != nil {
			w.t.Fatal(err)
		}
		if len(pg.Waits) == 1 && s.Status == store.SessionSleeping && s.SleepReason == store.SleepReasonApproval {
			return pg.Waits[0]
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("session %s did not hold for an approval (status %s, %d open waits)", key, s.Status, len(pg.Waits))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestTheChatAgentsPageFetchWaitsForApprovalOnEveryWorkerKind: with GETs
// of the page needing approval, the chat agent's "fetch" turn — a model
// call, then the fetch — holds before the fetch goes out, as a wasm
// module, a plugin worker and a remote worker alike. Approved, the turn
// runs again: the first model call is replayed (the model server is not
// asked again), the page is fetched exactly once, and the turn commits
// with the page. Rejected, the tool sees the call denied with the
// approver's reason and the page is never fetched.
// holdThenCommit matches a stream with an approval hold (turn.retrying,
// then wait.opened) and, last, a turn.committed; the test requires both
// attempts to be the same.
var holdThenCommit = regexp.MustCompile(`(?s)turn\.retrying attempt (\d+)\nwait\.opened.*turn\.committed attempt (\d+)$`)

func TestTheChatAgentsPageFetchWaitsForApprovalOnEveryWorkerKind(t *testing.T) {
	t.Parallel()
	r := startChatHostWith(t, newModelServer(t), func(c *calls.Capabilities) {
		c.Approval = calls.ApprovalRules{HTTP: []calls.ApprovalHTTPRule{{Host: "127.0.0.1", PathPrefix: "/page"}}}
	})
	for _, agent := range []string{"chat", "chat-plugin", "chat-remote"} {
		t.Run(agent, func(t *testing.T) {
			r.t = t
			defer func() { r.t = nil }()
			models, pages := r.model.requests(), r.pageHits.Load()

			key := r.session(agent)
			r.send(key, "fetch "+r.page)
			w := r.heldApproval(key)
			if w.Kind != store.WaitKindApproval || w.CallSeq != 2 || w.For != "approve GET "+r.page {
				t.Errorf("approval wait %+v", w)
			}
			if got := r.model.requests() - models; got != 1 {
				t.Errorf("%d model requests before the decision, want 1", got)
			}
			if r.pageHits.Load() != pages {
				t.Fatal("the page was fetched before the approval")
			}
			if _, err := r.st.ResolveWait(context.Background(), store.ResolveWaitParams{Key: key, WaitID: w.ID, Resolution: json.RawMessage(`{"approved":true}`)}); err != nil {
				t.Fatal(err)
			}
			r.h.Ensure(key)
			r.settle(key)
			if got := r.replies(key); len(got) != 1 || got[0] != "tool said: status 200\n"+pageBody {
				t.Errorf("replies %q", got)
			}
			if got := r.pageHits.Load() - pages; got != 1 {
				t.Errorf("the page was fetched %d times, want once", got)
			}
			if got := r.model.requests() - models; got != 2 {
				t.Errorf("%d model requests in all, want 2 (the first replayed on the rerun)", got)
			}
			// The hold does not use up an attempt: the turn commits under
			// the attempt it held at (1, or later when a remote worker's
			// first attempt was lost on a loaded machine).
			s := strings.Join(r.streamOf(key), "\n")
			if m := holdThenCommit.FindStringSubmatch(s); m == nil || m[1] != m[2] {
				t.Errorf("stream:\n%s\nwant the hold (turn.retrying, wait.opened) and the commit", s)
			}

			key = r.session(agent)
			r.send(key, "fetch "+r.page)
			w = r.heldApproval(key)
			if _, err := r.st.ResolveWait(context.Background(), store.ResolveWaitParams{Key: key, WaitID: w.ID,
				Resolution: json.RawMessage(`{"approved":false,"reason":"not today"}`)}); err != nil {
				t.Fatal(err)
			}
			r.h.Ensure(key)
			r.settle(key)
			want := "tool said: error: host call denied: the approver rejected this call: not today"
			if got := r.replies(key); len(got) != 1 || got[0] != want {
				t.Errorf("replies %q, want %q", got, want)
			}
			if got := r.pageHits.Load() - pages; got != 1 {
				t.Errorf("the page was fetched %d times in all, want still once", got)
			}
		})
	}
}
