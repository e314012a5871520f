package api

import (
	"errors"
	"net/http"

	"github.com/paddock-dev/paddock/host/api/client"
	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/store"
)

func toWait(a store.Agent, w store.Wait) client.Wait {
	return client.Wait{Agent: a.Name, SessionID: w.SessionID, WaitID: w.ID, Kind: w.Kind, EventID: w.EventID, For: w.For,
		Data: w.Data, Status: w.Status, CallSeq: w.CallSeq, CallDigest: w.CallDigest, Resolution: w.Resolution,
		CreatedAt: w.CreatedAt, ExpiresAt: w.ExpiresAt, ClosedAt: w.ClosedAt}
}

func (s *Server) listWaits(w http.ResponseWriter, r *http.Request, a store.Agent, sessionID string) error {
	status := r.URL.Query().Get("status")
	if _, err := service.ParseWaitStatus(status); err != nil {
		return asParam(err)
	}
	p, err := page(r)
	if err != nil {
		return err
	}
	pg, err := s.svc.ListWaits(r.Context(), a, sessionID, status, p)
	if err != nil {
		return asParam(err)
	}
	out := client.WaitList{Waits: make([]client.Wait, 0, len(pg.Waits)), NextAfter: pg.NextAfter}
	for _, x := range pg.Waits {
		out.Waits = append(out.Waits, toWait(a, x))
	}
	return writeJSON(w, http.StatusOK, out)
}

// listAgentWaits lists the waits of all the agent's sessions (?session=
// for one, ?status= for one status).
func (s *Server) listAgentWaits(w http.ResponseWriter, r *http.Request) error {
	a, err := s.svc.GetAgent(r.Context(), r.PathValue("agent"))
	if err != nil {
		return err
	}
	return s.listWaits(w, r, a, r.URL.Query().Get("session"))
}

func (s *Server) listSessionWaits(w http.ResponseWriter, r *http.Request) error {
	a, x, err := s.session(r)
	if err != nil {
		return err
	}
	return s.listWaits(w, r, a, x.SessionID)
}

func (s *Server) getWait(w http.ResponseWriter, r *http.Request) error {
	a, x, err := s.session(r)
	if err != nil {
		return err
	}
	wt, err := s.svc.GetWait(r.Context(), x, r.PathValue("wait"))
	if err != nil {
		return asParam(err)
	}
	return writeJSON(w, http.StatusOK, toWait(a, wt))
}

// resolveWait resolves an open wait: {"data": …} for a wait of kind wait,
// {"approved": bool, "reason": "…"} for an approval; 200 with the wait.
func (s *Server) resolveWait(w http.ResponseWriter, r *http.Request) error {
	a, x, err := s.session(r)
	if err != nil {
		return err
	}
	wt, err := s.svc.GetWait(r.Context(), x, r.PathValue("wait"))
	if err != nil {
		return asParam(err) // a malformed or unknown wait, before the body
	}
	var in client.ResolveWaitRequest
	if err := s.decode(w, r, &in); err != nil {
		return err
	}
	wt, err = s.svc.ResolveWait(r.Context(), x, wt, service.Resolution{Data: in.Data, Approved: in.Approved, Reason: in.Reason})
	var tooLarge *service.TooLargeError
	switch {
	case errors.As(err, &tooLarge):
		return &Error{Status: http.StatusRequestEntityTooLarge, Code: "resolution_too_large", Field: tooLarge.Field, Message: tooLarge.Message}
	case errors.Is(err, store.ErrSessionDestroyed):
		return &Error{Status: http.StatusGone, Code: "session_destroyed", Field: "session", Message: "the session is destroyed: its waits were cancelled"}
	case err != nil:
		return err
	}
	return writeJSON(w, http.StatusOK, toWait(a, wt))
}
