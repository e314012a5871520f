package api

import (
	"encoding/json"
	"net/http"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/host/service"
)

// sendSignal accepts a signal: message (the default kind), steer, cancel
// or wake (DESIGN "Steering and cancellation"), with 202.
func (s *Server) sendSignal(w http.ResponseWriter, r *http.Request) error {
	a, err := s.svc.GetAgent(r.Context(), r.PathValue("agent"))
	if err != nil {
		return err
	}
	var in struct {
		Kind           string          `json:"kind"`
		Message        string          `json:"message"`
		Data           json.RawMessage `json:"data"`
		IdempotencyKey string          `json:"idempotency_key"`
		// EventID names the event a cancel aims at (0: the one in flight).
		EventID int64 `json:"event_id"`
		// ForceAllocation: a sleep-policy session waits for capacity
		// instead of sleeping at once when its pool is full.
		ForceAllocation bool `json:"force_allocation"`
	}
	if err := s.decode(w, r, &in); err != nil {
		return err
	}
	res, err := s.svc.Signal(r.Context(), a, r.PathValue("session"), service.SignalParams{
		Kind: in.Kind, Message: in.Message, Data: in.Data, IdempotencyKey: in.IdempotencyKey,
		EventID: in.EventID, ForceAllocation: in.ForceAllocation,
	})
	if err != nil {
		return err
	}
	return writeSignal(w, res)
}

// writeSignal answers an accepted signal with 202: a message's or steer's
// event (and, for a steer, whether it reached a turn in flight), the
// cancelled event, or a woken session's status.
func writeSignal(w http.ResponseWriter, res service.SignalResult) error {
	var out map[string]any
	switch res.Kind {
	case service.SignalCancel:
		out = map[string]any{"kind": res.Kind, "event_id": res.Event.ID, "status": res.Event.Status, "in_flight": res.InFlight}
	case service.SignalWake:
		out = map[string]any{"kind": res.Kind, "status": res.Status}
	default:
		out = map[string]any{"kind": res.Kind, "event_id": res.Event.ID, "seq": res.Event.Seq, "status": res.Event.Status, "created": res.Created}
		if res.Kind == abi.EventSteer {
			out["in_flight"] = res.InFlight
		}
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
