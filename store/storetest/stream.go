package storetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

func streamCases() []testCase {
	return []testCase{
		{"Stream/LifecycleFramesAreGapFreeAndInSeqOrder", testStreamLifecycle},
		{"Stream/StaleAppendChunksIsRefusedAndWritesNothing", testStreamStaleChunks},
		{"Stream/AppendChunksValidatesItsInputs", testStreamInvalidChunks},
		{"Stream/RestartStreamAfterASteerWritesRetryingThenStarted", testStreamRestart},
		{"Stream/ExpireActivationWritesTurnRetryingLeaseExpired", testStreamLeaseExpired},
		{"Stream/DeadLetterWritesTurnFailed", testStreamDeadLetter},
		{"Stream/CancelInFlightWritesTurnFailedCancelled", testStreamCancel},
		{"Stream/DestroyWritesTurnFailedAndCancelsWaits", testStreamDestroy},
		{"Stream/CompactStreamKeepsFramesOfOpenEvents", testStreamCompact},
		{"Stream/StreamHeadsOfManyKeysInOneCall", testStreamHeads},
		{"Stream/ConcurrentWritersKeepSeqGapFree", testStreamConcurrent},
		{"Waits/CommitWithAWaitOpensItAndSleeps", testWaitCommit},
		{"Waits/ResolveAppendsTheEventAndWakes", testWaitResolve},
		{"Waits/RefusedResolutionsWriteNothing", testWaitResolveRefused},
		{"Waits/ReusedWaitIDIsAConflictAndWritesNothing", testWaitDuplicate},
		{"Waits/CommitValidatesTheWait", testWaitInvalid},
		{"Waits/ExpireDueWaitsAppendsWaitExpired", testWaitExpire},
		{"Waits/ListWaitsPagesByCreation", testWaitList},
		{"Waits/RacingResolversAndExpiryCloseTheWaitOnce", testWaitResolveRace},
		{"Approval/HeldEventIsNotDeliveredUntilResolved", testApprovalHold},
		{"Approval/ExpiryReleasesTheHeldEvent", testApprovalExpire},
		{"Approval/HoldIsValidated", testApprovalInvalid},
		{"Approval/HoldReusingAWaitIDIsAConflictAndWritesNothing", testApprovalDuplicate},
		{"Approval/CancellingTheHeldEventCancelsItsApproval", testApprovalCancel},
	}
}

// page reads a session's whole stream (every page).
func (b *bundle) stream(key store.ActorKey) store.StreamPage {
	b.t.Helper()
	var all store.StreamPage
	after := int64(0)
	for {
		pg, err := b.s.StreamFrames(b.ctx, store.StreamFramesParams{Key: key, After: after, Limit: 1000})
		noErr(b.t, err, "StreamFrames")
		all.Head, all.Oldest = pg.Head, pg.Oldest
		all.Frames = append(all.Frames, pg.Frames...)
		if len(pg.Frames) == 0 {
			return all
		}
		after = pg.Frames[len(pg.Frames)-1].Seq
	}
}

// wantGapFree checks that a full read of a stream holds Seq oldest…head,
// each once, in order, every frame of key.
func wantGapFree(t testing.TB, key store.ActorKey, pg store.StreamPage) {
	t.Helper()
	if int64(len(pg.Frames)) != pg.Head-pg.Oldest+1 {
		t.Fatalf("%d frames for seqs %d…%d", len(pg.Frames), pg.Oldest, pg.Head)
	}
	for i, f := range pg.Frames {
		if f.Seq != pg.Oldest+int64(i) || f.ActorKey != key {
			t.Fatalf("frame %d is seq %d of %s, want seq %d of %s", i, f.Seq, f.ActorKey, pg.Oldest+int64(i), key)
		}
	}
}

// kinds renders the frames' kinds, space-separated.
func kinds(fs []store.Frame) string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Kind)
	}
	return strings.Join(out, " ")
}

// renderFrame renders every field of a frame.
func renderFrame(f store.Frame) string {
	return fmt.Sprintf("%s seq=%d kind=%s event=%d epoch=%d attempt=%d at=%s body=%s",
		f.ActorKey, f.Seq, f.Kind, f.EventID, f.ActorEpoch, f.Attempt, ts(f.CreatedAt), f.Body)
}

// renderWait renders every field of a wait.
func renderWait(w store.Wait) string {
	exp := "-"
	if w.ExpiresAt != nil {
		exp = ts(*w.ExpiresAt)
	}
	return fmt.Sprintf("%s id=%s kind=%s event=%d for=%q data=%s status=%s call=%d/%s res=%s at=%s exp=%s closed=%s",
		w.ActorKey, w.ID, w.Kind, w.EventID, w.For, w.Data, w.Status, w.CallSeq, w.CallDigest, w.Resolution,
		ts(w.CreatedAt), exp, tsp(w.ClosedAt))
}

// streamSnapshot is snapshot plus the session's frames and waits.
func (b *bundle) streamSnapshot(key store.ActorKey) string {
	b.t.Helper()
	var sb strings.Builder
	sb.WriteString(b.snapshot(key))
	pg := b.stream(key)
	fmt.Fprintf(&sb, "stream head=%d oldest=%d\n", pg.Head, pg.Oldest)
	for _, f := range pg.Frames {
		fmt.Fprintf(&sb, "  %s\n", renderFrame(f))
	}
	for _, w := range b.waits(key) {
		fmt.Fprintf(&sb, "wait %s\n", renderWait(w))
	}
	return sb.String()
}

func (b *bundle) sameStream(key store.ActorKey, before, what string) {
	b.t.Helper()
	if after := b.streamSnapshot(key); after != before {
		b.t.Fatalf("%s wrote to %s:\nbefore:\n%s\nafter:\n%s", what, key, before, after)
	}
}

func (b *bundle) waits(key store.ActorKey) []store.Wait {
	b.t.Helper()
	pg, err := b.s.ListWaits(b.ctx, store.ListWaitsParams{AgentUID: key.AgentUID, SessionID: key.SessionID, Limit: 1000})
	noErr(b.t, err, "ListWaits")
	return pg.Waits
}

func (b *bundle) getWait(key store.ActorKey, id string) store.Wait {
	b.t.Helper()
	w, err := b.s.GetWait(b.ctx, key, id)
	noErr(b.t, err, "GetWait "+id)
	return w
}

// chunks appends text chunks under ref at offset.
func (b *bundle) chunks(ref abi.TurnRef, attempt, offset int, texts ...string) store.Frame {
	b.t.Helper()
	f, err := b.s.AppendChunks(b.ctx, store.AppendChunksParams{Ref: ref, Attempt: attempt, Offset: offset, Chunks: textChunks(texts...)})
	noErr(b.t, err, "AppendChunks")
	return f
}

func textChunks(texts ...string) []abi.Chunk {
	out := make([]abi.Chunk, len(texts))
	for i, s := range texts {
		out[i] = abi.Chunk{Type: abi.ChunkText, Text: s}
	}
	return out
}

// commitWait commits ref with outcome wait, opening w.
func (b *bundle) commitWait(ref abi.TurnRef, w store.WaitParams) (store.Turn, error) {
	return b.s.CommitTurn(b.ctx, store.CommitTurnParams{
		Ref: ref, Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "waiting for " + w.ID}},
		KeepState: true, Outcome: abi.OutcomeWait, Wait: &w,
	})
}

// waitingSession is a session whose first turn committed with outcome
// wait, opening w; the activation stays live.
func (b *bundle) waitingSession(w store.WaitParams) (store.ActorKey, store.Event, store.Activation) {
	b.t.Helper()
	key := b.session()
	ev := b.message(key, "ask a human")
	act := b.claim(key, LongTTL)
	_, err := b.commitWait(b.next(act).Delivery.TurnRef(), w)
	noErr(b.t, err, "CommitTurn with a wait")
	return key, ev, act
}

// body decodes a frame body into v.
func body[T any](t testing.TB, f store.Frame) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(f.Body, &v); err != nil {
		t.Fatalf("frame %s: body: %v", renderFrame(f), err)
	}
	return v
}

func wantFrame(t testing.TB, f store.Frame, kind string, eventID, epoch int64, attempt int) {
	t.Helper()
	if f.Kind != kind || f.EventID != eventID || f.ActorEpoch != epoch || f.Attempt != attempt || f.CreatedAt.IsZero() {
		t.Fatalf("frame %s, want kind %s event %d epoch %d attempt %d", renderFrame(f), kind, eventID, epoch, attempt)
	}
}

// waitUntilExpired calls ExpireDueWaits until it returns key (the DB
// clock passed the wait's timeout), for up to 10 s.
func (b *bundle) waitUntilExpired(key store.ActorKey) {
	b.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		keys, err := b.s.ExpireDueWaits(b.ctx, 100)
		noErr(b.t, err, "ExpireDueWaits")
		if slices.Contains(keys, key) {
			return
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("ExpireDueWaits did not expire the wait of %s within 10 s", key)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func testStreamLifecycle(t *testing.T, b *bundle) {
	key := b.session()
	if pg := b.stream(key); pg.Head != 0 || pg.Oldest != 1 || len(pg.Frames) != 0 {
		t.Fatalf("new session's stream = %+v, want head 0, oldest 1, no frames", pg)
	}
	ev := b.message(key, "hello")
	act1 := b.claim(key, LongTTL)
	d1 := b.next(act1)
	ref1 := d1.Delivery.TurnRef()
	c1 := b.chunks(ref1, d1.Attempt, 0, "He", "llo")
	wantFrame(t, c1, store.FrameChunk, ev.ID, act1.ActorEpoch, 1)
	b.chunks(ref1, d1.Attempt, 2, " wor")
	fr := b.fail(ref1, true, 0, 5)
	act2 := b.claim(key, LongTTL)
	d2 := b.next(act2)
	wantEq(t, d2.Attempt, 2, "second attempt")
	ref2 := d2.Delivery.TurnRef()
	b.chunks(ref2, d2.Attempt, 0, "Hello", " world")
	turn := b.commit(ref2, "Hello world", "s")

	pg := b.stream(key)
	wantGapFree(t, key, pg)
	wantEq(t, kinds(pg.Frames), "turn.started chunk chunk turn.retrying turn.started chunk turn.committed", "frame kinds")
	wantEq(t, pg.Oldest, 1, "oldest")
	f := pg.Frames
	wantFrame(t, f[0], store.FrameTurnStarted, ev.ID, act1.ActorEpoch, 1)
	wantEq(t, body[store.TurnStartedBody](t, f[0]).EventKind, abi.EventMessage, "turn.started event kind")
	cb := body[store.ChunkBody](t, f[1])
	if cb.Offset != 0 || len(cb.Chunks) != 2 || cb.Chunks[0].Text != "He" || cb.Chunks[1].Text != "llo" {
		t.Fatalf("chunk body = %s", f[1].Body)
	}
	wantEq(t, body[store.ChunkBody](t, f[2]).Offset, 2, "second batch's offset")
	if f[1].Seq != c1.Seq || f[1].CreatedAt != c1.CreatedAt || string(f[1].Body) != string(c1.Body) {
		t.Fatalf("AppendChunks returned %s, stream has %s", renderFrame(c1), renderFrame(f[1]))
	}
	wantFrame(t, f[3], store.FrameTurnRetrying, ev.ID, act1.ActorEpoch, 1)
	rb := body[store.AttemptEndedBody](t, f[3])
	if rb.Reason != store.EndReasonError || rb.Error != "worker crashed" || rb.NextAttemptAt == nil ||
		rb.NextAttemptAt.Sub(fr.NextAttemptAt).Abs() > time.Millisecond {
		t.Fatalf("turn.retrying body = %s, want reason error, the error and next_attempt_at %s", f[3].Body, ts(fr.NextAttemptAt))
	}
	wantFrame(t, f[4], store.FrameTurnStarted, ev.ID, act2.ActorEpoch, 2)
	wantFrame(t, f[5], store.FrameChunk, ev.ID, act2.ActorEpoch, 2)
	wantFrame(t, f[6], store.FrameTurnCommitted, ev.ID, act2.ActorEpoch, 2)
	cm := body[store.TurnCommittedBody](t, f[6])
	tr := b.transcript(key)
	if cm.TurnNo != turn.TurnNo || cm.Outcome != abi.OutcomeOK || len(tr) != 1 ||
		!slices.Equal(cm.Messages, tr[0].Messages) || cm.Usage != tr[0].Usage {
		t.Fatalf("turn.committed body = %s, want the transcript's turn %+v", f[6].Body, tr)
	}
	wantMessages(t, cm.Messages, abi.RoleUser, "hello", abi.RoleAssistant, "Hello world")

	// Paging: After is exclusive, Limit bounds the page, Head and Oldest
	// are the stream's.
	p, err := b.s.StreamFrames(b.ctx, store.StreamFramesParams{Key: key, After: 3, Limit: 2})
	noErr(t, err, "StreamFrames after 3")
	if len(p.Frames) != 2 || p.Frames[0].Seq != 4 || p.Frames[1].Seq != 5 || p.Head != 7 || p.Oldest != 1 {
		t.Fatalf("page after 3, limit 2 = head %d oldest %d %v", p.Head, p.Oldest, kinds(p.Frames))
	}
	p, err = b.s.StreamFrames(b.ctx, store.StreamFramesParams{Key: key, After: 7})
	noErr(t, err, "StreamFrames after the head")
	if len(p.Frames) != 0 || p.Head != 7 {
		t.Fatalf("page after the head = %d frames, head %d", len(p.Frames), p.Head)
	}
	_, err = b.s.StreamFrames(b.ctx, store.StreamFramesParams{Key: store.ActorKey{AgentUID: key.AgentUID, SessionID: uuid.NewString()}})
	wantIs(t, err, store.ErrNotFound, "StreamFrames of an unknown session")
}

func testStreamStaleChunks(t *testing.T, b *bundle) {
	key, _, act, ref := b.callTurn(LongTTL)
	b.chunks(ref, 1, 0, "a")
	b.fail(ref, true, 0, 5)
	before := b.streamSnapshot(key)
	_, err := b.s.AppendChunks(b.ctx, store.AppendChunksParams{Ref: ref, Attempt: 1, Offset: 1, Chunks: textChunks("zombie")})
	wantFence(t, err, store.FenceStaleEpoch, "AppendChunks of a failed attempt")
	b.sameStream(key, before, "AppendChunks of a failed attempt")

	act2 := b.claim(key, LongTTL)
	ref2 := b.next(act2).Delivery.TurnRef()
	before = b.streamSnapshot(key)
	for _, c := range []struct {
		ref    abi.TurnRef
		reason store.FenceReason
		what   string
	}{
		{ref, store.FenceStaleEpoch, "the failed attempt's ref while a new one runs"},
		{func() abi.TurnRef { r := ref2; r.Revision++; return r }(), store.FenceStaleRevision, "revision + 1"},
		{func() abi.TurnRef { r := ref2; r.DeliveryID = uuid.NewString(); return r }(), store.FenceUnknownDelivery, "an unknown delivery"},
		{func() abi.TurnRef { r := ref2; r.SessionID = uuid.NewString(); return r }(), store.FenceWrongActorKey, "another session"},
	} {
		_, err := b.s.AppendChunks(b.ctx, store.AppendChunksParams{Ref: c.ref, Attempt: 2, Chunks: textChunks("x")})
		wantFence(t, err, c.reason, "AppendChunks with "+c.what)
		b.sameStream(key, before, "AppendChunks with "+c.what)
	}
	b.commit(ref2, "done", "")
	before = b.streamSnapshot(key)
	_, err = b.s.AppendChunks(b.ctx, store.AppendChunksParams{Ref: ref2, Attempt: 2, Chunks: textChunks("late")})
	wantFence(t, err, store.FenceSupersededDelivery, "AppendChunks after the commit")
	b.sameStream(key, before, "AppendChunks after the commit")
	_ = act
}

func testStreamRestart(t *testing.T, b *bundle) {
	key := b.session()
	ev := b.message(key, "hello")
	act := b.claim(key, LongTTL)
	d := b.next(act)
	ref := d.Delivery.TurnRef()
	b.chunks(ref, d.Attempt, 0, "intro ", "s0")
	sr, err := b.s.Steer(b.ctx, store.SteerParams{Key: key, Payload: msgPayload("faster"), DeliveryID: uuid.NewString()})
	noErr(t, err, "Steer")
	if !sr.InFlight {
		t.Fatalf("steer was not attached to the turn in flight")
	}

	// The superseded ref, and other stale refs, write nothing.
	before := b.streamSnapshot(key)
	for _, c := range []struct {
		ref    abi.TurnRef
		reason store.FenceReason
		what   string
	}{
		{ref, store.FenceStaleRevision, "the ref the steer superseded"},
		{func() abi.TurnRef { r := sr.Ref; r.DeliveryID = uuid.NewString(); return r }(), store.FenceUnknownDelivery, "an unknown delivery"},
		{func() abi.TurnRef { r := sr.Ref; r.SessionID = uuid.NewString(); return r }(), store.FenceWrongActorKey, "another session"},
	} {
		_, err := b.s.RestartStream(b.ctx, store.RestartStreamParams{Ref: c.ref, Attempt: d.Attempt, Reason: store.EndReasonSteer})
		wantFence(t, err, c.reason, "RestartStream with "+c.what)
		b.sameStream(key, before, "RestartStream with "+c.what)
	}
	for _, p := range []store.RestartStreamParams{
		{Ref: sr.Ref, Attempt: 0, Reason: store.EndReasonSteer},
		{Ref: sr.Ref, Attempt: d.Attempt},
	} {
		_, err := b.s.RestartStream(b.ctx, p)
		if !errors.Is(err, store.ErrInvalid) {
			t.Errorf("RestartStream(%+v) = %v, want ErrInvalid", p, err)
		}
		b.sameStream(key, before, "an invalid RestartStream")
	}

	fs, err := b.s.RestartStream(b.ctx, store.RestartStreamParams{Ref: sr.Ref, Attempt: d.Attempt, Reason: store.EndReasonSteer})
	noErr(t, err, "RestartStream")
	wantEq(t, kinds(fs), "turn.retrying turn.started", "returned frames")
	b.chunks(sr.Ref, d.Attempt, 0, "intro ", "s0 s1")
	b.commit(sr.Ref, "intro s0 s1", "")

	pg := b.stream(key)
	wantGapFree(t, key, pg)
	wantEq(t, kinds(pg.Frames), "turn.started chunk turn.retrying turn.started chunk turn.committed", "frame kinds")
	f := pg.Frames
	wantFrame(t, f[2], store.FrameTurnRetrying, ev.ID, act.ActorEpoch, d.Attempt)
	wantFrame(t, f[3], store.FrameTurnStarted, ev.ID, act.ActorEpoch, d.Attempt)
	r := body[store.AttemptEndedBody](t, f[2])
	if r.Reason != store.EndReasonSteer || r.NextAttemptAt != nil || r.Error != "" {
		t.Errorf("turn.retrying body %+v, want reason steer alone", r)
	}
	wantEq(t, body[store.TurnStartedBody](t, f[3]).EventKind, abi.EventMessage, "turn.started event kind")
	for i, g := range fs {
		if w := f[2+i]; g.Seq != w.Seq || g.Kind != w.Kind || string(g.Body) != string(w.Body) || !g.CreatedAt.Equal(w.CreatedAt) ||
			g.EventID != w.EventID || g.ActorEpoch != w.ActorEpoch || g.Attempt != w.Attempt || g.ActorKey != w.ActorKey {
			t.Errorf("RestartStream returned %s, stored %s", renderFrame(g), renderFrame(w))
		}
	}

	// After the commit the ref is stale.
	before = b.streamSnapshot(key)
	_, err = b.s.RestartStream(b.ctx, store.RestartStreamParams{Ref: sr.Ref, Attempt: d.Attempt, Reason: store.EndReasonSteer})
	wantFence(t, err, store.FenceSupersededDelivery, "RestartStream after the commit")
	b.sameStream(key, before, "RestartStream after the commit")
}

func testStreamInvalidChunks(t *testing.T, b *bundle) {
	key, _, _, ref := b.callTurn(LongTTL)
	before := b.streamSnapshot(key)
	for _, p := range []store.AppendChunksParams{
		{Ref: ref, Attempt: 1},
		{Ref: ref, Attempt: 0, Chunks: textChunks("a")},
		{Ref: ref, Attempt: 1, Offset: -1, Chunks: textChunks("a")},
		{Ref: ref, Attempt: 1, Chunks: []abi.Chunk{{Type: "video"}}},
		{Ref: ref, Attempt: 1, Chunks: []abi.Chunk{{Type: abi.ChunkJSON, Data: json.RawMessage("{")}}},
	} {
		_, err := b.s.AppendChunks(b.ctx, p)
		wantIs(t, err, store.ErrInvalid, fmt.Sprintf("AppendChunks %+v", p))
	}
	b.sameStream(key, before, "invalid AppendChunks")
}

func testStreamLeaseExpired(t *testing.T, b *bundle) {
	key := b.session()
	ev := b.message(key, "slow")
	act := b.claim(key, SetupTTL)
	b.next(act) // nothing more under the short lease: the machine may be slow
	b.waitExpired(act)
	fr, err := b.s.ExpireActivation(b.ctx, store.ExpireActivationParams{Ref: act.Ref(), Backoff: time.Hour, MaxAttempts: 5})
	noErr(t, err, "ExpireActivation")
	pg := b.stream(key)
	wantGapFree(t, key, pg)
	wantEq(t, kinds(pg.Frames), "turn.started turn.retrying", "frame kinds")
	last := pg.Frames[1]
	wantFrame(t, last, store.FrameTurnRetrying, ev.ID, act.ActorEpoch, 1)
	rb := body[store.AttemptEndedBody](t, last)
	if rb.Reason != store.EndReasonLeaseExpired || rb.NextAttemptAt == nil || rb.NextAttemptAt.Sub(fr.NextAttemptAt).Abs() > time.Millisecond {
		t.Fatalf("turn.retrying body = %s, want lease_expired due %s", last.Body, ts(fr.NextAttemptAt))
	}

	// An expired activation with no current event writes no frame.
	key2 := b.session()
	idle := b.claim(key2, ShortTTL)
	b.waitExpired(idle)
	_, err = b.s.ExpireActivation(b.ctx, store.ExpireActivationParams{Ref: idle.Ref(), MaxAttempts: 5})
	noErr(t, err, "ExpireActivation of an idle activation")
	if pg := b.stream(key2); pg.Head != 0 {
		t.Fatalf("idle activation's expiry wrote frames: %v", kinds(pg.Frames))
	}
}

func testStreamDeadLetter(t *testing.T, b *bundle) {
	key, ev, act, ref := b.callTurn(LongTTL)
	fr := b.fail(ref, true, time.Minute, 1)
	if !fr.DeadLettered {
		t.Fatalf("FailAttempt at MaxAttempts 1: %+v, want dead-lettered", fr)
	}
	pg := b.stream(key)
	wantGapFree(t, key, pg)
	wantEq(t, kinds(pg.Frames), "turn.started turn.failed", "frame kinds")
	wantFrame(t, pg.Frames[1], store.FrameTurnFailed, ev.ID, act.ActorEpoch, 1)
	if rb := body[store.AttemptEndedBody](t, pg.Frames[1]); rb.Reason != store.EndReasonDeadLetter || rb.Error != "worker crashed" || rb.NextAttemptAt != nil {
		t.Fatalf("turn.failed body = %s, want reason dead_letter with the error", pg.Frames[1].Body)
	}

	// Crash policy destroy: the failure destroys the session.
	key2 := b.sessionWith(store.CrashDestroy)
	ev2 := b.message(key2, "boom")
	act2 := b.claim(key2, LongTTL)
	b.fail(b.next(act2).Delivery.TurnRef(), true, 0, 5)
	pg = b.stream(key2)
	wantGapFree(t, key2, pg)
	wantEq(t, kinds(pg.Frames), "turn.started turn.failed", "frame kinds under crash policy destroy")
	wantFrame(t, pg.Frames[1], store.FrameTurnFailed, ev2.ID, act2.ActorEpoch, 1)
	wantEq(t, body[store.AttemptEndedBody](t, pg.Frames[1]).Reason, store.EndReasonDestroyed, "turn.failed reason")
}

func testStreamCancel(t *testing.T, b *bundle) {
	key, ev, act, _ := b.callTurn(LongTTL)
	queued := b.message(key, "later")
	_, err := b.s.CancelEvent(b.ctx, store.CancelEventParams{Key: key, EventID: queued.ID, Reason: "not needed"})
	noErr(t, err, "CancelEvent of a queued event")
	wantEq(t, b.stream(key).Head, 1, "head after cancelling a queued event (no frame)")
	_, err = b.s.CancelEvent(b.ctx, store.CancelEventParams{Key: key, Reason: "user pressed stop"})
	noErr(t, err, "CancelEvent in flight")
	pg := b.stream(key)
	wantGapFree(t, key, pg)
	wantEq(t, kinds(pg.Frames), "turn.started turn.failed", "frame kinds")
	wantFrame(t, pg.Frames[1], store.FrameTurnFailed, ev.ID, act.ActorEpoch, 1)
	if rb := body[store.AttemptEndedBody](t, pg.Frames[1]); rb.Reason != store.EndReasonCancelled || rb.Error != "user pressed stop" {
		t.Fatalf("turn.failed body = %s, want reason cancelled with the reason", pg.Frames[1].Body)
	}
}

func testStreamDestroy(t *testing.T, b *bundle) {
	key, _, act := b.waitingSession(store.WaitParams{ID: "w1", For: "a name"})
	ev := b.message(key, "next")
	d := b.next(act)
	b.chunks(d.Delivery.TurnRef(), 1, 0, "thinking")
	_, err := b.s.DestroySession(b.ctx, key)
	noErr(t, err, "DestroySession")
	pg := b.stream(key)
	wantGapFree(t, key, pg)
	wantEq(t, kinds(pg.Frames), "turn.started turn.committed wait.opened turn.started chunk turn.failed", "frame kinds")
	wantFrame(t, pg.Frames[5], store.FrameTurnFailed, ev.ID, act.ActorEpoch, 1)
	wantEq(t, body[store.AttemptEndedBody](t, pg.Frames[5]).Reason, store.EndReasonDestroyed, "turn.failed reason")
	w := b.getWait(key, "w1")
	if w.Status != store.WaitCancelled || w.ClosedAt == nil {
		t.Fatalf("wait of a destroyed session = %s, want cancelled", renderWait(w))
	}
	// A second destroy writes nothing.
	before := b.streamSnapshot(key)
	_, err = b.s.DestroySession(b.ctx, key)
	noErr(t, err, "DestroySession again")
	b.sameStream(key, before, "a second DestroySession")
}

func testStreamCompact(t *testing.T, b *bundle) {
	done := b.session()
	b.message(done, "one")
	actDone := b.claim(done, LongTTL)
	b.commit(b.next(actDone).Delivery.TurnRef(), "ok", "")
	open, _, _, openRef := b.callTurn(LongTTL)
	b.chunks(openRef, 1, 0, "still running")

	// Only frames created before Before go; those of an open event stay.
	n, err := b.s.CompactStream(b.ctx, store.CompactStreamParams{Before: time.Now().Add(-time.Hour), Limit: 100})
	noErr(t, err, "CompactStream of nothing old")
	wantEq(t, n, 0, "frames deleted before an hour ago")
	n, err = b.s.CompactStream(b.ctx, store.CompactStreamParams{Before: time.Now().Add(time.Hour), Limit: 1})
	noErr(t, err, "CompactStream limit 1")
	wantEq(t, n, 1, "frames deleted with limit 1")
	n, err = b.s.CompactStream(b.ctx, store.CompactStreamParams{Before: time.Now().Add(time.Hour), Limit: 100})
	noErr(t, err, "CompactStream")
	wantEq(t, n, 1, "frames deleted")
	pg := b.stream(done)
	if len(pg.Frames) != 0 || pg.Head != 2 || pg.Oldest != 3 {
		t.Fatalf("compacted stream = head %d oldest %d %v, want head 2, oldest 3, no frames", pg.Head, pg.Oldest, kinds(pg.Frames))
	}
	pg = b.stream(open)
	wantEq(t, kinds(pg.Frames), "turn.started chunk", "frames of the open event")
	// Seq goes on from the head.
	b.message(done, "two")
	d := b.next(actDone)
	b.commit(d.Delivery.TurnRef(), "ok", "")
	pg = b.stream(done)
	wantGapFree(t, done, pg)
	if pg.Oldest != 3 || pg.Head != 4 {
		t.Fatalf("after compaction and a turn: oldest %d head %d, want 3 and 4", pg.Oldest, pg.Head)
	}
	// The open event's frames go once it closes.
	b.commit(openRef, "ok", "")
	n, err = b.s.CompactStream(b.ctx, store.CompactStreamParams{Before: time.Now().Add(time.Hour), Limit: 100})
	noErr(t, err, "CompactStream after the commit")
	wantEq(t, n, 5, "frames deleted after the open event committed")
}

func testStreamHeads(t *testing.T, b *bundle) {
	k1, _, _, ref1 := b.callTurn(LongTTL)
	b.chunks(ref1, 1, 0, "x")
	k2, _, _, _ := b.callTurn(LongTTL)
	k3 := b.session()
	unknown := store.ActorKey{AgentUID: b.agent.UID, SessionID: uuid.NewString()}
	heads, err := b.s.StreamHeads(b.ctx, []store.ActorKey{k1, k2, k3, unknown, k1})
	noErr(t, err, "StreamHeads")
	want := map[store.ActorKey]int64{k1: 2, k2: 1}
	if len(heads) != len(want) || heads[k1] != 2 || heads[k2] != 1 {
		t.Fatalf("StreamHeads = %v, want %v", heads, want)
	}
	heads, err = b.s.StreamHeads(b.ctx, nil)
	noErr(t, err, "StreamHeads of no keys")
	wantEq(t, len(heads), 0, "heads of no keys")
}

// testStreamConcurrent races frame writers of one session — a turn
// appending chunks then committing, event appends, steers, wait
// resolutions — and checks the stream holds every frame once, by Seq,
// without a gap.
func testStreamConcurrent(t *testing.T, b *bundle) {
	const nWaits, nWriters, nEach, nChunks = 4, 3, 6, 12
	key := b.session()
	act := b.claim(key, LongTTL)
	for i := range nWaits {
		b.message(key, fmt.Sprintf("ask %d", i))
		_, err := b.commitWait(b.next(act).Delivery.TurnRef(), store.WaitParams{ID: fmt.Sprintf("w%d", i)})
		noErr(t, err, "CommitTurn with a wait")
	}
	b.message(key, "the long turn")
	d := b.next(act)
	base := b.stream(key).Head

	var wg sync.WaitGroup
	errs := make(chan error, 64)
	var mu sync.Mutex
	chunkFrames := 0
	// The turn: chunks, then the commit; a steer raises the revision, so
	// it follows the newest ref (what a controller does).
	wg.Go(func() {
		ref := d.Delivery.TurnRef()
		refresh := func() bool {
			in, err := b.s.InFlight(b.ctx, act.Ref())
			if err != nil {
				errs <- fmt.Errorf("InFlight: %w", err)
				return false
			}
			ref = in.Delivery.TurnRef()
			return true
		}
		for i := 0; i < nChunks; {
			_, err := b.s.AppendChunks(b.ctx, store.AppendChunksParams{Ref: ref, Attempt: d.Attempt, Offset: i, Chunks: textChunks(fmt.Sprint(i))})
			var fe *store.FenceError
			switch {
			case errors.As(err, &fe) && fe.Reason == store.FenceStaleRevision:
				if !refresh() {
					return
				}
				continue
			case err != nil:
				errs <- fmt.Errorf("AppendChunks: %w", err)
				return
			}
			mu.Lock()
			chunkFrames++
			mu.Unlock()
			i++
		}
		for {
			_, err := b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: ref, KeepState: true, Outcome: abi.OutcomeOK})
			var fe *store.FenceError
			if errors.As(err, &fe) && fe.Reason == store.FenceStaleRevision {
				if !refresh() {
					return
				}
				continue
			}
			if err != nil {
				errs <- fmt.Errorf("CommitTurn: %w", err)
			}
			return
		}
	})
	for w := range nWriters {
		wg.Go(func() {
			for i := range nEach {
				payload := fmt.Appendf(nil, `{"message":"m %d.%d"}`, w, i)
				if _, _, err := b.s.AppendEvent(b.ctx, store.AppendEventParams{Key: key, Kind: abi.EventMessage, Payload: payload}); err != nil {
					errs <- fmt.Errorf("AppendEvent: %w", err)
					return
				}
			}
		})
	}
	wg.Go(func() {
		for i := range nEach {
			_, err := b.s.Steer(b.ctx, store.SteerParams{Key: key, Payload: fmt.Appendf(nil, `{"message":"steer %d"}`, i), DeliveryID: uuid.NewString()})
			if err != nil {
				errs <- fmt.Errorf("steer: %w", err)
				return
			}
		}
	})
	for i := range nWaits {
		wg.Go(func() {
			if _, err := b.s.ResolveWait(b.ctx, store.ResolveWaitParams{Key: key, WaitID: fmt.Sprintf("w%d", i), Resolution: json.RawMessage(`"yes"`)}); err != nil {
				errs <- fmt.Errorf("ResolveWait: %w", err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	pg := b.stream(key)
	wantGapFree(t, key, pg)
	counts := map[string]int{}
	for _, f := range pg.Frames[base:] {
		counts[f.Kind]++
	}
	want := map[string]int{store.FrameChunk: chunkFrames, store.FrameTurnCommitted: 1, store.FrameWaitResolved: nWaits}
	if len(counts) != len(want) || counts[store.FrameChunk] != nChunks || counts[store.FrameTurnCommitted] != 1 ||
		counts[store.FrameWaitResolved] != nWaits {
		t.Fatalf("frames after the race = %v, want %v", counts, want)
	}
	wantEq(t, pg.Frames[len(pg.Frames)-1].Seq, pg.Head, "the last frame is the head")
}

func testWaitCommit(t *testing.T, b *bundle) {
	key := b.session()
	ev := b.message(key, "ask")
	act := b.claim(key, LongTTL)
	ref := b.next(act).Delivery.TurnRef()
	data := json.RawMessage(`{"question":"which colour?"}`)
	turn, err := b.commitWait(ref, store.WaitParams{ID: "colour", For: "a colour", Data: data, Timeout: time.Hour})
	noErr(t, err, "CommitTurn with a wait")
	wantEq(t, turn.Outcome, abi.OutcomeWait, "turn outcome")
	w := b.getWait(key, "colour")
	if w.ActorKey != key || w.Kind != store.WaitKindWait || w.EventID != ev.ID || w.For != "a colour" || !jsonEqual(w.Data, data) ||
		w.Status != store.WaitOpen || w.ClosedAt != nil || w.Resolution != nil || w.ExpiresAt == nil ||
		w.ExpiresAt.Sub(w.CreatedAt) != time.Hour {
		t.Fatalf("wait = %s", renderWait(w))
	}
	wantSleeping(t, b.getSession(key), store.SleepReasonWait, "session after a commit with outcome wait")
	pg := b.stream(key)
	wantGapFree(t, key, pg)
	wantEq(t, kinds(pg.Frames), "turn.started turn.committed wait.opened", "frame kinds")
	wantFrame(t, pg.Frames[2], store.FrameWaitOpened, ev.ID, act.ActorEpoch, 1)
	if got := body[store.Wait](t, pg.Frames[2]); renderWait(got) != renderWait(w) {
		t.Fatalf("wait.opened body = %s, want the wait %s", pg.Frames[2].Body, renderWait(w))
	}
	wantEq(t, body[store.TurnCommittedBody](t, pg.Frames[1]).Outcome, abi.OutcomeWait, "turn.committed outcome")

	// Another open event keeps the session active.
	key2 := b.session()
	b.message(key2, "ask")
	b.message(key2, "and more")
	act2 := b.claim(key2, LongTTL)
	_, err = b.commitWait(b.next(act2).Delivery.TurnRef(), store.WaitParams{ID: "w"})
	noErr(t, err, "CommitTurn with a wait and another event open")
	wantActive(t, b.getSession(key2), "session with another open event")
	if w := b.getWait(key2, "w"); w.ExpiresAt != nil {
		t.Fatalf("wait without a timeout = %s, want no expires_at", renderWait(w))
	}
}

func testWaitResolve(t *testing.T, b *bundle) {
	key, _, act := b.waitingSession(store.WaitParams{ID: "name", For: "your name"})
	head := b.stream(key).Head
	res := json.RawMessage(`{"name":"Ada"}`)
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	w, err := b.s.ResolveWait(b.ctx, store.ResolveWaitParams{Key: key, WaitID: "name", Resolution: res, Traceparent: tp})
	noErr(t, err, "ResolveWait")
	if w.Status != store.WaitResolved || !jsonEqual(w.Resolution, res) || w.ClosedAt == nil {
		t.Fatalf("resolved wait = %s", renderWait(w))
	}
	wantEq(t, renderWait(b.getWait(key, "name")), renderWait(w), "GetWait after ResolveWait")
	wantActive(t, b.getSession(key), "session after ResolveWait")
	evs := b.events(key)
	last := evs[len(evs)-1]
	if last.Kind != abi.EventWaitResolved || last.IdempotencyKey != "wait:name" || last.Status != store.EventOpen ||
		!jsonEqual(last.Payload, store.WaitEventPayload(w)) {
		t.Fatalf("event after ResolveWait = %+v, want an open wait.resolved event with the wait's payload", last)
	}
	var we abi.WaitEvent
	noErr(t, json.Unmarshal(last.Payload, &we), "decode the wait event")
	if we.ID != "name" || we.For != "your name" || !jsonEqual(we.Data, res) {
		t.Fatalf("wait event = %+v", we)
	}
	// Its turn joins the resolver's trace (docs/DESIGN.md "Tracing").
	wantEq(t, last.Traceparent, tp, "traceparent of the wait.resolved event")
	pg := b.stream(key)
	wantGapFree(t, key, pg)
	wantEq(t, pg.Head, head+1, "head after ResolveWait")
	f := pg.Frames[len(pg.Frames)-1]
	wantFrame(t, f, store.FrameWaitResolved, 0, 0, 0)
	wantEq(t, renderWait(body[store.Wait](t, f)), renderWait(w), "wait.resolved body")
	// The event runs next, on the live activation.
	d := b.next(act)
	wantEq(t, d.Event.ID, last.ID, "next delivery after ResolveWait")

	// A session without a live activation becomes runnable.
	key2, _, act2 := b.waitingSession(store.WaitParams{ID: "w"})
	noErr(t, b.s.StopActivation(b.ctx, act2.Ref()), "StopActivation")
	if slices.Contains(b.runnable(), key2) {
		t.Fatalf("a waiting session is runnable")
	}
	_, err = b.s.ResolveWait(b.ctx, store.ResolveWaitParams{Key: key2, WaitID: "w"})
	noErr(t, err, "ResolveWait without a resolution")
	if w := b.getWait(key2, "w"); string(w.Resolution) != "null" {
		t.Fatalf("resolution of an empty ResolveWait = %q, want null", w.Resolution)
	}
	if !slices.Contains(b.runnable(), key2) {
		t.Fatalf("session not runnable after ResolveWait")
	}
}

func testWaitResolveRefused(t *testing.T, b *bundle) {
	key, _, _ := b.waitingSession(store.WaitParams{ID: "once"})
	_, err := b.s.ResolveWait(b.ctx, store.ResolveWaitParams{Key: key, WaitID: "once", Resolution: json.RawMessage(`1`)})
	noErr(t, err, "ResolveWait")
	before := b.streamSnapshot(key)
	_, err = b.s.ResolveWait(b.ctx, store.ResolveWaitParams{Key: key, WaitID: "once", Resolution: json.RawMessage(`2`)})
	var wc *store.WaitClosedError
	if !errors.As(err, &wc) || wc.Status != store.WaitResolved || !errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrGone) {
		t.Fatalf("second ResolveWait: %v, want a *WaitClosedError (resolved, ErrConflict)", err)
	}
	b.sameStream(key, before, "a second ResolveWait")
	_, err = b.s.ResolveWait(b.ctx, store.ResolveWaitParams{Key: key, WaitID: "never"})
	wantIs(t, err, store.ErrNotFound, "ResolveWait of an unknown wait")
	_, err = b.s.GetWait(b.ctx, key, "never")
	wantIs(t, err, store.ErrNotFound, "GetWait of an unknown wait")
	_, err = b.s.ResolveWait(b.ctx, store.ResolveWaitParams{Key: store.ActorKey{AgentUID: key.AgentUID, SessionID: uuid.NewString()}, WaitID: "once"})
	wantIs(t, err, store.ErrNotFound, "ResolveWait of an unknown session")
	b.sameStream(key, before, "ResolveWait of unknown waits")

	key2, _, _ := b.waitingSession(store.WaitParams{ID: "bad"})
	before2 := b.streamSnapshot(key2)
	_, err = b.s.ResolveWait(b.ctx, store.ResolveWaitParams{Key: key2, WaitID: "bad", Resolution: json.RawMessage(`{`)})
	wantIs(t, err, store.ErrInvalid, "ResolveWait with a resolution that is not JSON")
	b.sameStream(key2, before2, "ResolveWait with an invalid resolution")
	_, err = b.s.DestroySession(b.ctx, key2)
	noErr(t, err, "DestroySession")
	before2 = b.streamSnapshot(key2)
	_, err = b.s.ResolveWait(b.ctx, store.ResolveWaitParams{Key: key2, WaitID: "bad"})
	wantIs(t, err, store.ErrSessionDestroyed, "ResolveWait in a destroyed session")
	b.sameStream(key2, before2, "ResolveWait in a destroyed session")
}

func testWaitDuplicate(t *testing.T, b *bundle) {
	key, _, act := b.waitingSession(store.WaitParams{ID: "dup"})
	_, err := b.s.ResolveWait(b.ctx, store.ResolveWaitParams{Key: key, WaitID: "dup"})
	noErr(t, err, "ResolveWait")
	d := b.next(act) // the wait.resolved event
	before := b.streamSnapshot(key)
	_, err = b.commitWait(d.Delivery.TurnRef(), store.WaitParams{ID: "dup", For: "again"})
	wantIs(t, err, store.ErrConflict, "CommitTurn reusing a wait id")
	b.sameStream(key, before, "CommitTurn reusing a wait id")
	// Nothing was written: the same ref commits with a fresh id.
	_, err = b.commitWait(d.Delivery.TurnRef(), store.WaitParams{ID: "dup2"})
	noErr(t, err, "CommitTurn with a fresh wait id")
	wantEq(t, b.getWait(key, "dup2").Status, store.WaitOpen, "the fresh wait's status")
}

func testWaitInvalid(t *testing.T, b *bundle) {
	key, _, _, ref := b.callTurn(LongTTL)
	before := b.streamSnapshot(key)
	for _, p := range []store.CommitTurnParams{
		{Ref: ref, Outcome: abi.OutcomeWait},
		{Ref: ref, Outcome: abi.OutcomeOK, Wait: &store.WaitParams{ID: "w"}},
		{Ref: ref, Outcome: abi.OutcomeWait, Wait: &store.WaitParams{}},
		{Ref: ref, Outcome: abi.OutcomeWait, Wait: &store.WaitParams{ID: "bad id"}},
		{Ref: ref, Outcome: abi.OutcomeWait, Wait: &store.WaitParams{ID: "w", Data: json.RawMessage("{")}},
		{Ref: ref, Outcome: abi.OutcomeWait, Wait: &store.WaitParams{ID: "w", Timeout: -time.Second}},
	} {
		_, err := b.s.CommitTurn(b.ctx, p)
		wantIs(t, err, store.ErrInvalid, fmt.Sprintf("CommitTurn outcome %s wait %+v", p.Outcome, p.Wait))
	}
	b.sameStream(key, before, "invalid CommitTurn waits")
}

func testWaitExpire(t *testing.T, b *bundle) {
	key, _, _ := b.waitingSession(store.WaitParams{ID: "soon", For: "a quick answer", Timeout: time.Millisecond})
	other, _, _ := b.waitingSession(store.WaitParams{ID: "later", Timeout: time.Hour})
	head := b.stream(key).Head
	b.waitUntilExpired(key)
	w := b.getWait(key, "soon")
	if w.Status != store.WaitExpired || w.ClosedAt == nil || w.Resolution != nil {
		t.Fatalf("expired wait = %s", renderWait(w))
	}
	wantEq(t, b.getWait(other, "later").Status, store.WaitOpen, "a wait not yet due")
	wantActive(t, b.getSession(key), "session after its wait expired")
	evs := b.events(key)
	last := evs[len(evs)-1]
	if last.Kind != abi.EventWaitExpired || last.IdempotencyKey != "wait:soon" || !jsonEqual(last.Payload, store.WaitEventPayload(w)) {
		t.Fatalf("event after expiry = %+v, want wait.expired with the wait's payload", last)
	}
	pg := b.stream(key)
	wantGapFree(t, key, pg)
	wantEq(t, pg.Head, head+1, "head after expiry")
	wantEq(t, body[store.Wait](t, pg.Frames[len(pg.Frames)-1]).Status, store.WaitExpired, "wait.resolved frame's status")
	// Expired is gone: resolving writes nothing; expiring again finds nothing.
	before := b.streamSnapshot(key)
	_, err := b.s.ResolveWait(b.ctx, store.ResolveWaitParams{Key: key, WaitID: "soon"})
	var wc *store.WaitClosedError
	if !errors.As(err, &wc) || !errors.Is(err, store.ErrGone) || errors.Is(err, store.ErrConflict) {
		t.Fatalf("ResolveWait of an expired wait: %v, want a *WaitClosedError (ErrGone)", err)
	}
	keys, err := b.s.ExpireDueWaits(b.ctx, 100)
	noErr(t, err, "ExpireDueWaits again")
	if slices.Contains(keys, key) {
		t.Fatalf("ExpireDueWaits expired %s twice", key)
	}
	b.sameStream(key, before, "ResolveWait of an expired wait")
}

func testWaitList(t *testing.T, b *bundle) {
	k1, _, _ := b.waitingSession(store.WaitParams{ID: "a"})
	k2, _, _ := b.waitingSession(store.WaitParams{ID: "b"})
	_, err := b.s.ResolveWait(b.ctx, store.ResolveWaitParams{Key: k1, WaitID: "a"})
	noErr(t, err, "ResolveWait")
	other := b.newAgent("other-"+uuid.NewString()[:8], b.agent.ModuleDigest, store.CrashRestart)
	ko := b.sessionOf(other.UID, store.CrashRestart)
	b.message(ko, "x")
	acto := b.claim(ko, LongTTL)
	_, err = b.commitWait(b.next(acto).Delivery.TurnRef(), store.WaitParams{ID: "o"})
	noErr(t, err, "CommitTurn with a wait")

	ids := func(ws []store.Wait) string {
		var out []string
		for _, w := range ws {
			out = append(out, w.ID)
		}
		return strings.Join(out, ",")
	}
	pg, err := b.s.ListWaits(b.ctx, store.ListWaitsParams{AgentUID: b.agent.UID})
	noErr(t, err, "ListWaits")
	wantEq(t, ids(pg.Waits), "a,b", "the agent's waits")
	pg, err = b.s.ListWaits(b.ctx, store.ListWaitsParams{AgentUID: b.agent.UID, Limit: 1})
	noErr(t, err, "ListWaits limit 1")
	wantEq(t, ids(pg.Waits), "a", "first page")
	pg, err = b.s.ListWaits(b.ctx, store.ListWaitsParams{AgentUID: b.agent.UID, Limit: 1, After: pg.NextAfter})
	noErr(t, err, "ListWaits second page")
	wantEq(t, ids(pg.Waits), "b", "second page")
	pg, err = b.s.ListWaits(b.ctx, store.ListWaitsParams{AgentUID: b.agent.UID, After: pg.NextAfter})
	noErr(t, err, "ListWaits past the end")
	wantEq(t, ids(pg.Waits), "", "past the end")
	pg, err = b.s.ListWaits(b.ctx, store.ListWaitsParams{AgentUID: b.agent.UID, Status: store.WaitOpen})
	noErr(t, err, "ListWaits open")
	wantEq(t, ids(pg.Waits), "b", "open waits")
	pg, err = b.s.ListWaits(b.ctx, store.ListWaitsParams{AgentUID: b.agent.UID, SessionID: k2.SessionID})
	noErr(t, err, "ListWaits of a session")
	wantEq(t, ids(pg.Waits), "b", "the session's waits")
	wantEq(t, renderWait(pg.Waits[0]), renderWait(b.getWait(k2, "b")), "listed wait")
}

// holdTurn is a session whose first event's attempt is held by an
// approval wait id (timeout as given); the activation is failed.
func (b *bundle) holdTurn(id string, timeout time.Duration) (store.ActorKey, store.Event, store.Activation, store.FailResult) {
	b.t.Helper()
	key := b.session()
	ev := b.message(key, "send the email")
	act := b.claim(key, LongTTL)
	ref := b.next(act).Delivery.TurnRef()
	b.chunks(ref, 1, 0, "about to send")
	fr, err := b.s.FailAttempt(b.ctx, store.FailAttemptParams{
		Ref: ref, Error: "needs approval", MaxAttempts: 3,
		Hold: &store.WaitParams{ID: id, For: "send mail", Data: json.RawMessage(`{"to":"x@example.com"}`),
			Timeout: timeout, CallSeq: 2, CallDigest: digest([]byte("send"))},
	})
	noErr(b.t, err, "FailAttempt with a hold")
	return key, ev, act, fr
}

func testApprovalHold(t *testing.T, b *bundle) {
	key, ev, act, fr := b.holdTurn("approve-1", 0)
	if fr.EventID != ev.ID || fr.Attempts != 0 || fr.DeadLettered || !fr.NextAttemptAt.Equal(store.HeldUntil) ||
		fr.SessionStatus != store.SessionSleeping {
		t.Fatalf("FailResult of a hold = %+v", fr)
	}
	held := b.event(key, ev.ID)
	if held.Status != store.EventOpen || held.Attempts != 0 || !held.NextAttemptAt.Equal(store.HeldUntil) {
		t.Fatalf("held event = %+v, want open, 0 attempts, next_attempt_at %s", held, ts(store.HeldUntil))
	}
	wantSleeping(t, b.getSession(key), store.SleepReasonApproval, "session of a held event")
	w := b.getWait(key, "approve-1")
	if w.Kind != store.WaitKindApproval || w.EventID != ev.ID || w.CallSeq != 2 || w.CallDigest != digest([]byte("send")) ||
		w.Status != store.WaitOpen || w.ExpiresAt != nil {
		t.Fatalf("approval wait = %s", renderWait(w))
	}
	pg := b.stream(key)
	wantGapFree(t, key, pg)
	wantEq(t, kinds(pg.Frames), "turn.started chunk turn.retrying wait.opened", "frame kinds")
	wantFrame(t, pg.Frames[2], store.FrameTurnRetrying, ev.ID, act.ActorEpoch, 1)
	if rb := body[store.AttemptEndedBody](t, pg.Frames[2]); rb.Reason != store.EndReasonApproval || rb.NextAttemptAt != nil {
		t.Fatalf("turn.retrying of a hold = %s, want reason approval without a due time", pg.Frames[2].Body)
	}
	wantFrame(t, pg.Frames[3], store.FrameWaitOpened, ev.ID, act.ActorEpoch, 1)

	// Held: not runnable, not delivered — also once a new message woke
	// the session (per-session order keeps it behind the held event).
	if slices.Contains(b.runnable(), key) {
		t.Fatalf("session of a held event is runnable")
	}
	later := b.message(key, "meanwhile")
	wantActive(t, b.getSession(key), "session after a new message")
	if slices.Contains(b.runnable(), key) {
		t.Fatalf("session blocked behind a held event is runnable")
	}
	act2 := b.claim(key, LongTTL)
	before := b.streamSnapshot(key)
	_, err := b.tryNext(act2, true, b.agent.ModuleDigest)
	nd := wantNoDue(t, err, "NextDelivery of a held event")
	if !nd.NextDueAt.Equal(store.HeldUntil) {
		t.Fatalf("NextDueAt = %s, want %s", ts(nd.NextDueAt), ts(store.HeldUntil))
	}
	b.sameStream(key, before, "NextDelivery of a held event")
	noErr(t, b.s.StopActivation(b.ctx, act2.Ref()), "StopActivation")

	// An approval's resolution must be a decision.
	_, err = b.s.ResolveWait(b.ctx, store.ResolveWaitParams{Key: key, WaitID: "approve-1", Resolution: json.RawMessage(`"yes"`)})
	wantIs(t, err, store.ErrInvalid, "ResolveWait of an approval with a string")
	b.sameStream(key, before, "ResolveWait of an approval with a string")
	dec := store.MustBody(store.ApprovalDecision{Approved: true})
	w, err = b.s.ResolveWait(b.ctx, store.ResolveWaitParams{Key: key, WaitID: "approve-1", Resolution: dec})
	noErr(t, err, "ResolveWait of an approval")
	if w.Status != store.WaitResolved || !jsonEqual(w.Resolution, dec) {
		t.Fatalf("resolved approval = %s", renderWait(w))
	}
	for _, e := range b.events(key) {
		if e.Kind == abi.EventWaitResolved {
			t.Fatalf("an approval appended an event: %+v", e)
		}
	}
	if !slices.Contains(b.runnable(), key) {
		t.Fatalf("session not runnable once its approval was resolved")
	}
	d := b.next(b.claim(key, LongTTL))
	if d.Event.ID != ev.ID || d.Attempt != 1 || d.Event.Attempts != 0 {
		t.Fatalf("delivery after the approval = event %d attempt %d (attempts %d), want event %d attempt 1",
			d.Event.ID, d.Attempt, d.Event.Attempts, ev.ID)
	}
	_ = later
}

func testApprovalExpire(t *testing.T, b *bundle) {
	key, ev, _, _ := b.holdTurn("approve-2", time.Millisecond)
	nEvents := len(b.events(key))
	b.waitUntilExpired(key)
	w := b.getWait(key, "approve-2")
	wantEq(t, w.Status, store.WaitExpired, "approval status after expiry")
	wantEq(t, len(b.events(key)), nEvents, "events after an approval expired (none appended)")
	wantActive(t, b.getSession(key), "session after its approval expired")
	if !slices.Contains(b.runnable(), key) {
		t.Fatalf("session not runnable once its approval expired")
	}
	d := b.next(b.claim(key, LongTTL))
	wantEq(t, d.Event.ID, ev.ID, "event delivered after the approval expired")
	wantEq(t, d.Attempt, 1, "attempt after the approval expired")
	pg := b.stream(key)
	wantGapFree(t, key, pg)
	wantEq(t, kinds(pg.Frames), "turn.started chunk turn.retrying wait.opened wait.resolved turn.started", "frame kinds")
}

func testApprovalInvalid(t *testing.T, b *bundle) {
	key, _, _, ref := b.callTurn(LongTTL)
	before := b.streamSnapshot(key)
	good := store.WaitParams{ID: "a", CallSeq: 1, CallDigest: digest([]byte("x"))}
	for _, c := range []struct {
		p    store.FailAttemptParams
		what string
	}{
		{store.FailAttemptParams{Ref: ref, Counted: true, Hold: &good}, "a counted hold"},
		{store.FailAttemptParams{Ref: ref, Hold: &store.WaitParams{ID: "a"}}, "a hold without its call"},
		{store.FailAttemptParams{Ref: ref, Hold: &store.WaitParams{ID: "", CallSeq: 1, CallDigest: "d"}}, "a hold without an id"},
	} {
		_, err := b.s.FailAttempt(b.ctx, c.p)
		wantIs(t, err, store.ErrInvalid, "FailAttempt with "+c.what)
	}
	b.sameStream(key, before, "invalid holds")
	// A stale ref's hold is fenced and writes nothing.
	bad := ref
	bad.Revision++
	_, err := b.s.FailAttempt(b.ctx, store.FailAttemptParams{Ref: bad, Hold: &good})
	wantFence(t, err, store.FenceStaleRevision, "FailAttempt with a hold and a stale revision")
	b.sameStream(key, before, "a fenced hold")
}

func testApprovalDuplicate(t *testing.T, b *bundle) {
	key, _, act := b.waitingSession(store.WaitParams{ID: "taken"})
	b.message(key, "send it")
	ref := b.next(act).Delivery.TurnRef()
	before := b.streamSnapshot(key)
	_, err := b.s.FailAttempt(b.ctx, store.FailAttemptParams{Ref: ref, Error: "needs approval",
		Hold: &store.WaitParams{ID: "taken", CallSeq: 1, CallDigest: digest([]byte("x"))}})
	wantIs(t, err, store.ErrConflict, "FailAttempt holding with a used wait id")
	b.sameStream(key, before, "a hold reusing a wait id")
	// Nothing was written: the same ref still commits.
	b.commit(ref, "sent", "")
}

func testApprovalCancel(t *testing.T, b *bundle) {
	key, ev, _, _ := b.holdTurn("approve-3", 0)
	_, err := b.s.CancelEvent(b.ctx, store.CancelEventParams{Key: key, EventID: ev.ID, Reason: "never mind"})
	noErr(t, err, "CancelEvent of a held event")
	w := b.getWait(key, "approve-3")
	if w.Status != store.WaitCancelled || w.ClosedAt == nil {
		t.Fatalf("approval of a cancelled event = %s, want cancelled", renderWait(w))
	}
	wantActive(t, b.getSession(key), "session after its held event was cancelled")
	before := b.streamSnapshot(key)
	_, err = b.s.ResolveWait(b.ctx, store.ResolveWaitParams{Key: key, WaitID: "approve-3", Resolution: store.MustBody(store.ApprovalDecision{Approved: true})})
	wantIs(t, err, store.ErrGone, "ResolveWait of a cancelled approval")
	b.sameStream(key, before, "ResolveWait of a cancelled approval")
}
