package service_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/host/stream"
	"github.com/paddock-dev/paddock/host/stream/streamtest"
	"github.com/paddock-dev/paddock/store"
)

// waitFixture is the service fixture with an agent "asker" whose turns
// streamtest drives, and a stream hub.
func waitFixture(t *testing.T) (*fixture, *streamtest.Writer, store.Agent, *stream.Hub) {
	t.Helper()
	f := newFixture(t)
	w := streamtest.NewAgent(t, f.st, "asker")
	a, err := f.svc.GetAgent(context.Background(), "asker")
	if err != nil {
		t.Fatal(err)
	}
	hub := stream.New(stream.Options{Store: f.st})
	t.Cleanup(hub.Close)
	f.svc.WithStream(hub)
	return f, w, a, hub
}

// resolve looks wait id of session x up and resolves it with r.
func resolve(f *fixture, x store.Session, id string, r service.Resolution) (store.Wait, error) {
	ctx := context.Background()
	w, err := f.svc.GetWait(ctx, x, id)
	if err != nil {
		return w, err
	}
	return f.svc.ResolveWait(ctx, x, w, r)
}

func TestResolveWaitRules(t *testing.T) {
	f, w, a, _ := waitFixture(t)
	ctx := context.Background()
	key, other := w.Session(), w.Session()
	w.Start(key, "ask").CommitWait(store.WaitParams{ID: "q", For: "name?"})
	w.Start(other, "pay").Hold(store.WaitParams{ID: "pay", CallSeq: 1, CallDigest: "sha256:abc"})
	x, err := f.svc.GetSession(ctx, a, key.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	y, err := f.svc.GetSession(ctx, a, other.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	yes := true
	_, err = resolve(f, x, "q", service.Resolution{Approved: &yes})
	invalidField(t, err, "approved")
	_, err = resolve(f, x, "q", service.Resolution{Reason: "why"})
	invalidField(t, err, "reason")
	_, err = resolve(f, x, "q", service.Resolution{Data: json.RawMessage(`"` + strings.Repeat("x", store.MaxResolutionBytes) + `"`)})
	if tl, ok := errors.AsType[*service.TooLargeError](err); !ok || tl.Field != "data" {
		t.Fatalf("oversized data: %v", err)
	}
	_, err = resolve(f, y, "pay", service.Resolution{})
	if ie, ok := errors.AsType[*service.InvalidError](err); !ok || ie.Field != "approved" || !ie.Missing {
		t.Fatalf("an approval without a decision: %v", err)
	}
	_, err = resolve(f, y, "pay", service.Resolution{Approved: &yes, Data: json.RawMessage(`1`)})
	invalidField(t, err, "data")
	_, err = resolve(f, x, "nope", service.Resolution{})
	if nf, ok := errors.AsType[*service.NotFoundError](err); !ok || nf.Resource != service.ResourceWait || !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown wait: %v", err)
	}
	_, err = f.svc.GetWait(ctx, x, "bad id")
	invalidField(t, err, "wait")

	got, err := resolve(f, x, "q", service.Resolution{Data: json.RawMessage(`null`)})
	if err != nil || got.Status != store.WaitResolved || string(got.Resolution) != "null" {
		t.Fatalf("resolve: %+v %v", got, err)
	}
	_, err = resolve(f, x, "q", service.Resolution{})
	conflict(t, err, service.ConflictWaitResolved)
	got, err = resolve(f, y, "pay", service.Resolution{Approved: &yes})
	if err != nil || string(got.Resolution) != `{"approved":true}` {
		t.Fatalf("approve: %+v %v", got, err)
	}

	// Expired: 410 material.
	z := w.Session()
	w.Start(z, "ask").CommitWait(store.WaitParams{ID: "soon", Timeout: time.Millisecond})
	for {
		keys, err := f.st.ExpireDueWaits(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) > 0 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	zs, _ := f.svc.GetSession(ctx, a, z.SessionID)
	_, err = resolve(f, zs, "soon", service.Resolution{})
	if g, ok := errors.AsType[*service.GoneError](err); !ok || g.Reason != service.GoneWaitExpired || !errors.Is(err, store.ErrGone) {
		t.Fatalf("expired: %v", err)
	}

	page, err := f.svc.ListWaits(ctx, a, "", "open", service.Page{})
	if err != nil || len(page.Waits) != 0 {
		t.Fatalf("open waits after all closed: %+v %v", page, err)
	}
	page, err = f.svc.ListWaits(ctx, a, "", "", service.Page{})
	if err != nil || len(page.Waits) != 3 {
		t.Fatalf("all waits: %+v %v", page, err)
	}
	_, err = f.svc.ListWaits(ctx, a, "", "done", service.Page{})
	invalidField(t, err, "status")
}

func TestStreamRules(t *testing.T) {
	f, w, a, _ := waitFixture(t)
	ctx := context.Background()
	key := w.Session()
	w.Start(key, "hi").Commit("hello")
	x, err := f.svc.GetSession(ctx, a, key.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := f.svc.Stream(ctx, x, service.StreamPosition{After: stream.Cursor{Seq: 1}})
	if err != nil {
		t.Fatal(err)
	}
	evs, err := sub.Next(ctx)
	sub.Close()
	if err != nil || len(evs) != 1 || evs[0].Name != store.FrameTurnCommitted {
		t.Fatalf("stream after 1: %+v %v", evs, err)
	}
	_, err = service.ParseStreamPosition("Last-Event-ID", "1.x")
	invalidField(t, err, "Last-Event-ID")
	// At the head: only what is written from now on.
	sub, err = f.svc.Stream(ctx, x, service.StreamPosition{Head: true})
	if err != nil {
		t.Fatal(err)
	}
	w.Start(key, "again")
	evs, err = sub.Next(ctx)
	sub.Close()
	if err != nil || len(evs) != 1 || evs[0].Name != store.FrameTurnStarted || evs[0].ID != "3" {
		t.Fatalf("stream at the head: %+v %v", evs, err)
	}
	if _, err := f.st.DestroySession(ctx, key); err != nil {
		t.Fatal(err)
	}
	x, _ = f.svc.GetSession(ctx, a, key.SessionID)
	if _, err := f.svc.Stream(ctx, x, service.StreamPosition{}); !errors.Is(err, store.ErrSessionDestroyed) {
		t.Fatalf("stream of a destroyed session: %v", err)
	}
	bare := service.New(f.h, nil, nil)
	if _, err := bare.Stream(ctx, x, service.StreamPosition{}); !errors.Is(err, service.ErrStreamsDisabled) {
		t.Fatalf("a service without a hub: %v", err)
	}
}
