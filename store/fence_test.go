package store

import (
	"errors"
	"testing"

	"github.com/paddock-dev/paddock/abi"
)

func TestClassifyFence(t *testing.T) {
	ref := abi.TurnRef{DeliveryID: "d", ActivationUID: "a", ActorEpoch: 3, ActorEventID: 7, Revision: 1,
		AgentUID: "ag", SessionID: "s"}
	del := func(mod func(*Delivery)) *Delivery {
		d := Delivery{ID: "d", ActorKey: KeyOf(ref), ActivationUID: "a", ActorEpoch: 3, EventID: 7, Revision: 1, State: DeliverySent}
		if mod != nil {
			mod(&d)
		}
		return &d
	}
	act := func(mod func(*Activation)) *Activation {
		a := Activation{UID: "a", ActorKey: KeyOf(ref), ActorEpoch: 3, Revision: 1, CurrentEventID: 7, State: ActivationActive}
		if mod != nil {
			mod(&a)
		}
		return &a
	}
	cases := []struct {
		name string
		op   FenceOp
		rows FenceRows
		want FenceReason
	}{
		{"no delivery", FenceCommit, FenceRows{}, FenceUnknownDelivery},
		// FencePromote: no delivery yet; the activation idle, then the lease,
		// then the event.
		{"promote: no activation", FencePromote, FenceRows{}, FenceStaleEpoch},
		{"promote: another epoch before a lapsed lease", FencePromote, FenceRows{Activation: act(func(a *Activation) { a.ActorEpoch, a.CurrentEventID = 4, 0 }), LeaseExpired: true}, FenceStaleEpoch},
		{"promote: revision", FencePromote, FenceRows{Activation: act(func(a *Activation) { a.Revision, a.CurrentEventID = 2, 0 })}, FenceStaleRevision},
		{"promote: a current event", FencePromote, FenceRows{Activation: act(nil)}, FenceSupersededDelivery},
		{"promote: lease", FencePromote, FenceRows{Activation: act(func(a *Activation) { a.CurrentEventID = 0 }), LeaseExpired: true}, FenceExpiredLease},
		{"promote: the activation passes, the event does not", FencePromote, FenceRows{Activation: act(func(a *Activation) { a.CurrentEventID = 0 })}, FenceSupersededDelivery},
		{"other key", FenceCommit, FenceRows{Delivery: del(func(d *Delivery) { d.SessionID = "x" }), Activation: act(nil)}, FenceWrongActorKey},
		{"delivery epoch before its revision", FenceCommit, FenceRows{Delivery: del(func(d *Delivery) { d.ActorEpoch, d.Revision = 2, 0 }), Activation: act(nil)}, FenceStaleEpoch},
		{"delivery revision", FenceCommit, FenceRows{Delivery: del(func(d *Delivery) { d.Revision = 2 }), Activation: act(nil)}, FenceStaleRevision},
		{"delivery event", FenceFail, FenceRows{Delivery: del(func(d *Delivery) { d.EventID = 8 }), Activation: act(nil)}, FenceSupersededDelivery},
		{"mark sent stops at the delivery", FenceMarkSent, FenceRows{Delivery: del(nil)}, FenceSupersededDelivery},
		{"no activation", FenceCommit, FenceRows{Delivery: del(nil)}, FenceStaleEpoch},
		{"failed activation before the delivery state", FenceCommit, FenceRows{Delivery: del(func(d *Delivery) { d.State = DeliverySuperseded }), Activation: act(func(a *Activation) { a.State = ActivationFailed })}, FenceStaleEpoch},
		{"activation revision", FenceCommit, FenceRows{Delivery: del(nil), Activation: act(func(a *Activation) { a.Revision = 2 })}, FenceStaleRevision},
		{"no current event", FenceCommit, FenceRows{Delivery: del(nil), Activation: act(func(a *Activation) { a.CurrentEventID = 0 })}, FenceSupersededDelivery},
		{"commit of a created delivery", FenceCommit, FenceRows{Delivery: del(func(d *Delivery) { d.State = DeliveryCreated }), Activation: act(nil)}, FenceSupersededDelivery},
		{"fail of a created delivery with an expired lease", FenceFail, FenceRows{Delivery: del(func(d *Delivery) { d.State = DeliveryCreated }), Activation: act(nil), LeaseExpired: true}, FenceSupersededDelivery},
		{"expired lease", FenceCommit, FenceRows{Delivery: del(nil), Activation: act(nil), LeaseExpired: true}, FenceExpiredLease},
		{"delivery matched, activation stale", FenceCommit, FenceRows{DeliveryMatched: true, Activation: act(func(a *Activation) { a.ActorEpoch = 4 })}, FenceStaleEpoch},
		{"delivery matched, lease expired", FenceCommit, FenceRows{DeliveryMatched: true, Activation: act(nil), LeaseExpired: true}, FenceExpiredLease},
	}
	for _, c := range cases {
		err := ClassifyFence(ref, c.op, c.rows)
		var fe *FenceError
		if !errors.As(err, &fe) || !errors.Is(err, ErrFence) {
			t.Errorf("%s: %v is not a *FenceError", c.name, err)
			continue
		}
		if fe.Reason != c.want {
			t.Errorf("%s: reason %s (%s), want %s", c.name, fe.Reason, fe.Detail, c.want)
		}
	}
}
