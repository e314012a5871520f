package storetest

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

func hostCallCases() []testCase {
	return []testCase{
		{"Invariant12/RecordedHostCallReadsBackExactly", testHostCallReadBack},
		{"Invariant12/SecondLiveRowAtASeqIsAConflict", testHostCallConflict},
		{"Invariant12/RecordHostCallUnderTheAttemptsFences", testHostCallFences},
		{"Invariant12/RecordHostCallOfAFailedAttemptIsStaleEpoch", testHostCallAfterFailedAttempt},
		{"Invariant12/RecordHostCallWithAnExpiredLeaseIsRefused", testHostCallExpiredLease},
		{"Invariant12/RecordHostCallAfterTheCommitIsSuperseded", testHostCallAfterCommit},
		{"Invariant12/SetAsideFromMarksLaterRowsAndTheNewRowIsLive", testHostCallSetAside},
		{"Invariant12/ReplayHostCallBumpsReplaysUnderTheFences", testHostCallReplay},
		{"Invariant12/TurnUsageIsTheSumOfTheJournalNotSetAside", testHostCallUsage},
		{"Invariant12/ConcurrentRecordsAtOneSeqLeaveOneLiveRow", testHostCallRace},
		{"Invariant12/RecordsRacingTheCommitAreInItsUsageOrRefused", testHostCallRaceCommit},
		{"Journal/RecordHostCallValidatesItsInputs", testHostCallInvalid},
		{"Journal/AgentTokensSinceSumsTheAgentsRowsFromThen", testAgentTokensSince},
		{"Secrets/PutReadListDeleteRoundTripTheSealedBytes", testSecrets},
		{"Secrets/InvalidNamesAndEmptyValuesAreRefused", testSecretsInvalid},
	}
}

// callStart is a StartedAt both drivers store exactly (milliseconds).
func callStart() time.Time { return time.Now().Add(-time.Second).UTC().Truncate(time.Millisecond) }

// hostCall is a journal row of a model call at seq with the given tokens.
func hostCall(seq int, in, out int64) store.HostCall {
	return store.HostCall{
		Seq: seq, Kind: string(abi.CallKindModel), Destination: "anthropic/claude",
		RequestDigest: digest(fmt.Appendf(nil, "request %d", seq)),
		Result:        fmt.Appendf(nil, `{"model":{"text":"answer %d"}}`, seq),
		StartedAt:     callStart(), DurationMS: 120, InputTokens: in, OutputTokens: out,
	}
}

// record records c under ref (no set-aside) and fails the test on an
// error.
func (b *bundle) record(ref abi.TurnRef, c store.HostCall) store.HostCall {
	b.t.Helper()
	got, err := b.s.RecordHostCall(b.ctx, store.RecordHostCallParams{Ref: ref, Call: c})
	noErr(b.t, err, fmt.Sprintf("RecordHostCall seq %d", c.Seq))
	return got
}

func (b *bundle) hostCalls(key store.ActorKey, eventID int64) []store.HostCall {
	b.t.Helper()
	cs, err := b.s.HostCalls(b.ctx, key, eventID)
	noErr(b.t, err, "HostCalls")
	return cs
}

// renderCall renders every field of a journal row, Result included.
func renderCall(c store.HostCall) string {
	return fmt.Sprintf("id=%d event=%d seq=%d epoch=%d kind=%s dest=%q digest=%s result=%q err=%q status=%d "+
		"started=%s dur=%d in=%d out=%d replays=%d replayed=%d aside=%v created=%s",
		c.ID, c.EventID, c.Seq, c.ActorEpoch, c.Kind, c.Destination, c.RequestDigest, c.Result, c.ErrorCode, c.Status,
		ts(c.StartedAt), c.DurationMS, c.InputTokens, c.OutputTokens, c.Replays, c.ReplayedEpoch, c.SetAside, ts(c.CreatedAt))
}

func wantCalls(t testing.TB, got []store.HostCall, want ...store.HostCall) {
	t.Helper()
	var g, w []string
	for _, c := range got {
		g = append(g, renderCall(c))
	}
	for _, c := range want {
		w = append(w, renderCall(c))
	}
	if strings.Join(g, "\n") != strings.Join(w, "\n") {
		t.Fatalf("journal:\n%s\nwant:\n%s", strings.Join(g, "\n"), strings.Join(w, "\n"))
	}
}

// callTurn is a session with one event in flight under a live activation.
func (b *bundle) callTurn(ttl time.Duration) (store.ActorKey, store.Event, store.Activation, abi.TurnRef) {
	b.t.Helper()
	key := b.session()
	ev := b.message(key, "call things")
	act := b.claim(key, ttl)
	return key, ev, act, b.next(act).Delivery.TurnRef()
}

func testHostCallReadBack(t *testing.T, b *bundle) {
	key, ev, act, ref := b.callTurn(LongTTL)
	c1 := hostCall(1, 1200, 345)
	got1 := b.record(ref, c1)
	if got1.ID <= 0 || got1.CreatedAt.IsZero() {
		t.Fatalf("recorded row = %s: no id or created_at", renderCall(got1))
	}
	want1 := c1
	want1.ID, want1.EventID, want1.ActorEpoch, want1.CreatedAt = got1.ID, ev.ID, act.ActorEpoch, got1.CreatedAt
	wantCalls(t, []store.HostCall{got1}, want1)

	// An http call with an error result, binary result bytes, a status,
	// and no StartedAt (the store's now).
	c2 := store.HostCall{Seq: 2, Kind: string(abi.CallKindHTTP), Destination: "GET https://example.com:443/x",
		RequestDigest: digest([]byte("GET x")), Result: []byte("\x00\x01binary\xff"), ErrorCode: "upstream_status",
		Status: 503, DurationMS: 7}
	got2 := b.record(ref, c2)
	if got2.StartedAt.IsZero() || got2.StartedAt.Sub(got2.CreatedAt).Abs() > time.Second {
		t.Fatalf("StartedAt of a call recorded without one = %s, want about created_at %s", ts(got2.StartedAt), ts(got2.CreatedAt))
	}
	want2 := c2
	want2.ID, want2.EventID, want2.ActorEpoch, want2.StartedAt, want2.CreatedAt = got2.ID, ev.ID, act.ActorEpoch, got2.StartedAt, got2.CreatedAt
	wantCalls(t, b.hostCalls(key, ev.ID), want1, want2)
	if got2.ID <= got1.ID {
		t.Fatalf("ids %d then %d: not increasing", got1.ID, got2.ID)
	}

	// Another event of the session has no rows; an unknown session is
	// ErrNotFound.
	wantEq(t, len(b.hostCalls(key, ev.ID+1000)), 0, "rows of an unknown event")
	_, err := b.s.HostCalls(b.ctx, store.ActorKey{AgentUID: key.AgentUID, SessionID: "no-such-session"}, ev.ID)
	wantIs(t, err, store.ErrNotFound, "HostCalls of an unknown session")
	// The rows of an event are listed under its own session only.
	other := b.session()
	wantEq(t, len(b.hostCalls(other, ev.ID)), 0, "rows of the event under another session")
}

func testHostCallConflict(t *testing.T, b *bundle) {
	key, ev, _, ref := b.callTurn(LongTTL)
	first := b.record(ref, hostCall(1, 10, 20))
	before := b.snapshot(key)
	again := hostCall(1, 99, 99)
	again.RequestDigest = digest([]byte("another request"))
	_, err := b.s.RecordHostCall(b.ctx, store.RecordHostCallParams{Ref: ref, Call: again})
	wantIs(t, err, store.ErrConflict, "a second live row at seq 1")
	if !strings.Contains(err.Error(), fmt.Sprint(ev.ID)) {
		t.Fatalf("conflict error %q does not name event %d", err, ev.ID)
	}
	b.sameSnapshot(key, before, "the conflicting record")
	wantEq(t, len(b.hostCalls(key, ev.ID)), 1, "rows after the conflict")
	wantEq(t, b.hostCalls(key, ev.ID)[0].ID, first.ID, "the live row")
	// The attempt is untouched: it records the next seq and commits.
	b.record(ref, hostCall(2, 1, 1))
	b.commit(ref, "done", "")
}

// rejectRecord records under bad (with a set-aside from 1, which must not
// happen either) and requires the fence reason with nothing written to
// either session.
func (f *fenceFixture) rejectRecord(b *bundle, bad abi.TurnRef, reason store.FenceReason, what string) {
	b.t.Helper()
	before, beforeOther := b.snapshot(f.key), b.snapshot(f.otherKey)
	c := hostCall(1, 1, 1)
	c.Destination = "MUST NOT BE WRITTEN"
	_, err := b.s.RecordHostCall(b.ctx, store.RecordHostCallParams{Ref: bad, Call: c, SetAsideFrom: 1})
	wantFence(b.t, err, reason, what)
	b.sameSnapshot(f.key, before, what)
	b.sameSnapshot(f.otherKey, beforeOther, what)
}

func testHostCallFences(t *testing.T, b *bundle) {
	f := newFenceFixture(b, LongTTL)
	live := b.record(f.ref, hostCall(1, 5, 5))
	bad := f.ref
	bad.ActorEpoch--
	f.rejectRecord(b, bad, store.FenceStaleEpoch, "older epoch")
	bad = f.ref
	bad.ActorEpoch++
	f.rejectRecord(b, bad, store.FenceStaleEpoch, "newer epoch")
	bad = f.ref
	bad.Revision++
	f.rejectRecord(b, bad, store.FenceStaleRevision, "another revision")
	bad = f.ref
	bad.ActorEventID = f.first.ID
	f.rejectRecord(b, bad, store.FenceSupersededDelivery, "another event")
	bad = f.ref
	bad.ActivationUID = f.old.UID
	f.rejectRecord(b, bad, store.FenceSupersededDelivery, "the previous activation")
	bad = f.ref
	bad.DeliveryID = uuid.NewString()
	f.rejectRecord(b, bad, store.FenceUnknownDelivery, "an unknown delivery")
	bad = f.ref
	bad.SessionID = f.otherKey.SessionID
	f.rejectRecord(b, bad, store.FenceWrongActorKey, "this delivery under another session")
	bad = f.otherRef // the other session's genuine delivery, sent to this key
	bad.AgentUID, bad.SessionID = f.key.AgentUID, f.key.SessionID
	f.rejectRecord(b, bad, store.FenceWrongActorKey, "another session's delivery")
	bad = f.ref
	bad.AgentUID = uuid.NewString()
	f.rejectRecord(b, bad, store.FenceWrongActorKey, "another agent")
	wantCalls(t, b.hostCalls(f.key, f.ev.ID), live)
	// The genuine ref still records and commits; the other session's too.
	b.record(f.ref, hostCall(2, 5, 5))
	f.proveUntouched(b, false)
}

func testHostCallAfterFailedAttempt(t *testing.T, b *bundle) {
	key, ev, _, late := b.callTurn(LongTTL)
	first := b.record(late, hostCall(1, 3, 4))
	b.fail(late, true, 0, 5)
	a2 := b.claim(key, LongTTL)
	ref2 := b.next(a2).Delivery.TurnRef()
	wantEq(t, ref2.ActorEventID, ev.ID, "retried event")

	before := b.snapshot(key)
	_, err := b.s.RecordHostCall(b.ctx, store.RecordHostCallParams{Ref: late, Call: hostCall(2, 1, 1)})
	wantFence(t, err, store.FenceStaleEpoch, "a zombie attempt's record after its attempt failed")
	b.sameSnapshot(key, before, "the zombie's record")
	_, err = b.s.RecordHostCall(b.ctx, store.RecordHostCallParams{Ref: late, Call: hostCall(1, 1, 1), SetAsideFrom: 1})
	wantFence(t, err, store.FenceStaleEpoch, "a zombie attempt's set-aside")
	b.sameSnapshot(key, before, "the zombie's set-aside")
	wantCalls(t, b.hostCalls(key, ev.ID), first)

	// The retry records under its own epoch.
	got := b.record(ref2, hostCall(2, 1, 1))
	wantEq(t, got.ActorEpoch, a2.ActorEpoch, "the retry's row epoch")

	// After the watchdog failed an activation, its attempt is stale too.
	key3, _, a3, ref3 := b.callTurn(SetupTTL)
	b.waitExpired(a3)
	_, err = b.s.ExpireActivation(b.ctx, store.ExpireActivationParams{Ref: a3.Ref(), MaxAttempts: 5})
	noErr(t, err, "ExpireActivation")
	before = b.snapshot(key3)
	_, err = b.s.RecordHostCall(b.ctx, store.RecordHostCallParams{Ref: ref3, Call: hostCall(1, 1, 1)})
	wantFence(t, err, store.FenceStaleEpoch, "a record after the watchdog failed the activation")
	b.sameSnapshot(key3, before, "the record after expiry")
}

func testHostCallExpiredLease(t *testing.T, b *bundle) {
	key, ev, act, ref := b.callTurn(SetupTTL)
	b.waitExpired(act)
	before := b.snapshot(key)
	_, err := b.s.RecordHostCall(b.ctx, store.RecordHostCallParams{Ref: ref, Call: hostCall(1, 1, 1)})
	wantFence(t, err, store.FenceExpiredLease, "a record with an expired lease")
	b.sameSnapshot(key, before, "the record with an expired lease")
	err = b.s.ReplayHostCall(b.ctx, ref, 1)
	wantFence(t, err, store.FenceExpiredLease, "a replay with an expired lease")
	wantEq(t, len(b.hostCalls(key, ev.ID)), 0, "rows")
}

func testHostCallAfterCommit(t *testing.T, b *bundle) {
	key, ev, act, ref := b.callTurn(LongTTL)
	row := b.record(ref, hostCall(1, 1, 1))
	b.commit(ref, "done", "")
	before := b.snapshot(key)
	_, err := b.s.RecordHostCall(b.ctx, store.RecordHostCallParams{Ref: ref, Call: hostCall(2, 1, 1)})
	wantFence(t, err, store.FenceSupersededDelivery, "a record after the turn committed")
	err = b.s.ReplayHostCall(b.ctx, ref, 1)
	wantFence(t, err, store.FenceSupersededDelivery, "a replay after the turn committed")
	b.sameSnapshot(key, before, "records after the commit")
	wantCalls(t, b.hostCalls(key, ev.ID), row)

	// A steer in flight supersedes the delivery with a new revision: the
	// old ref is stale_revision, the new one records.
	b.message(key, "next")
	d := b.next(act)
	sr, err := b.s.Steer(b.ctx, store.SteerParams{Key: key, Payload: []byte(`{"message":"steer"}`), DeliveryID: uuid.NewString()})
	noErr(t, err, "Steer")
	if !sr.InFlight {
		t.Fatalf("steer was not attached to the turn in flight")
	}
	before = b.snapshot(key)
	_, err = b.s.RecordHostCall(b.ctx, store.RecordHostCallParams{Ref: d.Delivery.TurnRef(), Call: hostCall(1, 1, 1)})
	wantFence(t, err, store.FenceStaleRevision, "a record under the delivery a steer superseded")
	b.sameSnapshot(key, before, "the record under the superseded delivery")
	b.record(sr.Ref, hostCall(1, 1, 1))
}

func testHostCallSetAside(t *testing.T, b *bundle) {
	key, ev, _, ref := b.callTurn(LongTTL)
	r1 := b.record(ref, hostCall(1, 10, 1))
	r2 := b.record(ref, hostCall(2, 20, 2))
	r3 := b.record(ref, hostCall(3, 30, 3))
	c := hostCall(2, 40, 4)
	c.RequestDigest = digest([]byte("diverged"))
	n2, err := b.s.RecordHostCall(b.ctx, store.RecordHostCallParams{Ref: ref, Call: c, SetAsideFrom: 2})
	noErr(t, err, "RecordHostCall with SetAsideFrom 2")
	wantEq(t, n2.SetAside, false, "the new row's SetAside")
	r2.SetAside, r3.SetAside = true, true
	wantCalls(t, b.hostCalls(key, ev.ID), r1, r2, n2, r3)
	// The new row is the live one at seq 2: another is a conflict.
	_, err = b.s.RecordHostCall(b.ctx, store.RecordHostCallParams{Ref: ref, Call: hostCall(2, 1, 1)})
	wantIs(t, err, store.ErrConflict, "a second live row at seq 2 after the set-aside")
	// Seq 3 is free again (its row was set aside).
	n3 := b.record(ref, hostCall(3, 50, 5))
	// A set-aside from 1 sets aside everything live, and the conflict a
	// row would meet at seq 1 is gone.
	n1, err := b.s.RecordHostCall(b.ctx, store.RecordHostCallParams{Ref: ref, Call: hostCall(1, 60, 6), SetAsideFrom: 1})
	noErr(t, err, "RecordHostCall with SetAsideFrom 1")
	r1.SetAside, n2.SetAside, n3.SetAside = true, true, true
	wantCalls(t, b.hostCalls(key, ev.ID), r1, n1, r2, n2, r3, n3)
	// SetAsideFrom beyond the call's seq is refused.
	before := b.snapshot(key)
	_, err = b.s.RecordHostCall(b.ctx, store.RecordHostCallParams{Ref: ref, Call: hostCall(2, 1, 1), SetAsideFrom: 3})
	wantIs(t, err, store.ErrInvalid, "SetAsideFrom 3 for a call at seq 2")
	b.sameSnapshot(key, before, "the invalid set-aside")
}

func testHostCallReplay(t *testing.T, b *bundle) {
	key, ev, _, late := b.callTurn(LongTTL)
	r1 := b.record(late, hostCall(1, 10, 1))
	r2 := b.record(late, hostCall(2, 20, 2))
	b.fail(late, true, 0, 5)
	a2 := b.claim(key, LongTTL)
	ref := b.next(a2).Delivery.TurnRef()

	noErr(t, b.s.ReplayHostCall(b.ctx, ref, 1), "ReplayHostCall seq 1")
	r1.Replays, r1.ReplayedEpoch = 1, a2.ActorEpoch
	wantCalls(t, b.hostCalls(key, ev.ID), r1, r2)
	noErr(t, b.s.ReplayHostCall(b.ctx, ref, 1), "ReplayHostCall seq 1 again")
	r1.Replays = 2
	wantCalls(t, b.hostCalls(key, ev.ID), r1, r2)

	// The failed attempt is fenced off: nothing changes.
	before := b.snapshot(key)
	wantFence(t, b.s.ReplayHostCall(b.ctx, late, 2), store.FenceStaleEpoch, "a replay by the failed attempt")
	bad := ref
	bad.DeliveryID = uuid.NewString()
	wantFence(t, b.s.ReplayHostCall(b.ctx, bad, 2), store.FenceUnknownDelivery, "a replay with an unknown delivery")
	bad = ref
	bad.Revision++
	wantFence(t, b.s.ReplayHostCall(b.ctx, bad, 2), store.FenceStaleRevision, "a replay with another revision")
	b.sameSnapshot(key, before, "the refused replays")
	wantCalls(t, b.hostCalls(key, ev.ID), r1, r2)

	// No live row at a seq: ErrNotFound (none ever, or set aside).
	wantIs(t, b.s.ReplayHostCall(b.ctx, ref, 3), store.ErrNotFound, "a replay of seq 3")
	c := hostCall(2, 30, 3)
	c.RequestDigest = digest([]byte("diverged"))
	n2, err := b.s.RecordHostCall(b.ctx, store.RecordHostCallParams{Ref: ref, Call: c, SetAsideFrom: 2})
	noErr(t, err, "RecordHostCall diverging at seq 2")
	r2.SetAside = true
	noErr(t, b.s.ReplayHostCall(b.ctx, ref, 2), "ReplayHostCall of the new live row at seq 2")
	n2.Replays, n2.ReplayedEpoch = 1, a2.ActorEpoch
	wantCalls(t, b.hostCalls(key, ev.ID), r1, r2, n2)
	wantIs(t, b.s.ReplayHostCall(b.ctx, ref, 0), store.ErrInvalid, "a replay of seq 0")
}

func testHostCallUsage(t *testing.T, b *bundle) {
	key, _, _, late := b.callTurn(LongTTL)
	b.record(late, hostCall(1, 100, 10))
	b.record(late, hostCall(2, 200, 20))
	b.fail(late, true, 0, 5)
	a2 := b.claim(key, LongTTL)
	ref := b.next(a2).Delivery.TurnRef()
	noErr(t, b.s.ReplayHostCall(b.ctx, ref, 1), "ReplayHostCall seq 1")
	c := hostCall(2, 300, 30)
	c.RequestDigest = digest([]byte("diverged"))
	_, err := b.s.RecordHostCall(b.ctx, store.RecordHostCallParams{Ref: ref, Call: c, SetAsideFrom: 2})
	noErr(t, err, "RecordHostCall diverging at seq 2")
	b.record(ref, store.HostCall{Seq: 3, Kind: string(abi.CallKindHTTP), Destination: "GET https://x:443/",
		RequestDigest: digest([]byte("http")), Result: []byte("{}"), StartedAt: callStart()})
	// Live rows: seq 1 (100/10) and the new seq 2 (300/30); the old seq 2
	// (200/20) is set aside.
	want := abi.Usage{InputTokens: 400, OutputTokens: 40}
	turn := b.commit(ref, "done", "")
	wantEq(t, turn.Usage, want, "CommitTurn's Turn.Usage")
	tr := b.transcript(key)
	wantEq(t, len(tr), 1, "turns")
	wantEq(t, tr[0].Usage, want, "Transcript's Turn.Usage")

	// A turn without host calls has no usage.
	b.message(key, "plain")
	turn = b.commit(b.next(a2).Delivery.TurnRef(), "plain", "")
	wantEq(t, turn.Usage, abi.Usage{}, "Usage of a turn without host calls")
	tr = b.transcript(key)
	wantEq(t, tr[1].Usage, abi.Usage{}, "Transcript Usage of a turn without host calls")
	wantEq(t, tr[0].Usage, want, "Transcript Usage of the first turn, again")

	// A cancelled turn's usage is its event's journal too: the calls were
	// made.
	b.message(key, "to be cancelled")
	cref := b.next(a2).Delivery.TurnRef()
	b.record(cref, hostCall(1, 7, 8))
	cr, err := b.s.CancelEvent(b.ctx, store.CancelEventParams{Key: key, Reason: "enough"})
	noErr(t, err, "CancelEvent")
	wantEq(t, cr.InFlight, true, "cancelled in flight")
	tr = b.transcript(key)
	wantEq(t, len(tr), 3, "turns after the cancel")
	wantEq(t, tr[2].Outcome, store.OutcomeCancelled, "the cancelled turn's outcome")
	wantEq(t, tr[2].Usage, abi.Usage{InputTokens: 7, OutputTokens: 8}, "the cancelled turn's Usage")
}

func testHostCallInvalid(t *testing.T, b *bundle) {
	key, _, _, ref := b.callTurn(LongTTL)
	before := b.snapshot(key)
	for _, tc := range []struct {
		what string
		edit func(p *store.RecordHostCallParams)
	}{
		{"seq 0", func(p *store.RecordHostCallParams) { p.Call.Seq = 0 }},
		{"seq -1", func(p *store.RecordHostCallParams) { p.Call.Seq = -1 }},
		{"kind ftp", func(p *store.RecordHostCallParams) { p.Call.Kind = "ftp" }},
		{"kind empty", func(p *store.RecordHostCallParams) { p.Call.Kind = "" }},
		{"empty digest", func(p *store.RecordHostCallParams) { p.Call.RequestDigest = "" }},
		{"negative tokens", func(p *store.RecordHostCallParams) { p.Call.InputTokens = -1 }},
		{"negative set-aside", func(p *store.RecordHostCallParams) { p.SetAsideFrom = -1 }},
	} {
		p := store.RecordHostCallParams{Ref: ref, Call: hostCall(1, 1, 1)}
		tc.edit(&p)
		_, err := b.s.RecordHostCall(b.ctx, p)
		wantIs(t, err, store.ErrInvalid, "RecordHostCall with "+tc.what)
	}
	b.sameSnapshot(key, before, "the invalid records")
}

func testAgentTokensSince(t *testing.T, b *bundle) {
	_, _, _, ref := b.callTurn(LongTTL)
	t0 := time.Now().UTC().Truncate(time.Millisecond)
	at := func(c store.HostCall, when time.Time) store.HostCall { c.StartedAt = when; return c }
	b.record(ref, at(hostCall(1, 1000, 1), t0.Add(-time.Hour)))
	b.record(ref, at(hostCall(2, 200, 20), t0))
	b.record(ref, at(hostCall(3, 30, 3), t0.Add(time.Minute)))
	// Set aside rows were paid for: they count.
	c := at(hostCall(3, 4, 0), t0.Add(2*time.Minute))
	c.RequestDigest = digest([]byte("diverged"))
	_, err := b.s.RecordHostCall(b.ctx, store.RecordHostCallParams{Ref: ref, Call: c, SetAsideFrom: 3})
	noErr(t, err, "RecordHostCall diverging at seq 3")

	// Another agent's rows do not count.
	other := b.newAgent("other-"+uuid.NewString()[:8], b.agent.ModuleDigest, store.CrashRestart)
	okey := b.sessionOf(other.UID, store.CrashRestart)
	b.message(okey, "other")
	oref := b.next(b.claim(okey, LongTTL)).Delivery.TurnRef()
	b.record(oref, at(hostCall(1, 5000, 5000), t0))

	for _, tc := range []struct {
		since time.Time
		want  int64
	}{
		{t0.Add(-2 * time.Hour), 1001 + 220 + 33 + 4},
		{t0, 220 + 33 + 4},
		{t0.Add(time.Millisecond), 33 + 4},
		{t0.Add(time.Minute), 33 + 4},
		{t0.Add(3 * time.Minute), 0},
	} {
		n, err := b.s.AgentTokensSince(b.ctx, b.agent.UID, tc.since)
		noErr(t, err, "AgentTokensSince")
		wantEq(t, n, tc.want, fmt.Sprintf("AgentTokensSince(t0%+v)", tc.since.Sub(t0)))
	}
	n, err := b.s.AgentTokensSince(b.ctx, other.UID, t0)
	noErr(t, err, "AgentTokensSince of the other agent")
	wantEq(t, n, int64(10000), "the other agent's tokens")
	n, err = b.s.AgentTokensSince(b.ctx, uuid.NewString(), time.Time{})
	noErr(t, err, "AgentTokensSince of an unknown agent")
	wantEq(t, n, int64(0), "an unknown agent's tokens")
}

func testSecrets(t *testing.T, b *bundle) {
	sealed := []byte("\x00nonce\xffciphertext\x00tag")
	s1, created, err := b.s.PutSecret(b.ctx, store.DefaultNamespace, "openai.api-key_1", sealed)
	noErr(t, err, "PutSecret")
	wantEq(t, created, true, "created of a new secret")
	wantEq(t, s1.Name, "openai.api-key_1", "Name")
	if s1.CreatedAt.IsZero() || !s1.UpdatedAt.Equal(s1.CreatedAt) {
		t.Fatalf("new secret times: created %s updated %s", ts(s1.CreatedAt), ts(s1.UpdatedAt))
	}
	got, err := b.s.SealedSecret(b.ctx, store.DefaultNamespace, "openai.api-key_1")
	noErr(t, err, "SealedSecret")
	wantBytes(t, got, sealed, "sealed value")

	long := strings.Repeat("x", store.MaxSecretNameLen)
	_, created, err = b.s.PutSecret(b.ctx, store.DefaultNamespace, long, []byte("v"))
	noErr(t, err, "PutSecret with a 128-character name")
	wantEq(t, created, true, "created")
	_, _, err = b.s.PutSecret(b.ctx, store.DefaultNamespace, "A", []byte("a"))
	noErr(t, err, "PutSecret A")

	time.Sleep(5 * time.Millisecond) // UpdatedAt must move on, even at ms precision
	resealed := []byte("resealed value")
	s2, created, err := b.s.PutSecret(b.ctx, store.DefaultNamespace, "openai.api-key_1", resealed)
	noErr(t, err, "PutSecret replacing")
	wantEq(t, created, false, "created of a replaced secret")
	if !s2.CreatedAt.Equal(s1.CreatedAt) || !s2.UpdatedAt.After(s1.UpdatedAt) {
		t.Fatalf("replaced secret times: created %s (was %s), updated %s (was %s)",
			ts(s2.CreatedAt), ts(s1.CreatedAt), ts(s2.UpdatedAt), ts(s1.UpdatedAt))
	}
	got, err = b.s.SealedSecret(b.ctx, store.DefaultNamespace, "openai.api-key_1")
	noErr(t, err, "SealedSecret after the replace")
	wantBytes(t, got, resealed, "sealed value after the replace")

	list, err := b.s.ListSecrets(b.ctx, store.DefaultNamespace)
	noErr(t, err, "ListSecrets")
	var names []string
	for _, s := range list {
		names = append(names, s.Name)
		if s.Name == "openai.api-key_1" && (!s.CreatedAt.Equal(s2.CreatedAt) || !s.UpdatedAt.Equal(s2.UpdatedAt)) {
			t.Fatalf("listed %+v, put returned %+v", s, s2)
		}
	}
	// By name, byte order: uppercase first.
	wantEq(t, strings.Join(names, ","), "A,openai.api-key_1,"+long, "listed names")

	noErr(t, b.s.DeleteSecret(b.ctx, store.DefaultNamespace, "openai.api-key_1"), "DeleteSecret")
	_, err = b.s.SealedSecret(b.ctx, store.DefaultNamespace, "openai.api-key_1")
	wantIs(t, err, store.ErrNotFound, "SealedSecret after the delete")
	wantIs(t, b.s.DeleteSecret(b.ctx, store.DefaultNamespace, "openai.api-key_1"), store.ErrNotFound, "DeleteSecret again")
	_, err = b.s.SealedSecret(b.ctx, store.DefaultNamespace, "never-stored")
	wantIs(t, err, store.ErrNotFound, "SealedSecret of an unknown name")
	list, err = b.s.ListSecrets(b.ctx, store.DefaultNamespace)
	noErr(t, err, "ListSecrets after the delete")
	wantEq(t, len(list), 2, "secrets after the delete")
	// A deleted name can be put again, as new.
	_, created, err = b.s.PutSecret(b.ctx, store.DefaultNamespace, "openai.api-key_1", sealed)
	noErr(t, err, "PutSecret after the delete")
	wantEq(t, created, true, "created after the delete")
}

func testSecretsInvalid(t *testing.T, b *bundle) {
	for _, name := range []string{"", "a b", "a/b", "ü", "x\x00", strings.Repeat("x", store.MaxSecretNameLen+1)} {
		_, _, err := b.s.PutSecret(b.ctx, store.DefaultNamespace, name, []byte("v"))
		wantIs(t, err, store.ErrInvalid, fmt.Sprintf("PutSecret(%q)", name))
		if name != "" && !strings.Contains(err.Error(), fmt.Sprintf("%q", name)) {
			t.Fatalf("PutSecret(%q): error %q does not name it", name, err)
		}
		_, err = b.s.SealedSecret(b.ctx, store.DefaultNamespace, name)
		wantIs(t, err, store.ErrInvalid, fmt.Sprintf("SealedSecret(%q)", name))
		wantIs(t, b.s.DeleteSecret(b.ctx, store.DefaultNamespace, name), store.ErrInvalid, fmt.Sprintf("DeleteSecret(%q)", name))
	}
	_, _, err := b.s.PutSecret(b.ctx, store.DefaultNamespace, "empty", nil)
	wantIs(t, err, store.ErrInvalid, "PutSecret with an empty sealed value")
	list, err := b.s.ListSecrets(b.ctx, store.DefaultNamespace)
	noErr(t, err, "ListSecrets")
	if len(list) != 0 {
		t.Fatalf("refused puts stored %+v", list)
	}
}

func testHostCallRace(t *testing.T, b *bundle) {
	key, ev, _, ref := b.callTurn(LongTTL)
	const n = 8
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			c := hostCall(1, int64(i), 0)
			c.RequestDigest = digest(fmt.Appendf(nil, "racer %d", i))
			_, errs[i] = b.s.RecordHostCall(b.ctx, store.RecordHostCallParams{Ref: ref, Call: c})
		})
	}
	wg.Wait()
	won := -1
	for i, err := range errs {
		switch {
		case err == nil && won < 0:
			won = i
		case err == nil:
			t.Fatalf("racers %d and %d both recorded seq 1", won, i)
		default:
			wantIs(t, err, store.ErrConflict, fmt.Sprintf("racer %d", i))
		}
	}
	if won < 0 {
		t.Fatalf("no racer recorded seq 1: %v", errs)
	}
	rows := b.hostCalls(key, ev.ID)
	wantEq(t, len(rows), 1, "rows")
	wantEq(t, rows[0].InputTokens, int64(won), "the winner's row")
}

// testHostCallRaceCommit records calls while the turn commits: each record
// either lands before the commit, and is in the turn's usage, or is
// refused as superseded; none is lost or counted after the fact.
func testHostCallRaceCommit(t *testing.T, b *bundle) {
	key, ev, _, ref := b.callTurn(LongTTL)
	const n = 16
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			_, errs[i] = b.s.RecordHostCall(b.ctx, store.RecordHostCallParams{Ref: ref, Call: hostCall(i+1, 1<<i, 1)})
		})
	}
	var turn store.Turn
	var commitErr error
	wg.Go(func() {
		<-start
		turn, commitErr = b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: ref, Outcome: abi.OutcomeOK, KeepState: true})
	})
	close(start)
	wg.Wait()
	noErr(t, commitErr, "CommitTurn")
	var want abi.Usage
	for i, err := range errs {
		if err != nil {
			wantFence(t, err, store.FenceSupersededDelivery, fmt.Sprintf("record %d after the commit", i+1))
			continue
		}
		want.InputTokens += 1 << i
		want.OutputTokens++
	}
	wantEq(t, turn.Usage, want, "the turn's usage (bit i: record i+1 landed)")
	wantEq(t, b.transcript(key)[0].Usage, want, "Transcript usage")
	wantEq(t, len(b.hostCalls(key, ev.ID)), int(want.OutputTokens), "journal rows")
}
