package console

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/store"
)

// deadLetters lists an agent's dead letters (?agent=, default the first
// agent), paged by event id (?after=).
func (c *Console) deadLetters(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	as, err := c.svc.ListAgents(ctx)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	var a store.Agent
	switch name := q.Get("agent"); {
	case name != "":
		if a, err = c.svc.GetAgent(ctx, name); err != nil {
			return err
		}
	case len(as) > 0:
		// No agent named: the first that has a dead letter (else the
		// first), so that the page does not say "none" while one waits.
		a = as[0]
		for _, x := range as {
			dl, err := c.svc.ListDeadLetters(ctx, x, "", service.Page{Limit: 1})
			if err != nil {
				return err
			}
			if len(dl) > 0 {
				a = x
				break
			}
		}
	}
	var after int64
	if v := q.Get("after"); v != "" {
		if after, err = strconv.ParseInt(v, 10, 64); err != nil {
			return &pageError{Status: http.StatusBadRequest, Message: fmt.Sprintf("after %q is not a number", v)}
		}
	}
	var dls []store.DeadLetter
	if a.UID != "" {
		if dls, err = c.svc.ListDeadLetters(ctx, a, "", service.Page{After: after, Limit: service.DefaultPageLimit}); err != nil {
			return err
		}
	}
	var next int64
	if len(dls) == service.DefaultPageLimit {
		next = dls[len(dls)-1].Event.ID
	}
	return c.render(w, r, http.StatusOK, "deadletters", "Dead letters", "dead-letters", struct {
		Agents      []store.Agent
		Agent       store.Agent
		DeadLetters []store.DeadLetter
		Next        int64
	}{as, a, dls, next})
}

// deadLetterAction redrives or discards dead letters of an agent: one
// (op "redrive:<session>:<event>" or "discard:…", a row's button) or the
// checked ones (op "redrive" or "discard", checkboxes "ev" of
// "<session>:<event>").
func (c *Console) deadLetterAction(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	a, err := c.svc.GetAgent(ctx, r.PathValue("agent"))
	if err != nil {
		return err
	}
	op, one, _ := strings.Cut(r.PostForm.Get("op"), ":")
	if op != "redrive" && op != "discard" {
		return &pageError{Status: http.StatusBadRequest, Message: fmt.Sprintf("op %q must be redrive or discard", op)}
	}
	targets := r.PostForm["ev"]
	if one != "" {
		targets = []string{one}
	}
	if len(targets) == 0 {
		return &pageError{Status: http.StatusBadRequest, Message: "no dead letter was selected"}
	}
	if len(targets) > service.MaxPageLimit {
		return &pageError{Status: http.StatusBadRequest, Message: fmt.Sprintf("at most %d dead letters at once", service.MaxPageLimit)}
	}
	done := 0
	var failed []string
	for _, t := range targets {
		sid, ev, ok := strings.Cut(t, ":")
		id, perr := strconv.ParseInt(ev, 10, 64)
		if !ok || perr != nil {
			return &pageError{Status: http.StatusBadRequest, Message: fmt.Sprintf("dead letter %q must be <session>:<event id>", t)}
		}
		x, err := c.svc.GetSession(ctx, a, sid)
		if err == nil {
			if op == "redrive" {
				_, err = c.svc.RedriveEvent(ctx, x, id)
			} else {
				_, err = c.svc.DiscardEvent(ctx, x, id)
			}
		}
		var nf *service.NotFoundError
		var cf *service.ConflictError
		switch {
		case err == nil:
			done++
		case errors.As(err, &nf), errors.As(err, &cf):
			failed = append(failed, fmt.Sprintf("event %d: %v", id, err))
		default:
			return err
		}
	}
	flash := fmt.Sprintf("%s: %d done", op, done)
	if len(failed) > 0 {
		flash += fmt.Sprintf(", %d refused (%s)", len(failed), strings.Join(failed, "; "))
	}
	redirect(w, r, inNS(ctx, "/ui/dead-letters?agent="+url.QueryEscape(a.Name)), flash)
	return nil
}
