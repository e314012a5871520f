package api

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/host/api/client"
	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/store"
)

func toEvent(e store.Event) client.Event {
	return client.Event{ID: e.ID, Seq: e.Seq, Kind: e.Kind, Payload: e.Payload, IdempotencyKey: e.IdempotencyKey,
		Status: e.Status, Attempts: e.Attempts, NextAttemptAt: e.NextAttemptAt, LastError: e.LastError,
		Binding: e.Binding, AcceptedAt: e.AcceptedAt, ClosedAt: e.ClosedAt, SteerOf: e.SteerOf, Redrives: e.Redrives}
}

// page parses ?after= and ?limit= of an event, dead-letter or transcript
// page.
func page(r *http.Request) (service.Page, error) {
	limit, err := intParam(r, "limit", service.DefaultPageLimit, 1, service.MaxPageLimit)
	if err != nil {
		return service.Page{}, err
	}
	after, err := intParam(r, "after", 0, 0, int(^uint(0)>>1))
	return service.Page{After: int64(after), Limit: limit}, err
}

func (s *Server) listEvents(w http.ResponseWriter, r *http.Request) error {
	_, x, err := s.session(r)
	if err != nil {
		return err
	}
	status := r.URL.Query().Get("status")
	if _, err := service.ParseEventStatus(status); err != nil {
		return asParam(err)
	}
	p, err := page(r)
	if err != nil {
		return err
	}
	es, err := s.svc.ListEvents(r.Context(), x, status, p)
	if err != nil {
		return asParam(err)
	}
	out := client.EventList{Events: make([]client.Event, 0, len(es))}
	for _, e := range es {
		out.Events = append(out.Events, toEvent(e))
	}
	return writeJSON(w, http.StatusOK, out)
}

// sessionEvent resolves the {agent} and {session} path values and parses
// {event}.
func (s *Server) sessionEvent(r *http.Request) (store.Agent, store.Session, int64, error) {
	a, x, err := s.session(r)
	if err != nil {
		return a, x, 0, err
	}
	id, err := eventParam(r)
	return a, x, id, err
}

func (s *Server) getEvent(w http.ResponseWriter, r *http.Request) error {
	_, x, id, err := s.sessionEvent(r)
	if err != nil {
		return err
	}
	var results bool
	switch v := r.URL.Query().Get("include"); v {
	case "":
	case "results":
		results = true
	default:
		return badRequest("invalid_parameter", "include", "include=%q: the only value is \"results\"", v)
	}
	e, chain, err := s.svc.GetEvent(r.Context(), x, id)
	if err != nil {
		return err
	}
	journal, err := s.svc.EventCalls(r.Context(), x, id)
	if err != nil {
		return err
	}
	out := toEvent(e)
	out.Errors = chain
	for _, c := range journal {
		out.Calls = append(out.Calls, toHostCall(c, results))
	}
	return writeJSON(w, http.StatusOK, out)
}

// toHostCall is the wire form of journal row c, with its recorded result
// when results is set (a result never holds a secret's value: the host
// scrubs it and never records a filled request).
func toHostCall(c store.HostCall, results bool) client.HostCall {
	out := client.HostCall{Seq: c.Seq, Kind: c.Kind, Destination: c.Destination, RequestDigest: c.RequestDigest,
		ErrorCode: c.ErrorCode, Status: c.Status, StartedAt: c.StartedAt, DurationMS: c.DurationMS,
		InputTokens: c.InputTokens, OutputTokens: c.OutputTokens, ActorEpoch: c.ActorEpoch,
		Replays: c.Replays, ReplayedEpoch: c.ReplayedEpoch, SetAside: c.SetAside}
	if c.ErrorCode != "" {
		var res abi.CallResult
		if json.Unmarshal(c.Result, &res) == nil && res.Error != nil {
			out.ErrorReason, out.ErrorMessage = res.Error.Reason, res.Error.Message
		}
	}
	if results && len(c.Result) > 0 {
		if json.Valid(c.Result) {
			out.Result = json.RawMessage(c.Result)
		} else {
			// Not written by the host; sent as a (lossy) string rather
			// than breaking the answer.
			out.Result, _ = json.Marshal(string(c.Result))
		}
	}
	return out
}

// deadLetterOp redrives or discards a dead-lettered event.
func (s *Server) deadLetterOp(w http.ResponseWriter, r *http.Request, op func(*service.Service, context.Context, store.Session, int64) (store.Event, error)) error {
	_, x, id, err := s.sessionEvent(r)
	if err != nil {
		return err
	}
	e, err := op(s.svc, r.Context(), x, id)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, toEvent(e))
}

func (s *Server) redriveEvent(w http.ResponseWriter, r *http.Request) error {
	return s.deadLetterOp(w, r, (*service.Service).RedriveEvent)
}

func (s *Server) discardEvent(w http.ResponseWriter, r *http.Request) error {
	return s.deadLetterOp(w, r, (*service.Service).DiscardEvent)
}

func (s *Server) listDeadLetters(w http.ResponseWriter, r *http.Request, a store.Agent, sessionID string) error {
	p, err := page(r)
	if err != nil {
		return err
	}
	dls, err := s.svc.ListDeadLetters(r.Context(), a, sessionID, p)
	if err != nil {
		return asParam(err)
	}
	out := client.DeadLetterList{DeadLetters: make([]client.DeadLetter, 0, len(dls))}
	for _, d := range dls {
		ev := toEvent(d.Event)
		ev.Errors = d.Errors
		out.DeadLetters = append(out.DeadLetters, client.DeadLetter{SessionID: d.Event.SessionID, Event: ev})
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) listAgentDeadLetters(w http.ResponseWriter, r *http.Request) error {
	a, err := s.svc.GetAgent(r.Context(), r.PathValue("agent"))
	if err != nil {
		return err
	}
	return s.listDeadLetters(w, r, a, r.URL.Query().Get("session"))
}

func (s *Server) listSessionDeadLetters(w http.ResponseWriter, r *http.Request) error {
	a, x, err := s.session(r)
	if err != nil {
		return err
	}
	return s.listDeadLetters(w, r, a, x.SessionID)
}

func (s *Server) listAlarms(w http.ResponseWriter, r *http.Request) error {
	_, x, err := s.session(r)
	if err != nil {
		return err
	}
	as, err := s.svc.ListAlarms(r.Context(), x)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, client.AlarmList{Alarms: as})
}
