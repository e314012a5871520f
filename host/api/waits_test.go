package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/host/api/client"
	"github.com/paddock-dev/paddock/store"
)

// TestWaitsListShowResolve: a turn that ended with outcome wait and a held
// approval are listed (per session, per agent, by status), shown, and
// resolved once; the stream shows wait.opened and wait.resolved; the
// refusals say what happened.
func TestWaitsListShowResolve(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newStreamEnv(t, driver, "")
		ctx := context.Background()
		key := e.w.Session()
		es := e.open(key, "")
		e.w.Start(key, "ask").CommitWait(store.WaitParams{ID: "ask-1", For: "your name?", Data: json.RawMessage(`{"form":"name"}`)})
		other := e.w.Session()
		e.w.Start(other, "pay").Hold(store.WaitParams{ID: "pay", For: "POST https://pay.example", CallSeq: 1, CallDigest: "sha256:abc"})

		got := read(t, es, 3)
		if sseIDs(got) != "turn.started#1 turn.committed#2 wait.opened#3" {
			t.Fatalf("stream: %s", sseIDs(got))
		}
		list, err := e.c.SessionWaits(ctx, "notes", key.SessionID, client.ListWaitsOptions{})
		if err != nil || len(list.Waits) != 1 || list.Waits[0].WaitID != "ask-1" || list.Waits[0].Kind != store.WaitKindWait ||
			list.Waits[0].Status != store.WaitOpen || list.Waits[0].For != "your name?" || list.Waits[0].Agent != "notes" {
			t.Fatalf("session waits: %+v %v", list, err)
		}
		open, err := e.c.AgentWaits(ctx, "notes", client.ListWaitsOptions{Status: store.WaitOpen})
		if err != nil || len(open.Waits) != 2 || open.Waits[1].Kind != store.WaitKindApproval || open.Waits[1].CallSeq != 1 {
			t.Fatalf("agent's open waits: %+v %v", open, err)
		}
		page, err := e.c.AgentWaits(ctx, "notes", client.ListWaitsOptions{Limit: 1})
		if err != nil || len(page.Waits) != 1 {
			t.Fatalf("page 1: %+v %v", page, err)
		}
		page2, err := e.c.AgentWaits(ctx, "notes", client.ListWaitsOptions{Limit: 1, After: page.NextAfter})
		if err != nil || len(page2.Waits) != 1 || page2.Waits[0].WaitID != "pay" {
			t.Fatalf("page 2 after %d: %+v %v", page.NextAfter, page2, err)
		}
		w, err := e.c.GetWait(ctx, "notes", key.SessionID, "ask-1")
		if err != nil || string(w.Data) != `{"form":"name"}` {
			t.Fatalf("get: %+v %v", w, err)
		}

		// Refusals before anything is resolved.
		yes := true
		for _, c := range []struct {
			session, wait string
			body          client.ResolveWaitRequest
			status        int
			code, field   string
		}{
			{key.SessionID, "nope", client.ResolveWaitRequest{}, 404, "wait_not_found", "wait"},
			{key.SessionID, "bad id!", client.ResolveWaitRequest{}, 400, "invalid_parameter", "wait"},
			{key.SessionID, "ask-1", client.ResolveWaitRequest{Approved: &yes}, 400, "invalid_field", "approved"},
			{other.SessionID, "pay", client.ResolveWaitRequest{Data: json.RawMessage(`1`)}, 400, "invalid_field", "data"},
			{other.SessionID, "pay", client.ResolveWaitRequest{Reason: "no"}, 400, "missing_field", "approved"},
		} {
			_, err := e.c.ResolveWait(ctx, "notes", c.session, c.wait, c.body)
			ae := client.AsError(err)
			if ae == nil || ae.Status != c.status || ae.Code != c.code || ae.Field != c.field || ae.Message == "" {
				t.Errorf("resolve %s %+v: %v, want %d %s [%s]", c.wait, c.body, err, c.status, c.code, c.field)
			}
		}

		w, err = e.c.ResolveWait(ctx, "notes", key.SessionID, "ask-1", client.ResolveWaitRequest{Data: json.RawMessage(`{"name":"Ada"}`)})
		if err != nil || w.Status != store.WaitResolved || string(w.Resolution) != `{"name":"Ada"}` || w.ClosedAt == nil {
			t.Fatalf("resolve: %+v %v", w, err)
		}
		if got := read(t, es, 1); got[0].Event != "wait.resolved" {
			t.Fatalf("stream after resolve: %s", sseIDs(got))
		}
		// The resolution is the session's next event.
		evs, err := e.c.ListEvents(ctx, "notes", key.SessionID, client.ListEventsOptions{Status: store.EventOpen})
		if err != nil || len(evs) != 1 || evs[0].Kind != "wait.resolved" {
			t.Fatalf("open events after resolve: %+v %v", evs, err)
		}
		_, err = e.c.ResolveWait(ctx, "notes", key.SessionID, "ask-1", client.ResolveWaitRequest{Data: json.RawMessage(`2`)})
		if ae := client.AsError(err); ae == nil || ae.Status != 409 || ae.Code != client.CodeWaitResolved {
			t.Fatalf("resolve twice: %v, want 409 wait_resolved", err)
		}
		no := false
		w, err = e.c.ResolveWait(ctx, "notes", other.SessionID, "pay", client.ResolveWaitRequest{Approved: &no, Reason: "too much"})
		if err != nil || w.Status != store.WaitResolved || string(w.Resolution) != `{"approved":false,"reason":"too much"}` {
			t.Fatalf("reject: %+v %v", w, err)
		}
	})
}

func TestResolvingAnExpiredOrDestroyedWaitIsGone(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newStreamEnv(t, driver, "")
		ctx := context.Background()
		key := e.w.Session()
		e.w.Start(key, "ask").CommitWait(store.WaitParams{ID: "soon", Timeout: time.Millisecond})
		for {
			keys, err := e.st.ExpireDueWaits(ctx, 10)
			if err != nil {
				t.Fatal(err)
			}
			if len(keys) > 0 {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		_, err := e.c.ResolveWait(ctx, "notes", key.SessionID, "soon", client.ResolveWaitRequest{})
		if ae := client.AsError(err); ae == nil || ae.Status != http.StatusGone || ae.Code != client.CodeWaitExpired {
			t.Fatalf("resolve an expired wait: %v, want 410 wait_expired", err)
		}
		gone := e.w.Session()
		e.w.Start(gone, "ask").CommitWait(store.WaitParams{ID: "w"})
		if _, err := e.st.DestroySession(ctx, gone); err != nil {
			t.Fatal(err)
		}
		_, err = e.c.ResolveWait(ctx, "notes", gone.SessionID, "w", client.ResolveWaitRequest{})
		if ae := client.AsError(err); ae == nil || ae.Status != http.StatusGone || ae.Code != client.CodeSessionDestroyed {
			t.Fatalf("resolve a destroyed session's wait: %v, want 410 session_destroyed", err)
		}
		w, err := e.c.GetWait(ctx, "notes", gone.SessionID, "w")
		if err != nil || w.Status != store.WaitCancelled {
			t.Fatalf("a destroyed session's wait: %+v %v, want cancelled", w, err)
		}
		if _, err := e.c.SessionWaits(ctx, "notes", key.SessionID, client.ListWaitsOptions{Status: "done"}); !client.IsCode(err, client.CodeInvalidParameter) {
			t.Fatalf("status=done: %v, want invalid_parameter", err)
		}
	})
}
