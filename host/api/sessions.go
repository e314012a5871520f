package api

import (
	"errors"
	"net/http"

	"github.com/paddock-dev/paddock/host/api/client"
	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/store"
)

func toSession(a store.Agent, x store.Session) client.Session {
	return client.Session{
		Agent: a.Name, AgentUID: x.AgentUID, SessionID: x.SessionID, Key: x.Key, Input: x.Input, Status: x.Status,
		CrashPolicy: x.CrashPolicy, ActorEpoch: x.ActorEpoch, TurnCount: x.TurnCount, EventCount: x.EventCount,
		OpenEvents: x.OpenEvents, CreatedAt: x.CreatedAt, SleepTS: x.SleepTS, DestroyTS: x.DestroyTS,
		SleepReason: x.SleepReason, DeadLetters: x.DeadLetters, PendingSince: x.PendingSince,
	}
}

func (s *Server) createSession(w http.ResponseWriter, r *http.Request) error {
	return s.putSession(w, r, false)
}

func (s *Server) getOrCreateSession(w http.ResponseWriter, r *http.Request) error {
	return s.putSession(w, r, true)
}

func (s *Server) putSession(w http.ResponseWriter, r *http.Request, getOrCreate bool) error {
	a, err := s.svc.GetAgent(r.Context(), r.PathValue("agent"))
	if err != nil {
		return err
	}
	var in client.SessionRequest
	if err := s.decode(w, r, &in); err != nil {
		return err
	}
	p := service.SessionParams{Key: in.Key, Input: in.Input, CrashPolicy: in.CrashPolicy}
	var x store.Session
	created := true
	if getOrCreate {
		x, created, err = s.svc.GetOrCreateSession(r.Context(), a, p)
	} else {
		x, err = s.svc.CreateSession(r.Context(), a, p)
	}
	if err != nil {
		err = hint(err, "missing_field", " (PUT /v1/agents/{agent}/sessions)")
		if e := asError(err); e != nil && e.Field == "key" {
			err = hint(err, "session_exists", " (get-or-create: PUT, or paddock session create --get-or-create)")
		}
		return err
	}
	out := toSession(a, x)
	out.Created = &created
	w.Header().Set("Location", "/v1/agents/"+a.Name+"/sessions/"+x.SessionID)
	return writeJSON(w, createdOr200(created), out)
}

// session resolves the {agent} and {session} path values.
func (s *Server) session(r *http.Request) (store.Agent, store.Session, error) {
	a, err := s.svc.GetAgent(r.Context(), r.PathValue("agent"))
	if err != nil {
		return a, store.Session{}, err
	}
	x, err := s.svc.GetSession(r.Context(), a, r.PathValue("session"))
	return a, x, err
}

func (s *Server) getSession(w http.ResponseWriter, r *http.Request) error {
	a, x, err := s.session(r)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, toSession(a, x))
}

// sessionByKey returns the agent's session of a key that is not
// destroyed, without creating one (service.SessionByKey); none: 404
// session_not_found.
func (s *Server) sessionByKey(w http.ResponseWriter, r *http.Request) error {
	a, err := s.svc.GetAgent(r.Context(), r.PathValue("agent"))
	if err != nil {
		return err
	}
	x, err := s.svc.SessionByKey(r.Context(), a, r.PathValue("key"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, toSession(a, x))
}

func (s *Server) listSessions(w http.ResponseWriter, r *http.Request) error {
	a, err := s.svc.GetAgent(r.Context(), r.PathValue("agent"))
	if err != nil {
		return err
	}
	limit, err := intParam(r, "limit", service.DefaultSessionLimit, 1, service.MaxSessionLimit)
	if err != nil {
		return err
	}
	xs, next, err := s.svc.ListSessions(r.Context(), a, r.URL.Query().Get("cursor"), limit)
	if err != nil {
		return asParam(err)
	}
	out := client.SessionPage{Sessions: make([]client.Session, 0, len(xs)), NextCursor: next}
	for _, x := range xs {
		out.Sessions = append(out.Sessions, toSession(a, x))
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) destroySession(w http.ResponseWriter, r *http.Request) error {
	a, x, err := s.session(r)
	if err != nil {
		return err
	}
	x, err = s.svc.DestroySession(r.Context(), x)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, toSession(a, x))
}

// browseSessions pages the sessions of every agent (or ?agent=) by agent
// uid and session id, filtered by ?status= (active, sleeping, pending,
// destroyed), ?sleep_reason= (with sleeping), ?key= (exact) and ?q= (text
// in the id or key): service.BrowseSessions, one store query; a text
// filter reads at most service.MaxBrowseScan sessions per page (partial:
// the page is short, go on from next_cursor).
func (s *Server) browseSessions(w http.ResponseWriter, r *http.Request) error {
	limit, err := intParam(r, "limit", service.DefaultSessionLimit, 1, service.MaxSessionLimit)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	page, err := s.svc.BrowseSessions(r.Context(), service.SessionFilter{
		Agent: q.Get("agent"), Status: q.Get("status"), SleepReason: q.Get("sleep_reason"), Key: q.Get("key"), Text: q.Get("q"), After: q.Get("cursor"), Limit: limit,
	})
	var inv *service.InvalidError
	if errors.As(err, &inv) && inv.Field == "after" {
		inv.Field = "cursor" // SessionFilter.After is this route's ?cursor=
	}
	if err != nil {
		return asParam(err)
	}
	out := client.SessionBrowse{Sessions: make([]client.Session, 0, len(page.Sessions)), NextCursor: page.Next, Scanned: page.Scanned, Partial: page.Partial}
	for _, x := range page.Sessions {
		out.Sessions = append(out.Sessions, toSession(store.Agent{Name: x.Agent}, x.Session))
	}
	return writeJSON(w, http.StatusOK, out)
}
