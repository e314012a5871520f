package api

import (
	"net/http"
	"time"

	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/store"
)

type sessionJSON struct {
	Agent       string              `json:"agent"`
	AgentUID    string              `json:"agent_uid"`
	SessionID   string              `json:"session_id"`
	Key         string              `json:"key,omitempty"`
	Input       []byte              `json:"input,omitempty"`
	Status      store.SessionStatus `json:"status"`
	CrashPolicy store.CrashPolicy   `json:"crash_policy"`
	ActorEpoch  int64               `json:"actor_epoch"`
	TurnCount   int64               `json:"turn_count"`
	EventCount  int64               `json:"event_count"`
	OpenEvents  int64               `json:"open_events"`
	CreatedAt   time.Time           `json:"created_at"`
	SleepTS     *time.Time          `json:"sleep_ts,omitempty"`
	DestroyTS   *time.Time          `json:"destroy_ts,omitempty"`
	// SleepReason: crash, capacity, pending_timeout or agent.
	SleepReason  string     `json:"sleep_reason,omitempty"`
	DeadLetters  int64      `json:"dead_letters"`
	PendingSince *time.Time `json:"pending_since,omitempty"`
	Created      *bool      `json:"created,omitempty"`
}

func toSessionJSON(a store.Agent, x store.Session) sessionJSON {
	return sessionJSON{
		Agent: a.Name, AgentUID: x.AgentUID, SessionID: x.SessionID, Key: x.Key, Input: x.Input, Status: x.Status,
		CrashPolicy: x.CrashPolicy, ActorEpoch: x.ActorEpoch, TurnCount: x.TurnCount, EventCount: x.EventCount,
		OpenEvents: x.OpenEvents, CreatedAt: x.CreatedAt, SleepTS: x.SleepTS, DestroyTS: x.DestroyTS,
		SleepReason: x.SleepReason, DeadLetters: x.DeadLetters, PendingSince: x.PendingSince,
	}
}

type sessionIn struct {
	Key         string `json:"key"`
	Input       []byte `json:"input"` // base64 in JSON
	CrashPolicy string `json:"crash_policy"`
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
	var in sessionIn
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
		return err
	}
	out := toSessionJSON(a, x)
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
	return writeJSON(w, http.StatusOK, toSessionJSON(a, x))
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
	out := make([]sessionJSON, 0, len(xs))
	for _, x := range xs {
		out = append(out, toSessionJSON(a, x))
	}
	resp := map[string]any{"sessions": out}
	if next != "" {
		resp["next_cursor"] = next
	}
	return writeJSON(w, http.StatusOK, resp)
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
	return writeJSON(w, http.StatusOK, toSessionJSON(a, x))
}
