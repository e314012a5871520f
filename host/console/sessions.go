package console

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/store"
)

// Pages of a session's lists on its page.
const (
	// transcriptTurns is how many of the last turns the session page shows.
	transcriptTurns = 50
	// eventsPage is how many events the session page shows per page.
	eventsPage = 50
)

// statusOptions are the status filter's choices: a status, or sleeping
// with a reason ("sleeping:<reason>").
var statusOptions = []string{
	string(store.SessionActive), string(store.SessionSleeping),
	"sleeping:" + store.SleepReasonCrash, "sleeping:" + store.SleepReasonCapacity, "sleeping:" + store.SleepReasonPendingTimeout,
	"sleeping:" + store.SleepReasonAgent, "sleeping:" + store.SleepReasonFinish, "sleeping:" + store.SleepReasonWait,
	"sleeping:" + store.SleepReasonApproval, service.FilterPending, string(store.SessionDestroyed),
}

// sessions lists sessions, filtered and paged (service.BrowseSessions).
func (c *Console) sessions(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	f := service.SessionFilter{Agent: q.Get("agent"), Status: q.Get("status"), SleepReason: q.Get("reason"), Key: q.Get("key"),
		Text: q.Get("q"), After: q.Get("after")}
	// "sleeping:<reason>" is the status select's way to name a reason.
	if st, reason, ok := strings.Cut(f.Status, ":"); ok && st == string(store.SessionSleeping) {
		f.Status, f.SleepReason = st, reason
	}
	if n := q.Get("limit"); n != "" {
		v, err := strconv.Atoi(n)
		if err != nil {
			return &pageError{Status: http.StatusBadRequest, Message: fmt.Sprintf("limit %q is not a number", n)}
		}
		f.Limit = v
	}
	page, err := c.svc.BrowseSessions(r.Context(), f)
	if err != nil {
		return err
	}
	agents, err := c.svc.ListAgents(r.Context())
	if err != nil {
		return err
	}
	// The pager's links keep the filters and the page size.
	v := url.Values{}
	for k, val := range map[string]string{"agent": f.Agent, "status": f.Status, "reason": f.SleepReason, "key": f.Key, "q": f.Text, "limit": q.Get("limit")} {
		if val != "" {
			v.Set(k, val)
		}
	}
	selected := f.Status
	if f.SleepReason != "" {
		selected += ":" + f.SleepReason
	}
	v.Set(NamespaceParam, service.NamespaceOf(r.Context()))
	first := "/ui/sessions?" + v.Encode()
	next := ""
	if page.Next != "" {
		v.Set("after", page.Next)
		next = "/ui/sessions?" + v.Encode()
	}
	return c.render(w, r, http.StatusOK, "sessions", "Sessions", "sessions", struct {
		Filter          service.SessionFilter
		Page            service.SessionBrowse
		Agents          []store.Agent
		Statuses        []string
		First, NextPage string
		Selected        string
	}{f, page, agents, statusOptions, first, next, selected})
}

// lookup resolves the agent and session a route names.
func (c *Console) lookup(r *http.Request) (store.Agent, store.Session, error) {
	a, err := c.svc.GetAgent(r.Context(), r.PathValue("agent"))
	if err != nil {
		return a, store.Session{}, err
	}
	x, err := c.svc.GetSession(r.Context(), a, r.PathValue("session"))
	return a, x, err
}

// stateView is a session state as the page shows it.
type stateView struct {
	// None: no state was committed yet.
	None bool
	Size int
	// JSON is the state pretty-printed when it is JSON; Hex otherwise.
	JSON, Hex string
}

func viewState(b []byte) stateView {
	if b == nil {
		return stateView{None: true}
	}
	v := stateView{Size: len(b)}
	var out bytes.Buffer
	if len(b) > 0 && json.Valid(b) && json.Indent(&out, b, "", "  ") == nil {
		v.JSON = out.String()
		return v
	}
	const max = 4096
	if len(b) > max {
		v.Hex = hex.Dump(b[:max]) + fmt.Sprintf("… (%d more bytes)", len(b)-max)
	} else {
		v.Hex = hex.Dump(b)
	}
	return v
}

// session is a session's page: status, transcript (live through
// assets/live.js), events, alarms, waits, state and the actions.
func (c *Console) session(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	a, x, err := c.lookup(r)
	if err != nil {
		return err
	}
	// The stream head is read before the transcript: live.js follows the
	// stream after it and drops the turns the page already shows.
	head, err := c.svc.StreamHead(ctx, x)
	if err != nil {
		return err
	}
	// The last turns, or (?turns_after=) an older page, which is not live.
	turnsAfter, older := max(0, x.TurnCount-transcriptTurns), false
	if v := r.URL.Query().Get("turns_after"); v != "" {
		if turnsAfter, err = strconv.ParseInt(v, 10, 64); err != nil || turnsAfter < 0 {
			return &pageError{Status: http.StatusBadRequest, Message: fmt.Sprintf("turns_after %q is not a turn number", v)}
		}
		older = turnsAfter+transcriptTurns < x.TurnCount
	}
	turns, _, err := c.svc.Transcript(ctx, x, service.Page{After: turnsAfter, Limit: transcriptTurns}, 0)
	if err != nil {
		return err
	}
	shortenMessages(turns)
	var evAfter int64
	if v := r.URL.Query().Get("events_after"); v != "" {
		if evAfter, err = strconv.ParseInt(v, 10, 64); err != nil {
			return &pageError{Status: http.StatusBadRequest, Message: fmt.Sprintf("events_after %q is not a number", v)}
		}
	}
	events, err := c.svc.ListEvents(ctx, x, "", service.Page{After: evAfter, Limit: eventsPage})
	if err != nil {
		return err
	}
	var evNext int64
	if len(events) == eventsPage {
		evNext = events[len(events)-1].ID
	}
	alarms, err := c.svc.ListAlarms(ctx, x)
	if err != nil {
		return err
	}
	waits, err := c.svc.ListWaits(ctx, a, x.SessionID, string(store.WaitOpen), service.Page{})
	if err != nil {
		return err
	}
	state, err := c.svc.SessionState(ctx, x)
	if err != nil {
		return err
	}
	// The last turn shown: live.js skips a turn.committed at or below it.
	var lastTurn int64
	if len(turns) > 0 {
		lastTurn = turns[len(turns)-1].TurnNo
	}
	// The current activation and its lease, by the DB clock.
	act, err := c.svc.CurrentActivation(ctx, x)
	if err != nil {
		return err
	}
	// Links to the previous and next pages of turns (-1: none).
	prevTurns, nextTurns := int64(-1), int64(-1)
	if turnsAfter > 0 {
		prevTurns = max(0, turnsAfter-transcriptTurns)
	}
	if older {
		nextTurns = turnsAfter + transcriptTurns
	}
	return c.render(w, r, http.StatusOK, "session", "Session "+x.SessionID, "sessions", struct {
		Agent      store.Agent
		Session    store.Session
		Live       bool
		PrevTurns  int64
		NextTurns  int64
		Running    bool
		Head       int64
		LastTurn   int64
		Turns      []store.Turn
		Events     []store.Event
		EventsNext int64
		Alarms     []store.Alarm
		Waits      []store.Wait
		State      stateView
		Activation *store.ActivationInfo
	}{a, x, x.Status != store.SessionDestroyed && !older, prevTurns, nextTurns, c.svc.Running(x), head, lastTurn, turns, events, evNext, alarms, waits.Waits, viewState(state), act})
}

// event is an event's page: its attempts' error chain and its journal of
// host calls.
func (c *Console) event(w http.ResponseWriter, r *http.Request) error {
	a, x, err := c.lookup(r)
	if err != nil {
		return err
	}
	id, err := strconv.ParseInt(r.PathValue("event"), 10, 64)
	if err != nil {
		return &pageError{Status: http.StatusBadRequest, Message: fmt.Sprintf("event %q is not a number", r.PathValue("event"))}
	}
	e, chain, err := c.svc.GetEvent(r.Context(), x, id)
	if err != nil {
		return err
	}
	calls, err := c.svc.EventCalls(r.Context(), x, id)
	if err != nil {
		return err
	}
	return c.render(w, r, http.StatusOK, "event", fmt.Sprintf("Event %d", id), "sessions", struct {
		Agent   store.Agent
		Session store.Session
		Event   store.Event
		Errors  []store.AttemptError
		Calls   []store.HostCall
	}{a, x, e, chain, calls})
}

// signal sends a signal from the session page's form: kind message,
// steer, cancel (event_id, empty: the turn in flight) or wake.
func (c *Console) signal(w http.ResponseWriter, r *http.Request) error {
	a, x, err := c.lookup(r)
	if err != nil {
		return err
	}
	p := service.SignalParams{Kind: r.PostForm.Get("kind"), Message: r.PostForm.Get("message")}
	if v := strings.TrimSpace(r.PostForm.Get("event_id")); v != "" {
		if p.EventID, err = strconv.ParseInt(v, 10, 64); err != nil {
			return &pageError{Status: http.StatusBadRequest, Message: fmt.Sprintf("event_id %q is not a number", v)}
		}
	}
	res, err := c.svc.Signal(r.Context(), a, x.SessionID, p)
	if err != nil {
		return err
	}
	flash := res.Kind + " accepted"
	if res.Event.ID != 0 {
		flash = fmt.Sprintf("%s accepted (event %d)", res.Kind, res.Event.ID)
	}
	redirect(w, r, inNS(r.Context(), sessionURL(a.Name, x.SessionID)), flash)
	return nil
}

// destroyPage asks for confirmation before a destroy.
func (c *Console) destroyPage(w http.ResponseWriter, r *http.Request) error {
	a, x, err := c.lookup(r)
	if err != nil {
		return err
	}
	return c.render(w, r, http.StatusOK, "destroy", "Destroy session", "sessions", struct {
		Agent   store.Agent
		Session store.Session
	}{a, x})
}

// destroy destroys a session; the form must carry confirm=yes (the
// confirmation page's button).
func (c *Console) destroy(w http.ResponseWriter, r *http.Request) error {
	a, x, err := c.lookup(r)
	if err != nil {
		return err
	}
	if r.PostForm.Get("confirm") != "yes" {
		return &pageError{Status: http.StatusBadRequest, Message: "destroying a session needs confirmation (confirm=yes)"}
	}
	if _, err := c.svc.DestroySession(r.Context(), x); err != nil {
		return err
	}
	redirect(w, r, inNS(r.Context(), sessionURL(a.Name, x.SessionID)), "session destroyed")
	return nil
}

// resolveWait resolves an open wait from the session page: data (JSON,
// or text taken as a JSON string) for a wait, approved and reason for an
// approval.
func (c *Console) resolveWait(w http.ResponseWriter, r *http.Request) error {
	a, x, err := c.lookup(r)
	if err != nil {
		return err
	}
	wt, err := c.svc.GetWait(r.Context(), x, r.PathValue("wait"))
	if err != nil {
		return err
	}
	var res service.Resolution
	if wt.Kind == store.WaitKindApproval {
		switch r.PostForm.Get("approved") {
		case "true":
			res.Approved = new(true)
		case "false":
			res.Approved = new(false)
		}
		res.Reason = r.PostForm.Get("reason")
	} else if d := strings.TrimSpace(r.PostForm.Get("data")); d != "" {
		if json.Valid([]byte(d)) {
			res.Data = json.RawMessage(d)
		} else {
			b, err := abi.Marshal(d)
			if err != nil {
				return err
			}
			res.Data = b
		}
	}
	if _, err := c.svc.ResolveWait(r.Context(), x, wt, res); err != nil {
		return err
	}
	redirect(w, r, inNS(r.Context(), sessionURL(a.Name, x.SessionID)), "wait "+wt.ID+" resolved")
	return nil
}

// createSession creates a session of an agent from its page (key and
// input optional) and opens it.
func (c *Console) createSession(w http.ResponseWriter, r *http.Request) error {
	a, err := c.svc.GetAgent(r.Context(), r.PathValue("agent"))
	if err != nil {
		return err
	}
	p := service.SessionParams{Key: strings.TrimSpace(r.PostForm.Get("key"))}
	if in := r.PostForm.Get("input"); in != "" {
		p.Input = []byte(in)
	}
	x, err := c.svc.CreateSession(r.Context(), a, p)
	if err != nil {
		return err
	}
	redirect(w, r, inNS(r.Context(), sessionURL(a.Name, x.SessionID)), "session created")
	return nil
}

// payloadText renders an event's payload for a table: its message, else
// its JSON.
func payloadText(p json.RawMessage) string {
	var v struct {
		Message string          `json:"message"`
		Data    json.RawMessage `json:"data"`
	}
	if json.Unmarshal(p, &v) == nil && v.Message != "" {
		return v.Message
	}
	if len(p) > 300 {
		return string(p[:300]) + "…"
	}
	return string(p)
}

// maxShownMessageBytes bounds one message on the session page: a turn's
// result may be megabytes, and the page shows 50 turns. The rest is named
// with the transcript route that has it whole.
const maxShownMessageBytes = 8 << 10

// shortenMessages cuts every message of turns longer than
// maxShownMessageBytes at a UTF-8 boundary and says how much was left out.
func shortenMessages(turns []store.Turn) {
	for i := range turns {
		for j := range turns[i].Messages {
			m := &turns[i].Messages[j]
			if len(m.Content) <= maxShownMessageBytes {
				continue
			}
			cut := maxShownMessageBytes
			for cut > 0 && !utf8.RuneStart(m.Content[cut]) {
				cut--
			}
			m.Content = fmt.Sprintf("%s… [%d more bytes: the whole message is in GET /v1/agents/{agent}/sessions/{id}/transcript]",
				m.Content[:cut], len(m.Content)-cut)
		}
	}
}
