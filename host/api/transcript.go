package api

import (
	"errors"
	"net/http"
	"time"

	"github.com/paddock-dev/paddock/host/api/client"
	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/store"
)

// transcript pages committed turns after ?after=N. With ?wait=<duration>
// (at most 60s) it long-polls until a turn past N commits; a wait on a
// destroyed session (or one destroyed meanwhile) ends at once with 410.
func (s *Server) transcript(w http.ResponseWriter, r *http.Request) error {
	_, x, err := s.session(r)
	if err != nil {
		return err
	}
	p, err := page(r)
	if err != nil {
		return err
	}
	var wait time.Duration
	if v := r.URL.Query().Get("wait"); v != "" {
		wait, err = time.ParseDuration(v)
		if err != nil || wait < 0 || wait > service.MaxTranscriptWait {
			return badRequest("invalid_parameter", "wait", "wait=%q must be a duration between 0s and 60s", v)
		}
	}
	turns, next, err := s.svc.Transcript(r.Context(), x, p, wait)
	if errors.Is(err, store.ErrSessionDestroyed) {
		return &Error{Status: http.StatusGone, Code: "session_destroyed",
			Message: "the session is destroyed: it commits no more turns (its transcript stays readable without wait)"}
	}
	if err != nil {
		return asParam(err)
	}
	return writeJSON(w, http.StatusOK, client.TranscriptPage{Turns: turns, NextAfter: next})
}
