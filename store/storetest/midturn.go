package storetest

import (
	"errors"
	"testing"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

func midTurnCases() []testCase {
	return []testCase{
		{"MidTurn/RefuseIfInFlightRefusesWhileATurnIsInFlightAndWritesNothing", testRefuseInFlight},
		{"MidTurn/RefuseIfInFlightAcceptsAnIdleActivationOrNone", testRefuseIdle},
	}
}

// appendRefusing appends a message with RefuseIfInFlight.
func (b *bundle) appendRefusing(key store.ActorKey, text, idem string) (store.Event, bool, error) {
	return b.s.AppendEvent(b.ctx, store.AppendEventParams{Key: key, Kind: abi.EventMessage,
		Payload: msgPayload(text), IdempotencyKey: idem, RefuseIfInFlight: true})
}

func testRefuseInFlight(t *testing.T, b *bundle) {
	key := b.session()
	first := b.message(key, "a long turn")
	// Accepted before the turn starts, with a key re-sent below.
	early, created, err := b.appendRefusing(key, "queued early", "early-1")
	noErr(t, err, "AppendEvent RefuseIfInFlight with nothing in flight")
	wantEq(t, created, true, "early Created")
	act := b.claim(key, LongTTL)
	d := b.next(act)
	wantEq(t, d.Event.ID, first.ID, "the turn in flight")

	before := b.snapshot(key)
	_, _, err = b.appendRefusing(key, "MUST NOT BE WRITTEN", "")
	wantIs(t, err, store.ErrConflict, "AppendEvent RefuseIfInFlight while a turn is in flight")
	var tif *store.TurnInFlightError
	if !errors.As(err, &tif) {
		t.Fatalf("AppendEvent RefuseIfInFlight: error = %T %v, want *store.TurnInFlightError", err, err)
	}
	wantEq(t, tif.EventID, first.ID, "TurnInFlightError.EventID")
	_, _, err = b.appendRefusing(key, "MUST NOT BE WRITTEN", "new-key")
	wantIs(t, err, store.ErrConflict, "AppendEvent RefuseIfInFlight with a new key")
	b.sameSnapshot(key, before, "refused appends")

	// A re-send of an accepted key returns the first event, even now.
	again, created, err := b.appendRefusing(key, "queued early", "early-1")
	noErr(t, err, "re-send of an accepted key while a turn is in flight")
	wantEq(t, created, false, "re-send Created")
	wantEq(t, again.ID, early.ID, "re-send returns the first event")
	b.sameSnapshot(key, before, "idempotent re-send")

	// Without the flag the message is queued as ever.
	_, created, err = b.s.AppendEvent(b.ctx, store.AppendEventParams{Key: key, Kind: abi.EventMessage, Payload: msgPayload("queued")})
	noErr(t, err, "AppendEvent without RefuseIfInFlight")
	wantEq(t, created, true, "queued Created")

	// After the turn commits nothing is in flight: accepted again.
	b.commit(d.Delivery.TurnRef(), "done", "")
	_, created, err = b.appendRefusing(key, "after the turn", "")
	noErr(t, err, "AppendEvent RefuseIfInFlight after the turn")
	wantEq(t, created, true, "after Created")
}

func testRefuseIdle(t *testing.T, b *bundle) {
	key := b.session()
	// No activation at all.
	_, created, err := b.appendRefusing(key, "no activation", "")
	noErr(t, err, "AppendEvent RefuseIfInFlight without an activation")
	wantEq(t, created, true, "Created without an activation")
	// A live activation with no current event.
	act := b.claim(key, LongTTL)
	d := b.next(act)
	b.commit(d.Delivery.TurnRef(), "ok", "")
	_, created, err = b.appendRefusing(key, "idle activation", "")
	noErr(t, err, "AppendEvent RefuseIfInFlight with an idle activation")
	wantEq(t, created, true, "Created with an idle activation")
	// Unknown session: ErrNotFound, as without the flag.
	_, _, err = b.appendRefusing(store.ActorKey{AgentUID: key.AgentUID, SessionID: "no-such-session"}, "x", "")
	wantIs(t, err, store.ErrNotFound, "AppendEvent RefuseIfInFlight on an unknown session")
}
