package api

import (
	"net/http"

	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/api/client"
	"github.com/paddock-dev/paddock/host/service"
)

// sendSignal accepts a signal: message (the default kind), steer, cancel
// or wake (docs/DESIGN.md "Steering and cancellation"), with 202.
func (s *Server) sendSignal(w http.ResponseWriter, r *http.Request) error {
	// Resolved (from the service's cache) before the body is read: an
	// unknown agent is a 404 whatever the body.
	if _, err := s.svc.ResolveAgent(r.Context(), r.PathValue("agent")); err != nil {
		return err
	}
	var in client.Signal
	if err := s.decode(w, r, &in); err != nil {
		return err
	}
	p := service.SignalParams{
		Kind: in.Kind, Message: in.Message, Data: in.Data, IdempotencyKey: in.IdempotencyKey,
		EventID: in.EventID, ForceAllocation: in.ForceAllocation, MidTurn: host.MidTurn(in.MidTurn),
	}
	auditAs(w, service.SignalOp(p), "")    // a steer or a cancel is audited as one
	auditWithWrite(w, http.StatusAccepted) // a message's row commits with its event
	res, err := s.svc.SignalAgent(r.Context(), r.PathValue("agent"), r.PathValue("session"), p)
	if err != nil {
		return err
	}
	return writeSignal(w, res)
}

// writeSignal answers an accepted signal with 202: a message's or steer's
// event (and, for a steer, whether it reached a turn in flight), the
// cancelled event, or a woken session's status.
func writeSignal(w http.ResponseWriter, res service.SignalResult) error {
	out := client.SignalResult{Kind: res.Kind, EventID: res.Event.ID, Seq: res.Event.Seq, Status: string(res.Event.Status),
		Created: res.Created, InFlight: res.InFlight, MidTurn: string(res.MidTurn), InterruptedEventID: res.Interrupted}
	if res.Kind == service.SignalWake {
		out.Status = string(res.Status)
	}
	return writeJSON(w, http.StatusAccepted, out)
}

// cancelEvent cancels a queued event by id, or the turn in flight.
func (s *Server) cancelEvent(w http.ResponseWriter, r *http.Request) error {
	a, x, id, err := s.sessionEvent(r)
	if err != nil {
		return err
	}
	res, err := s.svc.CancelEvent(r.Context(), a, x.ActorKey, id)
	if err != nil {
		return err
	}
	return writeSignal(w, res)
}
