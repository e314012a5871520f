package runner_test

import (
	"context"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/runner"
	"github.com/paddock-dev/paddock/wasm"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

func request(agent, session, msg string, id int64) *abi.TurnRequest {
	return &abi.TurnRequest{ABIVersion: abi.Version,
		TurnRef: abi.TurnRef{DeliveryID: "d" + msg, ActivationUID: "act_" + session, ActorEpoch: 1, ActorEventID: id, AgentUID: agent, SessionID: session},
		Session: abi.Session{AgentName: agent, SessionID: session},
		Event:   abi.Event{ID: id, Kind: abi.EventMessage, Message: msg, AcceptedAt: time.Now().UTC()}}
}

// TestInstanceScopes: with session scope an activation's globals are its
// own; with agent scope a warm instance serves the agent's sessions in
// turn but never another agent's; either way a failed attempt's instance
// (an error outcome included) is not used again.
func TestInstanceScopes(t *testing.T) {
	ctx := context.Background()
	_, body := wasmtest.BuildExample(t, "./host/runner/testdata/globals")
	rt, err := wasm.New(ctx, wasm.Config{CacheDir: wasmtest.CacheDir(t), MemoryLimitPages: 512, TurnTimeout: time.Minute}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	info, err := rt.Load(ctx, wasm.Digest(body), body)
	if err != nil {
		t.Fatal(err)
	}
	w := runner.NewWasm(rt, nil)
	defer w.Close(ctx)
	reply := func(inst host.Instance, ctx context.Context, agent, session, msg string) string {
		t.Helper()
		res, err := inst.Turn(ctx, request(agent, session, msg, 1))
		if err != nil {
			t.Fatal(err)
		}
		if res.Outcome == abi.OutcomeError {
			return "error"
		}
		return res.Messages[0].Content
	}
	inst := func(ctx context.Context) host.Instance {
		t.Helper()
		i, err := w.Instantiate(ctx, info.Digest)
		if err != nil {
			t.Fatal(err)
		}
		return i
	}

	// Session scope (the default): each activation its own instance.
	sess := ctx
	a, b := inst(sess), inst(sess)
	reply(a, sess, "agt", "ses_A", "secret-of-A")
	if got := reply(b, sess, "agt", "ses_B", "hello"); got != "prev=/ failed=false" {
		t.Fatalf("session scope: B's first turn saw %q", got)
	}
	if got := reply(a, sess, "agt", "ses_A", "again"); got != "prev=ses_A/secret-of-A failed=false" {
		t.Fatalf("session scope: A's globals did not last between its turns: %q", got)
	}
	if got := reply(a, sess, "agt", "ses_A", "fail"); got != "error" {
		t.Fatalf("fail: %q", got)
	}
	if got := reply(a, sess, "agt", "ses_A", "retry"); got != "prev=/ failed=false" {
		t.Fatalf("session scope: the retry after an error outcome ran in the failed instance: %q", got)
	}
	a.Close(ctx)
	b.Close(ctx)

	// Agent scope: shared within the agent, never across agents.
	shared := host.WithInstanceScope(ctx, host.ScopeAgent)
	c, d, other := inst(shared), inst(shared), inst(shared)
	reply(c, shared, "agt1", "ses_C", "from-C")
	if got := reply(d, shared, "agt1", "ses_D", "hi"); got != "prev=ses_C/from-C failed=false" {
		t.Fatalf("agent scope: D did not get agt1's warm instance: %q", got)
	}
	if got := reply(other, shared, "agt2", "ses_E", "hi"); got != "prev=/ failed=false" {
		t.Fatalf("agent scope: another agent got agt1's instance: %q", got)
	}
	if got := reply(c, shared, "agt1", "ses_C", "fail"); got != "error" {
		t.Fatalf("fail: %q", got)
	}
	if got := reply(d, shared, "agt1", "ses_D", "after"); got == "error" || got == "prev=ses_C/fail failed=true" || got[len(got)-4:] == "true" {
		t.Fatalf("agent scope: a failed instance went back to the pool: %q", got)
	}
}
