package rivetapi

import (
	"cmp"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/store"
)

// Actor is Rivet's actor object (rivet_types::actors::Actor) for a
// Paddock session. Times are milliseconds since the Unix epoch; absent
// ones are null, as Rivet answers them.
type Actor struct {
	// ActorID is the session id.
	ActorID string `json:"actor_id"`
	// Name is the agent's name.
	Name string  `json:"name"`
	Key  *string `json:"key"`
	// NamespaceID is the namespace's name (only "default" exists).
	NamespaceID string `json:"namespace_id"`
	Datacenter  string `json:"datacenter"`
	// RunnerNameSelector is the agent's capacity pool.
	RunnerNameSelector string `json:"runner_name_selector"`
	CrashPolicy        string `json:"crash_policy"`
	CreateTS           int64  `json:"create_ts"`
	// StartTS is create_ts: a session takes work from its creation.
	StartTS *int64 `json:"start_ts"`
	// PendingAllocationTS is set while the session waits for a slot of
	// its pool (pending_since).
	PendingAllocationTS *int64 `json:"pending_allocation_ts"`
	// ConnectableTS is set (to create_ts) while the session is active
	// and not waiting for a slot.
	ConnectableTS *int64 `json:"connectable_ts"`
	// SleepTS is set while the session sleeps.
	SleepTS *int64 `json:"sleep_ts"`
	// RescheduleTS is always null: a retry's due time is its event's, not
	// the session's.
	RescheduleTS *int64 `json:"reschedule_ts"`
	DestroyTS    *int64 `json:"destroy_ts"`
	// Error is Rivet's ActorError while the session sleeps for a reason
	// Rivet reports as one: {"crashed": {"message"}} after a failed turn
	// under crash policy sleep, "no_capacity" when it found no slot.
	Error any `json:"error,omitempty"`
}

func ms(t time.Time) *int64 {
	v := t.UnixMilli()
	return &v
}

func msPtr(t *time.Time) *int64 {
	if t == nil {
		return nil
	}
	return ms(*t)
}

// toActor maps agent a's session x, which runs in pool.
func toActor(a store.Agent, pool string, x store.Session) Actor {
	out := Actor{
		ActorID: x.SessionID, Name: a.Name, NamespaceID: a.Namespace, Datacenter: Datacenter,
		RunnerNameSelector: pool, CrashPolicy: string(x.CrashPolicy), CreateTS: x.CreatedAt.UnixMilli(),
		StartTS: ms(x.CreatedAt), DestroyTS: msPtr(x.DestroyTS),
	}
	if x.Key != "" {
		k := x.Key
		out.Key = &k
	}
	switch x.Status {
	case store.SessionActive:
		if x.PendingSince != nil {
			out.PendingAllocationTS = msPtr(x.PendingSince)
		} else {
			out.ConnectableTS = ms(x.CreatedAt)
		}
	case store.SessionSleeping:
		out.SleepTS = msPtr(x.SleepTS)
		if out.SleepTS == nil {
			out.SleepTS = ms(x.CreatedAt)
		}
		switch x.SleepReason {
		case store.SleepReasonCrash:
			msg := "a turn failed and the session sleeps (crash_policy sleep); its error: GET /v1/agents/" + a.Name +
				"/sessions/" + x.SessionID + "/events?status=open"
			out.Error = map[string]any{"crashed": map[string]any{"message": msg}}
		case store.SleepReasonCapacity, store.SleepReasonPendingTimeout:
			out.Error = "no_capacity"
		}
	}
	return out
}

// actorRequest is the body of POST and PUT /actors (ActorsCreateRequest,
// ActorsGetOrCreateRequest). Pointers tell a missing field from an empty
// one.
type actorRequest struct {
	Datacenter         *string `json:"datacenter"`
	Name               *string `json:"name"`
	Key                *string `json:"key"`
	Input              *string `json:"input"`
	RunnerNameSelector *string `json:"runner_name_selector"`
	CrashPolicy        *string `json:"crash_policy"`
}

// namespace reads ?namespace= (required or not) and checks it: Rivet's
// namespace is Paddock's (docs/DESIGN.md "Namespaces"), so r's operations
// act in it (service.WithNamespace) and an actor of another namespace is
// not found. It returns r with that namespace.
func (s *Server) namespace(r *http.Request, required bool) (*http.Request, string, error) {
	q := r.URL.Query()
	if !q.Has("namespace") {
		if required {
			return r, "", badRequest("missing field `namespace`")
		}
		return r, "", nil
	}
	ns := q.Get("namespace")
	if err := s.svc.CheckNamespace(ns); err != nil {
		return r, ns, err
	}
	return r.WithContext(service.WithNamespace(r.Context(), ns)), ns, nil
}

// decode reads r's JSON body into v: one object, no unknown or repeated
// fields, names matched case-sensitively.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, v *actorRequest) error {
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.o.MaxBodyBytes))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return badRequest("the body is over %d bytes", s.o.MaxBodyBytes)
		}
		return badRequest("reading the body: %v", err)
	}
	// As Rivet's serde (deny_unknown_fields): one value, field names
	// matched exactly (encoding/json would take "NAME" for "name"), a
	// field given twice refused (encoding/json keeps the last one).
	if err := jsonv2.Unmarshal(raw, v, jsonv2.RejectUnknownMembers(true)); err != nil {
		return badRequest("the body is not a valid request: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	return nil
}

// params checks the fields Rivet requires and decodes them into the
// service's session parameters.
func (s *Server) params(in actorRequest, getOrCreate bool) (name string, p service.SessionParams, err error) {
	for _, f := range []struct {
		name string
		v    *string
		need bool
	}{{"name", in.Name, true}, {"runner_name_selector", in.RunnerNameSelector, true}, {"crash_policy", in.CrashPolicy, true}, {"key", in.Key, getOrCreate}} {
		if f.need && f.v == nil {
			return "", p, badRequest("missing field `%s`", f.name)
		}
	}
	if pol := store.CrashPolicy(*in.CrashPolicy); !pol.Valid() {
		return "", p, badRequest("crash_policy: unknown variant `%s`, expected one of `restart`, `sleep`, `destroy`", *in.CrashPolicy)
	}
	if in.Datacenter != nil && *in.Datacenter != "" && *in.Datacenter != Datacenter {
		return "", p, &Error{Status: http.StatusBadRequest, Group: "datacenter", Code: "not_found",
			Message: "The datacenter does not exist (this deployment's is \"" + Datacenter + "\")."}
	}
	if in.Key != nil {
		if *in.Key == "" {
			return "", p, &Error{Status: http.StatusBadRequest, Group: "actor", Code: "empty_key", Message: "Key label cannot be empty."}
		}
		p.Key = *in.Key
	}
	if in.Input != nil {
		b, err := decodeInput(*in.Input)
		if err != nil {
			return "", p, invalidInput("input must be base64: %v", err)
		}
		p.Input = b
	}
	p.CrashPolicy = *in.CrashPolicy
	p.Pool = *in.RunnerNameSelector
	p.ExistingWins = getOrCreate
	return *in.Name, p, nil
}

// conv maps err to Rivet's error when it is one of the service's.
func conv(err error, rq reqKey) error {
	if e := asError(err, rq); e != nil {
		return e
	}
	return err
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) error {
	return s.put(w, r, false)
}

func (s *Server) getOrCreate(w http.ResponseWriter, r *http.Request) error {
	return s.put(w, r, true)
}

func (s *Server) put(w http.ResponseWriter, r *http.Request, getOrCreate bool) error {
	r, ns, err := s.namespace(r, true)
	if err != nil {
		return err
	}
	var in actorRequest
	if err := s.decode(w, r, &in); err != nil {
		return err
	}
	name, p, err := s.params(in, getOrCreate)
	if err != nil {
		return err
	}
	rq := reqKey{key: p.Key, namespace: ns, pool: p.Pool}
	a, err := s.svc.GetAgent(r.Context(), name)
	if err != nil {
		return conv(err, rq)
	}
	var x store.Session
	created := true
	if getOrCreate {
		x, created, err = s.svc.GetOrCreateSession(r.Context(), a, p)
	} else {
		x, err = s.svc.CreateSession(r.Context(), a, p)
	}
	if err != nil {
		return conv(err, rq)
	}
	act := toActor(a, s.svc.AgentPool(a), x)
	if getOrCreate {
		writeJSON(w, http.StatusOK, struct {
			Actor   Actor `json:"actor"`
			Created bool  `json:"created"`
		}{act, created})
		return nil
	}
	writeJSON(w, http.StatusOK, struct {
		Actor Actor `json:"actor"`
	}{act})
	return nil
}

// listPage is ActorsListResponse.
type listPage struct {
	Actors     []Actor `json:"actors"`
	Pagination struct {
		Cursor *string `json:"cursor"`
	} `json:"pagination"`
}

// list is GET /actors: by actor ids (actor_id repeated, or actor_ids
// comma-separated; at most MaxActorIDs, destroyed ones included, newest
// first), or by name with an optional key and include_destroyed, paged by
// cursor (Paddock's order: by session id).
func (s *Server) list(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	r, _, err := s.namespace(r, true)
	if err != nil {
		return conv(err, reqKey{})
	}
	var ids []string
	ids = append(ids, q["actor_id"]...)
	if q.Has("actor_ids") {
		for id := range strings.SplitSeq(q.Get("actor_ids"), ",") {
			if id = strings.TrimSpace(id); id == "" {
				return badRequest("invalid id in `actor_ids` query: empty id")
			}
			ids = append(ids, id)
		}
	}
	includeDestroyed := false
	if q.Has("include_destroyed") {
		v, err := strconv.ParseBool(q.Get("include_destroyed"))
		if err != nil {
			return badRequest("include_destroyed=%q must be true or false", q.Get("include_destroyed"))
		}
		includeDestroyed = v
	}
	limit := DefaultListLimit
	if q.Has("limit") {
		n, err := strconv.Atoi(q.Get("limit"))
		if err != nil || n < 0 {
			return badRequest("limit=%q must be a non-negative integer", q.Get("limit"))
		}
		// Rivet sets no upper bound; Paddock pages at most
		// service.MaxSessionLimit sessions.
		limit = min(n, service.MaxSessionLimit)
	}
	name, key := q.Get("name"), q.Get("key")
	switch {
	case len(ids) > 0 && (q.Has("name") || q.Has("key")):
		return invalidInput("Cannot provide both actor_id and (name + key). Use either actor_id or (name + key).")
	case q.Has("key") && !q.Has("name"):
		return invalidInput("Name is required when key is provided.")
	case len(ids) > MaxActorIDs:
		return &Error{Status: http.StatusBadRequest, Group: "validation", Code: "too_many_actor_ids",
			Message:  "Too many actor IDs provided. Maximum is " + strconv.Itoa(MaxActorIDs) + ", got " + strconv.Itoa(len(ids)),
			Metadata: map[string]any{"max": MaxActorIDs, "count": len(ids)}}
	case len(ids) == 0 && !q.Has("name"):
		return invalidInput("Name is required when not using actor_ids.")
	}
	var out listPage
	out.Actors = []Actor{}
	if len(ids) > 0 {
		seen := map[string]bool{}
		for _, id := range ids {
			if seen[id] {
				continue
			}
			seen[id] = true
			a, x, err := s.svc.FindSession(r.Context(), id)
			if errors.Is(err, store.ErrNotFound) {
				continue
			}
			if err != nil {
				return conv(err, reqKey{})
			}
			out.Actors = append(out.Actors, toActor(a, s.svc.AgentPool(a), x))
		}
		slices.SortStableFunc(out.Actors, func(x, y Actor) int { return cmp.Compare(y.CreateTS, x.CreateTS) })
		out.Actors = out.Actors[:min(len(out.Actors), limit)]
		if n := len(out.Actors); n > 0 {
			c := strconv.FormatInt(out.Actors[n-1].CreateTS, 10)
			out.Pagination.Cursor = &c
		}
		writeJSON(w, http.StatusOK, out)
		return nil
	}
	cursor := q.Get("cursor")
	if cursor != "" && uuid.Validate(cursor) != nil {
		// The cursor of a list by name is an actor id: anything else was
		// not given by this API (and must not silently restart at the
		// first page).
		return badRequest("cursor=%q is not a cursor this API returned (an actor id)", cursor)
	}
	if limit == 0 || (q.Has("key") && key == "") {
		// No actor has an empty key (they are refused at creation), so
		// `key=` finds none — it is not "any key".
		writeJSON(w, http.StatusOK, out)
		return nil
	}
	a, err := s.svc.GetAgent(r.Context(), name)
	if errors.Is(err, store.ErrNotFound) {
		// No agent of that name: no actors of that name (as Rivet answers
		// a name nothing was created with).
		writeJSON(w, http.StatusOK, out)
		return nil
	}
	if err != nil {
		return conv(err, reqKey{})
	}
	xs, _, err := s.svc.QuerySessions(r.Context(), a, service.SessionQuery{
		Key: key, IncludeDestroyed: includeDestroyed, After: cursor, Limit: limit,
	})
	if err != nil {
		return conv(err, reqKey{})
	}
	pool := s.svc.AgentPool(a)
	for _, x := range xs {
		out.Actors = append(out.Actors, toActor(a, pool, x))
	}
	// As Rivet: the cursor is the last actor's, also on the last page; the
	// page after it is empty with no cursor.
	if n := len(xs); n > 0 {
		c := xs[n-1].SessionID
		out.Pagination.Cursor = &c
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// destroy is DELETE /actors/{actor_id}: destroys the session (idempotent:
// a destroyed one answers {} again). A namespace, when given, must exist.
func (s *Server) destroy(w http.ResponseWriter, r *http.Request) error {
	r, _, err := s.namespace(r, false)
	if err != nil {
		return conv(err, reqKey{})
	}
	id := r.PathValue("actor_id")
	_, x, err := s.svc.FindSession(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) {
		return actorNotFound(id)
	}
	if err != nil {
		return conv(err, reqKey{})
	}
	if _, err := s.svc.DestroySession(r.Context(), x); err != nil {
		return conv(err, reqKey{})
	}
	writeJSON(w, http.StatusOK, struct{}{})
	return nil
}
