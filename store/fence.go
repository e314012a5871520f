package store

import (
	"fmt"

	"github.com/paddock-dev/paddock/abi"
)

// Live reports whether s is starting, active or draining: the states the
// partial unique index allows once per actor key (docs/DESIGN.md invariant 1).
func (s ActivationState) Live() bool {
	return s == ActivationStarting || s == ActivationActive || s == ActivationDraining
}

// FenceOp says which guarded write a fence classification explains.
type FenceOp int

// Guarded writes of a turn_ref.
const (
	// FenceCommit is CommitTurn: the delivery must be sent and the lease
	// unexpired.
	FenceCommit FenceOp = iota
	// FenceFail is FailAttempt: the delivery created or sent; the lease is
	// not checked.
	FenceFail
	// FenceMarkSent is MarkDeliverySent: the delivery must be created; the
	// activation is not checked.
	FenceMarkSent
	// FencePromote is Promote and the commit of a deferred turn
	// (CommitTurnParams.Deferred): there is no delivery yet; the activation
	// must be live and idle at the ref's epoch and revision with an
	// unexpired lease, and the event still the session's candidate.
	FencePromote
)

// FenceRows are the rows a driver read, after a guarded write matched no
// row, to explain why; read in the same transaction as the write (or, for
// MarkDeliverySent, which wrote nothing, right after it).
type FenceRows struct {
	// DeliveryMatched says the delivery's guard passed (and the transaction
	// has since written the delivery): its checks are skipped and Delivery
	// is not read.
	DeliveryMatched bool
	// Delivery is the row with the ref's delivery id, looked up by id only;
	// nil when there is none.
	Delivery *Delivery
	// Activation is the row with the ref's activation uid (ActorEpoch,
	// Revision, CurrentEventID with 0 for none, State); nil when there is
	// none. Not needed for FenceMarkSent.
	Activation *Activation
	// LeaseExpired is lease_expires_at <= the database's now (docs/DESIGN.md
	// invariant 8), for FenceCommit and FencePromote.
	LeaseExpired bool
}

// ClassifyFence explains a fence refusal as a *FenceError. It decides
// nothing — the guarded write in SQL already refused — it names the reason,
// first match wins (store/storetest/README.md): no delivery
// (unknown_delivery); the delivery's key (wrong_actor_key), copied epoch
// (stale_epoch), revision (stale_revision), activation or event
// (superseded_delivery); for FenceMarkSent anything else is
// superseded_delivery; then the activation: gone, not live or another
// epoch (stale_epoch), revision (stale_revision), current event
// (superseded_delivery); then the delivery's state (superseded_delivery);
// then, for FenceCommit, the lease (expired_lease). Rows that explain
// nothing still refuse, as superseded_delivery.
func ClassifyFence(ref abi.TurnRef, op FenceOp, rows FenceRows) error {
	fe := func(r FenceReason, format string, args ...any) error {
		return &FenceError{Reason: r, Detail: fmt.Sprintf(format, args...)}
	}
	if op == FencePromote {
		return classifyPromote(ref, rows)
	}
	d := rows.Delivery
	if !rows.DeliveryMatched {
		switch {
		case d == nil:
			return fe(FenceUnknownDelivery, "delivery %s does not exist", ref.DeliveryID)
		case d.AgentUID != ref.AgentUID || d.SessionID != ref.SessionID:
			return fe(FenceWrongActorKey, "delivery %s belongs to %s, ref names %s", ref.DeliveryID, d.ActorKey, KeyOf(ref))
		case d.ActorEpoch != ref.ActorEpoch:
			return fe(FenceStaleEpoch, "delivery epoch %d, ref epoch %d", d.ActorEpoch, ref.ActorEpoch)
		case d.Revision != ref.Revision:
			return fe(FenceStaleRevision, "delivery revision %d, ref revision %d", d.Revision, ref.Revision)
		case d.ActivationUID != ref.ActivationUID:
			return fe(FenceSupersededDelivery, "delivery activation %s, ref activation %s", d.ActivationUID, ref.ActivationUID)
		case d.EventID != ref.ActorEventID:
			return fe(FenceSupersededDelivery, "delivery event %d, ref event %d", d.EventID, ref.ActorEventID)
		}
		if op == FenceMarkSent {
			return fe(FenceSupersededDelivery, "delivery %s is %s, not created", ref.DeliveryID, d.State)
		}
	}
	if err := activationFence(ref, rows.Activation, ref.ActorEventID); err != nil {
		return err
	}
	if !rows.DeliveryMatched {
		switch {
		case op == FenceCommit && d.State != DeliverySent:
			return fe(FenceSupersededDelivery, "delivery %s is %s, not sent", ref.DeliveryID, d.State)
		case op == FenceFail && d.State != DeliveryCreated && d.State != DeliverySent:
			return fe(FenceSupersededDelivery, "delivery %s is %s", ref.DeliveryID, d.State)
		}
	}
	if op == FenceCommit && rows.LeaseExpired {
		return fe(FenceExpiredLease, "activation %s lease expired", ref.ActivationUID)
	}
	// Unreachable while the guards and this order agree; refuse anyway.
	return fe(FenceSupersededDelivery, "turn_ref %s does not match", ref)
}

// classifyPromote is ClassifyFence for FencePromote: the activation (gone,
// not live or another epoch: stale_epoch; revision: stale_revision; a
// current event: superseded_delivery), the lease (expired_lease); when
// all of them pass, the event no longer was the candidate
// (superseded_delivery).
func classifyPromote(ref abi.TurnRef, rows FenceRows) error {
	// No current event: the deferred turn's is not set until it is written.
	if err := activationFence(ref, rows.Activation, 0); err != nil {
		return err
	}
	if rows.LeaseExpired {
		return &FenceError{Reason: FenceExpiredLease, Detail: fmt.Sprintf("activation %s lease expired", ref.ActivationUID)}
	}
	// The activation passes: the event is what no longer does.
	return &FenceError{Reason: FenceSupersededDelivery, Detail: fmt.Sprintf(
		"event %d is no longer the session's next (closed, preceded by a redriven event, or its agent updated)", ref.ActorEventID)}
}

// activationFence is the activation's part of a fence classification, in
// its order: gone, not live or another epoch (stale_epoch), another
// revision (stale_revision), a current event other than current
// (superseded_delivery); nil when a passes.
func activationFence(ref abi.TurnRef, a *Activation, current int64) error {
	fe := func(r FenceReason, format string, args ...any) error {
		return &FenceError{Reason: r, Detail: fmt.Sprintf(format, args...)}
	}
	switch {
	case a == nil:
		return fe(FenceStaleEpoch, "activation %s does not exist", ref.ActivationUID)
	case !a.State.Live():
		return fe(FenceStaleEpoch, "activation %s is %s", ref.ActivationUID, a.State)
	case a.ActorEpoch != ref.ActorEpoch:
		return fe(FenceStaleEpoch, "activation epoch %d, ref epoch %d", a.ActorEpoch, ref.ActorEpoch)
	case a.Revision != ref.Revision:
		return fe(FenceStaleRevision, "activation revision %d, ref revision %d", a.Revision, ref.Revision)
	case a.CurrentEventID != current:
		return fe(FenceSupersededDelivery, "activation current event %d, ref event %d", a.CurrentEventID, ref.ActorEventID)
	}
	return nil
}
