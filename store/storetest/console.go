package storetest

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/store"
)

func consoleCases() []testCase {
	return []testCase{
		{"Console/AgentVersionsAppendedWithTheAgentOnlyWhenTheDefinitionChanges", testAgentVersions},
		{"Console/ConcurrentUpsertsNumberVersionsWithoutGaps", testAgentVersionsConcurrent},
		{"Console/CurrentActivationIsTheLiveOneElseTheLastWithTheDBClock", testCurrentActivation},
		{"Console/BrowseSessionsFiltersInTheQueryAndPagesByCursor", testBrowseSessions},
		{"Console/BrowseSessionsRefusesBadFilters", testBrowseSessionsInvalid},
		{"Console/ClusterFiguresCountLiveByHostPendingAndTurnsOfTheLastMinute", testClusterFigures},
	}
}

func versionsOf(t *testing.T, b *bundle, agentUID string, before int64, limit int) []store.AgentVersion {
	t.Helper()
	vs, err := b.s.ListAgentVersions(b.ctx, store.ListAgentVersionsParams{AgentUID: agentUID, Before: before, Limit: limit})
	noErr(t, err, "ListAgentVersions")
	return vs
}

func testAgentVersions(t *testing.T, b *bundle) {
	vs := versionsOf(t, b, b.agent.UID, 0, 0)
	wantEq(t, len(vs), 1, "versions of a new agent")
	wantEq(t, vs[0].Version, int64(1), "first version")
	wantEq(t, vs[0].ModuleDigest, b.agent.ModuleDigest, "version 1 module")
	wantEq(t, vs[0].Kind, store.KindWasm, "version 1 kind")
	wantEq(t, vs[0].CrashPolicy, store.CrashRestart, "version 1 crash policy")

	upsert := func(digest string, policy store.CrashPolicy) store.Agent {
		t.Helper()
		a, err := b.s.CreateAgent(b.ctx, store.CreateAgentParams{UID: uuid.NewString(), Name: b.agent.Name,
			ModuleDigest: digest, CrashPolicy: policy, Upsert: true})
		noErr(t, err, "CreateAgent upsert")
		return a
	}
	// The same definition again: no version.
	upsert(b.agent.ModuleDigest, store.CrashRestart)
	wantEq(t, len(versionsOf(t, b, b.agent.UID, 0, 0)), 1, "versions after an upsert that changes nothing")
	// A refused create (name taken) writes no version.
	_, err := b.s.CreateAgent(b.ctx, store.CreateAgentParams{UID: uuid.NewString(), Name: b.agent.Name,
		ModuleDigest: b.agent.ModuleDigest, CrashPolicy: store.CrashSleep})
	wantIs(t, err, store.ErrConflict, "CreateAgent of a taken name")
	wantEq(t, len(versionsOf(t, b, b.agent.UID, 0, 0)), 1, "versions after a refused create")

	m2 := b.module("second module")
	upsert(m2.Digest, store.CrashRestart)
	upsert(m2.Digest, store.CrashSleep)
	vs = versionsOf(t, b, b.agent.UID, 0, 0)
	wantEq(t, len(vs), 3, "versions after a new module and a new crash policy")
	for i, want := range []struct {
		n      int64
		digest string
		policy store.CrashPolicy
	}{{3, m2.Digest, store.CrashSleep}, {2, m2.Digest, store.CrashRestart}, {1, b.agent.ModuleDigest, store.CrashRestart}} {
		wantEq(t, vs[i].Version, want.n, fmt.Sprintf("versions[%d] (newest first)", i))
		wantEq(t, vs[i].ModuleDigest, want.digest, fmt.Sprintf("version %d module", want.n))
		wantEq(t, vs[i].CrashPolicy, want.policy, fmt.Sprintf("version %d crash policy", want.n))
		wantEq(t, vs[i].AgentUID, b.agent.UID, fmt.Sprintf("version %d agent (the upsert keeps the uid)", want.n))
	}
	if vs[0].CreatedAt.Before(vs[2].CreatedAt) {
		t.Fatalf("version 3 created %v before version 1 %v", vs[0].CreatedAt, vs[2].CreatedAt)
	}
	// Paged: two, then from before version 2.
	page := versionsOf(t, b, b.agent.UID, 0, 2)
	wantEq(t, len(page), 2, "first page of 2")
	rest := versionsOf(t, b, b.agent.UID, page[1].Version, 2)
	wantEq(t, len(rest), 1, "second page")
	wantEq(t, rest[0].Version, int64(1), "second page holds version 1")

	// Another agent's versions are its own.
	other := b.newAgent("other-"+uuid.NewString()[:8], m2.Digest, store.CrashDestroy)
	ovs := versionsOf(t, b, other.UID, 0, 0)
	wantEq(t, len(ovs), 1, "versions of another agent")
	wantEq(t, ovs[0].Version, int64(1), "another agent starts at 1")
	wantEq(t, len(versionsOf(t, b, uuid.NewString(), 0, 0)), 0, "versions of an unknown agent")
}

func testAgentVersionsConcurrent(t *testing.T, b *bundle) {
	const n = 6
	digests := make([]string, n)
	for i := range digests {
		digests[i] = b.module(fmt.Sprintf("concurrent module %d", i)).Digest
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			_, err := b.s.CreateAgent(b.ctx, store.CreateAgentParams{UID: uuid.NewString(), Name: b.agent.Name,
				ModuleDigest: digests[i], CrashPolicy: store.CrashRestart, Upsert: true})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		noErr(t, err, "concurrent upsert")
	}
	vs := versionsOf(t, b, b.agent.UID, 0, 0)
	wantEq(t, len(vs), n+1, "one version per changing upsert, plus the first")
	for i, v := range vs {
		wantEq(t, v.Version, int64(n+1-i), fmt.Sprintf("versions[%d]", i))
	}
	a, err := b.s.GetAgent(b.ctx, store.DefaultNamespace, b.agent.UID)
	noErr(t, err, "GetAgent")
	wantEq(t, vs[0].ModuleDigest, a.ModuleDigest, "the newest version is what the agent runs")
}

func testCurrentActivation(t *testing.T, b *bundle) {
	key := b.session()
	_, err := b.s.CurrentActivation(b.ctx, key)
	wantIs(t, err, store.ErrNotFound, "CurrentActivation before any claim")

	first := b.claim(key, LongTTL)
	b.message(key, "hello")
	d := b.next(first)
	got, err := b.s.CurrentActivation(b.ctx, key)
	noErr(t, err, "CurrentActivation")
	wantEq(t, got.UID, first.UID, "activation uid")
	wantEq(t, got.HostID, b.host, "host id")
	wantEq(t, got.ActorEpoch, first.ActorEpoch, "epoch")
	wantEq(t, got.State, store.ActivationActive, "state")
	wantEq(t, got.Live(), true, "live")
	wantEq(t, got.CurrentEventID, d.Event.ID, "current event")
	if left := got.LeaseLeft(); left <= 0 || left > LongTTL {
		t.Fatalf("LeaseLeft = %v by the DB clock, want in (0, %v]", left, LongTTL)
	}
	if got.Now.IsZero() || got.CreatedAt.IsZero() {
		t.Fatalf("Now %v, CreatedAt %v: want both set", got.Now, got.CreatedAt)
	}

	b.commit(d.Delivery.TurnRef(), "hi", "")
	noErr(t, b.s.StopActivation(b.ctx, first.Ref()), "StopActivation")
	got, err = b.s.CurrentActivation(b.ctx, key)
	noErr(t, err, "CurrentActivation after stop")
	wantEq(t, got.UID, first.UID, "the last activation when none is live")
	wantEq(t, got.Live(), false, "stopped is not live")
	wantEq(t, got.CurrentEventID, int64(0), "no current event after the commit")
	wantEq(t, got.LeaseLeft(), 0, "LeaseLeft of an ended activation")

	second := b.claimOn(key, "host-b", LongTTL)
	got, err = b.s.CurrentActivation(b.ctx, key)
	noErr(t, err, "CurrentActivation after a new claim")
	wantEq(t, got.UID, second.UID, "the live activation, the newest epoch")
	wantEq(t, got.HostID, "host-b", "new host")
	if got.ActorEpoch <= first.ActorEpoch {
		t.Fatalf("epoch %d not above %d", got.ActorEpoch, first.ActorEpoch)
	}
}

// browseAll pages p to the end and returns the session ids in order.
func browseAll(t *testing.T, b *bundle, p store.BrowseSessionsParams) []string {
	t.Helper()
	var ids []string
	for range 1000 {
		page, err := b.s.BrowseSessions(b.ctx, p)
		noErr(t, err, "BrowseSessions")
		for _, x := range page.Sessions {
			ids = append(ids, x.SessionID)
		}
		if page.Next == (store.ActorKey{}) {
			return ids
		}
		if page.Next == p.After {
			t.Fatalf("cursor did not move from %v", p.After)
		}
		p.After = page.Next
	}
	t.Fatalf("BrowseSessions did not end")
	return nil
}

func testBrowseSessions(t *testing.T, b *bundle) {
	other := b.newAgent("other-"+uuid.NewString()[:8], b.agent.ModuleDigest, store.CrashRestart)
	type made struct {
		key              store.ActorKey
		skey, status, rs string
		pending          bool
	}
	var all []made
	for i := range 24 {
		agent := b.agent.UID
		if i%2 == 1 {
			agent = other.UID
		}
		skey := ""
		if i%3 == 0 {
			skey = fmt.Sprintf("user-%02d", i)
		}
		x, _, err := b.s.CreateSession(b.ctx, store.CreateSessionParams{AgentUID: agent, SessionID: uuid.NewString(),
			Key: skey, CrashPolicy: store.CrashRestart})
		noErr(t, err, "CreateSession")
		m := made{key: x.ActorKey, skey: skey, status: "active"}
		switch i % 4 {
		case 1:
			reason := "capacity"
			if i%8 == 5 {
				reason = "crash"
			}
			_, err := b.s.SleepSession(b.ctx, store.SleepSessionParams{Key: x.ActorKey, Reason: reason})
			noErr(t, err, "SleepSession")
			m.status, m.rs = "sleeping", reason
		case 2:
			_, err := b.s.DestroySession(b.ctx, x.ActorKey)
			noErr(t, err, "DestroySession")
			m.status = "destroyed"
		case 3:
			noErr(t, b.s.SetPending(b.ctx, x.ActorKey, true), "SetPending")
			m.pending = true
		}
		all = append(all, m)
	}
	want := func(keep func(m made) bool) []string {
		var ks []store.ActorKey
		for _, m := range all {
			if keep(m) {
				ks = append(ks, m.key)
			}
		}
		slices.SortFunc(ks, func(a, b store.ActorKey) int {
			if a.AgentUID != b.AgentUID {
				return cmpStr(a.AgentUID, b.AgentUID)
			}
			return cmpStr(a.SessionID, b.SessionID)
		})
		ids := []string{}
		for _, k := range ks {
			ids = append(ids, k.SessionID)
		}
		return ids
	}
	check := func(what string, p store.BrowseSessionsParams, keep func(m made) bool) {
		t.Helper()
		got := browseAll(t, b, p)
		if got == nil {
			got = []string{}
		}
		if w := want(keep); !slices.Equal(got, w) {
			t.Fatalf("%s: got %d sessions %v, want %d %v", what, len(got), got, len(w), w)
		}
	}
	for _, limit := range []int{1, 5, 100} {
		check(fmt.Sprintf("all, pages of %d", limit), store.BrowseSessionsParams{Limit: limit}, func(made) bool { return true })
	}
	check("one agent", store.BrowseSessionsParams{AgentUID: other.UID, Limit: 4},
		func(m made) bool { return m.key.AgentUID == other.UID })
	for _, st := range []string{"active", "sleeping", "destroyed"} {
		check("status "+st, store.BrowseSessionsParams{Status: st, Limit: 3}, func(m made) bool { return m.status == st })
		check("status "+st+" of one agent", store.BrowseSessionsParams{Status: st, AgentUID: b.agent.UID, Limit: 2},
			func(m made) bool { return m.status == st && m.key.AgentUID == b.agent.UID })
	}
	check("sleeping for crash", store.BrowseSessionsParams{Status: "sleeping", SleepReason: "crash", Limit: 2},
		func(m made) bool { return m.rs == "crash" })
	check("pending", store.BrowseSessionsParams{Status: store.StatusPending, Limit: 2},
		func(m made) bool { return m.pending })
	check("key", store.BrowseSessionsParams{Key: "user-03"}, func(m made) bool { return m.skey == "user-03" })
	check("key of another agent", store.BrowseSessionsParams{Key: "user-03", AgentUID: b.agent.UID}, func(made) bool { return false })
	check("text in the key (case-insensitive)", store.BrowseSessionsParams{Text: "USER-1", Limit: 2},
		func(m made) bool { return len(m.skey) > 6 && m.skey[:6] == "user-1" })
	probe := all[7].key.SessionID[9:15]
	check("text in the id", store.BrowseSessionsParams{Text: probe},
		func(m made) bool { return containsFold(m.key.SessionID, probe) || containsFold(m.skey, probe) })
	check("no match", store.BrowseSessionsParams{Text: "no such text"}, func(made) bool { return false })

	// A page holds the counters like GetSession.
	page, err := b.s.BrowseSessions(b.ctx, store.BrowseSessionsParams{Key: "user-00"})
	noErr(t, err, "BrowseSessions by key")
	wantEq(t, len(page.Sessions), 1, "sessions of key user-00")
	b.message(page.Sessions[0].ActorKey, "counted")
	page, err = b.s.BrowseSessions(b.ctx, store.BrowseSessionsParams{Key: "user-00"})
	noErr(t, err, "BrowseSessions by key")
	wantEq(t, page.Sessions[0].OpenEvents, int64(1), "open events of a browsed session")
	wantEq(t, page.Partial, false, "a full read is not partial")
}

func cmpStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func containsFold(s, sub string) bool {
	return sub != "" && strings.Contains(strings.ToLower(s), strings.ToLower(sub))
}

func testBrowseSessionsInvalid(t *testing.T, b *bundle) {
	for what, p := range map[string]store.BrowseSessionsParams{
		"unknown status":           {Status: "asleep"},
		"sleep reason without it":  {SleepReason: "crash"},
		"cursor without a session": {After: store.ActorKey{AgentUID: b.agent.UID}},
	} {
		_, err := b.s.BrowseSessions(b.ctx, p)
		wantIs(t, err, store.ErrInvalid, what)
	}
}

func testClusterFigures(t *testing.T, b *bundle) {
	f, err := b.s.ClusterFigures(b.ctx)
	noErr(t, err, "ClusterFigures of an idle store")
	wantEq(t, len(f.Live), 0, "live activations")
	wantEq(t, f.TurnsLastMinute, int64(0), "turns")

	k1, k2, k3, k4 := b.session(), b.session(), b.session(), b.session()
	a1 := b.claim(k1, LongTTL)
	b.claim(k2, LongTTL)
	b.claimOn(k3, "host-other", LongTTL)
	noErr(t, b.s.SetPending(b.ctx, k4, true), "SetPending")
	b.message(k1, "one")
	d := b.next(a1)
	f, err = b.s.ClusterFigures(b.ctx)
	noErr(t, err, "ClusterFigures")
	byHost := map[string]store.LiveActivations{}
	for _, l := range f.Live {
		wantEq(t, l.AgentUID, b.agent.UID, "agent of live activations")
		byHost[l.HostID] = l
	}
	wantEq(t, len(byHost), 2, "hosts with live activations")
	wantEq(t, byHost[b.host].Live, int64(2), "live on this host")
	wantEq(t, byHost[b.host].Busy, int64(1), "busy on this host")
	wantEq(t, byHost["host-other"].Live, int64(1), "live on the other host")
	if !byHost[b.host].FirstExpiry.After(f.Now) {
		t.Fatalf("first lease expiry %v not after the DB clock %v", byHost[b.host].FirstExpiry, f.Now)
	}
	wantEq(t, f.Pending[b.agent.UID], int64(1), "pending sessions of the agent")

	b.commit(d.Delivery.TurnRef(), "done", "")
	f, err = b.s.ClusterFigures(b.ctx)
	noErr(t, err, "ClusterFigures after a commit")
	wantEq(t, f.TurnsLastMinute, int64(1), "turns of the last minute")
	_, err = b.s.DestroySession(b.ctx, k4)
	noErr(t, err, "DestroySession")
	f, err = b.s.ClusterFigures(b.ctx)
	noErr(t, err, "ClusterFigures after destroying the pending session")
	wantEq(t, f.Pending[b.agent.UID], int64(0), "a destroyed session is not pending")
}
