package storetest

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

func catalogCases() []testCase {
	return []testCase{
		{"Modules/PutIsContentAddressedGetListNewestFirst", testModules},
		{"Agents/NameIsUniqueUpsertUpdatesBindingUnknownModuleNotFound", testAgents},
		{"Sessions/CreateGetListWithCounters", testSessions},
		{"Sessions/KeyIsUniquePerAgentGetOrCreateReturnsExisting", testSessionKeys},
		{"Sessions/GetOrCreateRaceCreatesOne", testSessionGetOrCreateRace},
		{"Sessions/TakenKeyNamesTheSessionGetOrCreateRefusesADifferentPolicyOrInput", testSessionKeyConflicts},
		{"Sessions/DestroyedSessionsKeyGetsANewSession", testSessionKeyAfterDestroy},
	}
}

func testModules(t *testing.T, b *bundle) {
	data := []byte("\x00asm\x01\x00\x00\x00modules test")
	p := store.PutModuleParams{Digest: digest(data), ABIVersion: abi.Version, Bytes: data}
	m, created, err := b.s.PutModule(b.ctx, p)
	noErr(t, err, "PutModule")
	wantEq(t, created, true, "first PutModule created")
	wantEq(t, m.Digest, p.Digest, "Digest")
	wantEq(t, m.Size, int64(len(data)), "Size")
	wantEq(t, m.ABIVersion, abi.Version, "ABIVersion")
	if m.CreatedAt.IsZero() {
		t.Fatalf("CreatedAt is zero")
	}

	again, created, err := b.s.PutModule(b.ctx, p)
	noErr(t, err, "second PutModule")
	wantEq(t, created, false, "second PutModule created")
	wantEq(t, again.Digest, m.Digest, "second PutModule digest")
	wantEq(t, again.CreatedAt.Equal(m.CreatedAt), true, "second PutModule keeps CreatedAt")

	got, err := b.s.GetModule(b.ctx, store.DefaultNamespace, p.Digest)
	noErr(t, err, "GetModule")
	wantBytes(t, got.Bytes, data, "GetModule bytes")
	wantEq(t, got.Size, int64(len(data)), "GetModule size")

	_, err = b.s.GetModule(b.ctx, store.DefaultNamespace, digest([]byte("never uploaded")))
	wantIs(t, err, store.ErrNotFound, "GetModule unknown digest")

	list, err := b.s.ListModules(b.ctx, store.DefaultNamespace)
	noErr(t, err, "ListModules")
	// setup put the agent's module first; this one is newer.
	if len(list) != 2 {
		t.Fatalf("ListModules = %d modules, want 2", len(list))
	}
	wantEq(t, list[0].Digest, p.Digest, "newest module first")
	wantEq(t, list[1].Digest, b.agent.ModuleDigest, "older module second")
	for _, lm := range list {
		if len(lm.Bytes) != 0 {
			t.Fatalf("ListModules returned bytes for %s", lm.Digest)
		}
		if lm.Size == 0 {
			t.Fatalf("ListModules lost the size of %s", lm.Digest)
		}
	}
}

func testAgents(t *testing.T, b *bundle) {
	m2 := b.module("second module")
	_, err := b.s.CreateAgent(b.ctx, store.CreateAgentParams{
		UID: uuid.NewString(), Name: b.agent.Name, ModuleDigest: m2.Digest, CrashPolicy: store.CrashSleep,
	})
	wantIs(t, err, store.ErrConflict, "CreateAgent with a taken name")

	_, err = b.s.CreateAgent(b.ctx, store.CreateAgentParams{
		UID: uuid.NewString(), Name: "agent-unknown-module", ModuleDigest: digest([]byte("nope")), CrashPolicy: store.CrashSleep,
	})
	wantIs(t, err, store.ErrNotFound, "CreateAgent with an unknown module")

	up, err := b.s.CreateAgent(b.ctx, store.CreateAgentParams{
		UID: uuid.NewString(), Name: b.agent.Name, ModuleDigest: m2.Digest, CrashPolicy: store.CrashSleep, Upsert: true,
	})
	noErr(t, err, "CreateAgent upsert")
	wantEq(t, up.UID, b.agent.UID, "upsert keeps the agent uid")
	wantEq(t, up.ModuleDigest, m2.Digest, "upsert updates the binding")
	wantEq(t, up.CrashPolicy, store.CrashSleep, "upsert updates the crash policy")

	byName, err := b.s.GetAgent(b.ctx, store.DefaultNamespace, b.agent.Name)
	noErr(t, err, "GetAgent by name")
	byUID, err := b.s.GetAgent(b.ctx, store.DefaultNamespace, b.agent.UID)
	noErr(t, err, "GetAgent by uid")
	wantEq(t, byName.UID, b.agent.UID, "GetAgent by name uid")
	wantEq(t, byUID.Name, b.agent.Name, "GetAgent by uid name")
	wantEq(t, byUID.ModuleDigest, m2.Digest, "GetAgent binding after upsert")
	_, err = b.s.GetAgent(b.ctx, store.DefaultNamespace, "no-such-agent")
	wantIs(t, err, store.ErrNotFound, "GetAgent unknown")

	b.newAgent("aaa-first", m2.Digest, store.CrashDestroy)
	b.newAgent("zzz-last", m2.Digest, store.CrashRestart)
	list, err := b.s.ListAgents(b.ctx, store.DefaultNamespace)
	noErr(t, err, "ListAgents")
	var names []string
	for _, a := range list {
		names = append(names, a.Name)
	}
	want := []string{"aaa-first", b.agent.Name, "zzz-last"}
	wantEq(t, fmt.Sprint(names), fmt.Sprint(want), "ListAgents names by name")
}

func testSessions(t *testing.T, b *bundle) {
	_, _, err := b.s.CreateSession(b.ctx, store.CreateSessionParams{
		AgentUID: uuid.NewString(), SessionID: uuid.NewString(), CrashPolicy: store.CrashRestart,
	})
	wantIs(t, err, store.ErrNotFound, "CreateSession for an unknown agent")

	input := []byte("opaque \x00 input")
	s, created, err := b.s.CreateSession(b.ctx, store.CreateSessionParams{
		AgentUID: b.agent.UID, SessionID: "s-0002", Input: input, CrashPolicy: store.CrashSleep,
	})
	noErr(t, err, "CreateSession")
	wantEq(t, created, true, "created")
	wantEq(t, s.AgentUID, b.agent.UID, "AgentUID")
	wantEq(t, s.SessionID, "s-0002", "SessionID")
	wantEq(t, s.Status, store.SessionActive, "Status")
	wantEq(t, s.CrashPolicy, store.CrashSleep, "CrashPolicy")
	wantEq(t, s.ActorEpoch, int64(0), "ActorEpoch of a new session")
	wantBytes(t, s.Input, input, "Input")
	if s.CreatedAt.IsZero() || s.SleepTS != nil || s.DestroyTS != nil {
		t.Fatalf("timestamps of a new session: %+v", s)
	}

	_, err = b.s.GetSession(b.ctx, store.ActorKey{AgentUID: b.agent.UID, SessionID: "missing"})
	wantIs(t, err, store.ErrNotFound, "GetSession unknown")

	key := s.ActorKey
	b.message(key, "one")
	b.message(key, "two")
	act := b.claim(key, LongTTL)
	d := b.next(act)
	b.commit(d.Delivery.TurnRef(), "reply", "")
	got := b.getSession(key)
	wantEq(t, got.EventCount, int64(2), "EventCount")
	wantEq(t, got.OpenEvents, int64(1), "OpenEvents")
	wantEq(t, got.TurnCount, int64(1), "TurnCount")
	wantEq(t, got.ActorEpoch, act.ActorEpoch, "ActorEpoch")
	wantBytes(t, got.Input, input, "GetSession Input")

	for _, id := range []string{"s-0001", "s-0003", "s-0004", "s-0005"} {
		_, _, err := b.s.CreateSession(b.ctx, store.CreateSessionParams{AgentUID: b.agent.UID, SessionID: id, CrashPolicy: store.CrashRestart})
		noErr(t, err, "CreateSession "+id)
	}
	var pages [][]string
	after := ""
	for range 10 {
		page, err := b.s.ListSessions(b.ctx, store.ListSessionsParams{AgentUID: b.agent.UID, After: after, Limit: 2})
		noErr(t, err, "ListSessions")
		if len(page) == 0 {
			break
		}
		var ids []string
		for _, ps := range page {
			ids = append(ids, ps.SessionID)
			if ps.SessionID == "s-0002" && (ps.EventCount != 2 || ps.OpenEvents != 1 || ps.TurnCount != 1) {
				t.Fatalf("ListSessions counters of s-0002: %+v", ps)
			}
		}
		pages = append(pages, ids)
		after = ids[len(ids)-1]
	}
	wantEq(t, fmt.Sprint(pages), "[[s-0001 s-0002] [s-0003 s-0004] [s-0005]]", "ListSessions pages")
}

func testSessionKeys(t *testing.T, b *bundle) {
	first, created, err := b.s.CreateSession(b.ctx, store.CreateSessionParams{
		AgentUID: b.agent.UID, SessionID: uuid.NewString(), Key: "user-42", CrashPolicy: store.CrashRestart,
	})
	noErr(t, err, "CreateSession with key")
	wantEq(t, created, true, "created")
	wantEq(t, first.Key, "user-42", "Key")

	_, _, err = b.s.CreateSession(b.ctx, store.CreateSessionParams{
		AgentUID: b.agent.UID, SessionID: uuid.NewString(), Key: "user-42", CrashPolicy: store.CrashRestart,
	})
	wantIs(t, err, store.ErrConflict, "CreateSession with a taken key")

	got, created, err := b.s.CreateSession(b.ctx, store.CreateSessionParams{
		AgentUID: b.agent.UID, SessionID: uuid.NewString(), Key: "user-42", CrashPolicy: store.CrashRestart, GetOrCreate: true,
	})
	noErr(t, err, "CreateSession get-or-create")
	wantEq(t, created, false, "get-or-create of an existing key created")
	wantEq(t, got.SessionID, first.SessionID, "get-or-create returns the existing session")

	// The key is unique per agent, not globally; sessions without a key
	// never conflict.
	other := b.newAgent("other-agent", b.agent.ModuleDigest, store.CrashRestart)
	_, created, err = b.s.CreateSession(b.ctx, store.CreateSessionParams{
		AgentUID: other.UID, SessionID: uuid.NewString(), Key: "user-42", CrashPolicy: store.CrashRestart,
	})
	noErr(t, err, "same key under another agent")
	wantEq(t, created, true, "same key under another agent created")
	b.session()
	b.session()
}

// wantSessionExists checks err is a *store.SessionExistsError (errors.Is
// ErrConflict) naming the existing session and the refused field.
func wantSessionExists(t *testing.T, err error, existing store.ActorKey, key, field, what string) {
	t.Helper()
	wantIs(t, err, store.ErrConflict, what)
	var se *store.SessionExistsError
	if !errors.As(err, &se) {
		t.Fatalf("%s: %v (%T), want a *store.SessionExistsError", what, err, err)
	}
	if se.Existing != existing || se.Key != key || se.Field != field {
		t.Fatalf("%s: SessionExistsError %+v, want existing %s key %q field %q", what, *se, existing, key, field)
	}
}

func testSessionKeyConflicts(t *testing.T, b *bundle) {
	p := store.CreateSessionParams{AgentUID: b.agent.UID, SessionID: uuid.NewString(), Key: "k",
		Input: []byte("in-1"), CrashPolicy: store.CrashRestart}
	first, created, err := b.s.CreateSession(b.ctx, p)
	noErr(t, err, "CreateSession")
	wantEq(t, created, true, "created")

	p.SessionID = uuid.NewString()
	_, _, err = b.s.CreateSession(b.ctx, p)
	wantSessionExists(t, err, first.ActorKey, "k", "key", "create with a taken key")

	p.GetOrCreate = true
	got, created, err := b.s.CreateSession(b.ctx, p)
	noErr(t, err, "get-or-create with the same policy and input")
	wantEq(t, created, false, "get-or-create created")
	wantEq(t, got.ActorKey, first.ActorKey, "get-or-create session")

	q := p
	q.CrashPolicy = store.CrashSleep
	_, _, err = b.s.CreateSession(b.ctx, q)
	wantSessionExists(t, err, first.ActorKey, "k", "crash_policy", "get-or-create with another crash policy")
	q = p
	q.CrashPolicy, q.DefaultCrashPolicy = "", store.CrashSleep // no opinion; the default is never compared
	_, created, err = b.s.CreateSession(b.ctx, q)
	noErr(t, err, "get-or-create without a crash policy")
	wantEq(t, created, false, "get-or-create without a crash policy created")
	q = p
	q.Input = []byte("in-2")
	_, _, err = b.s.CreateSession(b.ctx, q)
	wantSessionExists(t, err, first.ActorKey, "k", "input", "get-or-create with another input")
	q = p
	q.Input = nil // no opinion, like an empty crash policy: a look-up by key
	got, created, err = b.s.CreateSession(b.ctx, q)
	noErr(t, err, "get-or-create without an input")
	wantEq(t, created, false, "get-or-create without an input created")
	wantEq(t, got.ActorKey, first.ActorKey, "get-or-create without an input: session")
	// A new session takes DefaultCrashPolicy when CrashPolicy is empty.
	d, created, err := b.s.CreateSession(b.ctx, store.CreateSessionParams{AgentUID: b.agent.UID,
		SessionID: uuid.NewString(), Key: "k-default", DefaultCrashPolicy: store.CrashDestroy, GetOrCreate: true})
	noErr(t, err, "CreateSession with a default crash policy")
	wantEq(t, created, true, "created with a default crash policy")
	wantEq(t, d.CrashPolicy, store.CrashDestroy, "crash policy from DefaultCrashPolicy")
	_, err = b.s.DestroySession(b.ctx, d.ActorKey)
	noErr(t, err, "DestroySession")
	// Nothing else was created by the refusals.
	list, err := b.s.ListSessions(b.ctx, store.ListSessionsParams{AgentUID: b.agent.UID})
	noErr(t, err, "ListSessions")
	wantEq(t, len(list), 2, "sessions after the refusals (k and the destroyed k-default)")
}

func testSessionKeyAfterDestroy(t *testing.T, b *bundle) {
	p := store.CreateSessionParams{AgentUID: b.agent.UID, SessionID: uuid.NewString(), Key: "k", CrashPolicy: store.CrashRestart}
	first, _, err := b.s.CreateSession(b.ctx, p)
	noErr(t, err, "CreateSession")
	_, err = b.s.DestroySession(b.ctx, first.ActorKey)
	noErr(t, err, "DestroySession")

	// Get-or-create of a destroyed session's key creates a new session.
	p.SessionID, p.GetOrCreate = uuid.NewString(), true
	second, created, err := b.s.CreateSession(b.ctx, p)
	noErr(t, err, "get-or-create after destroy")
	wantEq(t, created, true, "get-or-create after destroy created")
	wantEq(t, second.SessionID, p.SessionID, "new session id")
	wantEq(t, second.Status, store.SessionActive, "new session status")
	again, created, err := b.s.CreateSession(b.ctx, store.CreateSessionParams{AgentUID: b.agent.UID,
		SessionID: uuid.NewString(), Key: "k", CrashPolicy: store.CrashRestart, GetOrCreate: true})
	noErr(t, err, "get-or-create of the new session")
	wantEq(t, created, false, "get-or-create of the new session created")
	wantEq(t, again.ActorKey, second.ActorKey, "get-or-create returns the live session")

	// Plain create after destroy as well; the destroyed session keeps its key.
	_, err = b.s.DestroySession(b.ctx, second.ActorKey)
	noErr(t, err, "DestroySession of the second")
	third, created, err := b.s.CreateSession(b.ctx, store.CreateSessionParams{AgentUID: b.agent.UID,
		SessionID: uuid.NewString(), Key: "k", CrashPolicy: store.CrashRestart})
	noErr(t, err, "create after destroy")
	wantEq(t, created, true, "create after destroy created")
	_, _, err = b.s.CreateSession(b.ctx, store.CreateSessionParams{AgentUID: b.agent.UID,
		SessionID: uuid.NewString(), Key: "k", CrashPolicy: store.CrashRestart})
	wantSessionExists(t, err, third.ActorKey, "k", "key", "create while the third is live")
	old := b.getSession(first.ActorKey)
	wantEq(t, old.Key, "k", "destroyed session's key")
	wantEq(t, old.Status, store.SessionDestroyed, "destroyed session's status")
}

func testSessionGetOrCreateRace(t *testing.T, b *bundle) {
	const n = 16
	results := make([]store.Session, n)
	createdBy := make([]bool, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			results[i], createdBy[i], errs[i] = b.s.CreateSession(b.ctx, store.CreateSessionParams{
				AgentUID: b.agent.UID, SessionID: uuid.NewString(), Key: "raced", CrashPolicy: store.CrashRestart, GetOrCreate: true,
			})
		})
	}
	close(start)
	wg.Wait()
	creators := 0
	for i := range n {
		noErr(t, errs[i], fmt.Sprintf("racer %d", i))
		if createdBy[i] {
			creators++
		}
		wantEq(t, results[i].SessionID, results[0].SessionID, fmt.Sprintf("racer %d session", i))
	}
	wantEq(t, creators, 1, "racers that created")
	list, err := b.s.ListSessions(b.ctx, store.ListSessionsParams{AgentUID: b.agent.UID})
	noErr(t, err, "ListSessions")
	wantEq(t, len(list), 1, "sessions after the race")
}
