package api

import (
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
