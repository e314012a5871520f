// Package rivetapi serves Rivet's actors API over Paddock's sessions, so that
// code written for Rivet's engine (its generated clients, such as the npm
// package @rivetkit/engine-api-full) can create, find and destroy Paddock
// sessions: an actor is a session, its actor_id the session id, its name
// the agent, its runner_name_selector the agent's pool.
//
// Routes (Rivet engine OpenAPI "rivet-api-public" 2.2.0; client
// @rivetkit/engine-api-full 25.8.3):
//
//	POST   /actors?namespace=N              create            {"actor": Actor}
//	PUT    /actors?namespace=N              get-or-create     {"actor": Actor, "created": bool}
//	GET    /actors?namespace=N&…            list              {"actors": [Actor], "pagination": {"cursor"}}
//	DELETE /actors/{actor_id}[?namespace=N] destroy           {}
//
// Errors are Rivet's: {"group", "code", "message", "metadata"?} with
// Rivet's statuses (api.unauthorized 401, api.not_found 404, an internal
// error 500, guard.service_unavailable 503, every other error 400, as
// Rivet's api-builder answers them: actor.not_found and actor.duplicate_key
// are 400 there too).
//
// The handlers are thin: the rules (keys, input size, crash policy, pools,
// namespaces, get-or-create) are host/service's; this package translates
// Rivet's fields and errors. README.md "Rivet's actors API" lists where
// Paddock's semantics differ from Rivet's.
package rivetapi

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"net/http"

	"github.com/paddock-dev/paddock/host/api"
	"github.com/paddock-dev/paddock/host/service"
)

// Datacenter is the datacenter name every actor reports (Paddock has one
// deployment per store); a request may name it or no datacenter.
const Datacenter = "default"

// DefaultMaxBodyBytes bounds a request body: Rivet's largest input (4 MiB
// of base64) and its fields, so that an input over Paddock's limit is
// answered actor.input_too_large rather than a body error.
const DefaultMaxBodyBytes = 4<<20 + 64<<10

// MaxActorIDs is the most actor ids one list may ask for (Rivet's).
const MaxActorIDs = 32

// DefaultListLimit is a list's page size when limit is not given (Rivet's).
const DefaultListLimit = 100

// Options configure the handler.
type Options struct {
	// Service is the runtime's front-door operations (required).
	Service *service.Service
	// AuthToken, when set, is the bootstrap admin token: New gives it to
	// the service (Service.WithAuthToken). Every route then needs
	// "Authorization: Bearer <token>" of it or of a stored token, whose
	// role and namespace must allow the route's op (the same tokens and
	// rules as /v1).
	AuthToken string
	// MaxBodyBytes caps request bodies (0: DefaultMaxBodyBytes).
	MaxBodyBytes int64
	Logger       *slog.Logger
}

// Server serves Rivet's actors API.
type Server struct {
	o   Options
	svc *service.Service
	log *slog.Logger
	mux *http.ServeMux
}

// Routes lists the method and net/http pattern of each route.
func Routes() []string {
	return []string{"POST /actors", "PUT /actors", "GET /actors", "DELETE /actors/{actor_id}"}
}

// New returns the handler of opts.
func New(opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.AuthToken != "" {
		opts.Service.WithAuthToken(opts.AuthToken)
	}
	s := &Server{o: opts, svc: opts.Service, log: opts.Logger, mux: http.NewServeMux()}
	s.mux.Handle("POST /actors", s.handleOp(service.OpSessionCreate, (*Server).create))
	s.mux.Handle("PUT /actors", s.handleOp(service.OpSessionCreate, (*Server).getOrCreate))
	s.mux.Handle("GET /actors", s.handleOp(service.OpSessionRead, (*Server).list))
	s.mux.Handle("DELETE /actors/{actor_id}", s.handleOp(service.OpSessionDestroy, (*Server).destroy))
	s.mux.Handle("/", s.handle(func(_ *Server, _ http.ResponseWriter, r *http.Request) error {
		return &Error{Status: http.StatusNotFound, Group: "api", Code: "not_found",
			Message: "The requested resource was not found: Paddock serves POST, PUT and GET /actors and DELETE /actors/{actor_id} of Rivet's API, not " + r.Method + " " + r.URL.Path}
	}))
	return s
}

// Mount routes /actors and /actors/ to s and everything else to next.
func (s *Server) Mount(next http.Handler) http.Handler {
	m := http.NewServeMux()
	m.Handle("/actors", s)
	m.Handle("/actors/", s)
	m.Handle("/", next)
	return m
}

// ServeHTTP authenticates and routes a request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c, err := s.svc.Authenticate(r.Context(), api.Bearer(r))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ctx := service.WithCaller(r.Context(), c)
	if ns := r.URL.Query().Get("namespace"); ns != "" {
		ctx = service.WithNamespace(ctx, ns)
	}
	r = r.WithContext(ctx)
	// The mux answers a known path with another method 405 in plain text;
	// Rivet answers api.method_not_allowed.
	if _, pattern := s.mux.Handler(r); pattern == "/" && (r.URL.Path == "/actors" || isActorPath(r.URL.Path)) && r.URL.Path != "/actors/names" {
		s.writeError(w, r, &Error{Status: http.StatusMethodNotAllowed, Group: "api", Code: "method_not_allowed",
			Message: "The requested method is not allowed for this resource"})
		return
	}
	s.mux.ServeHTTP(w, r)
}

func isActorPath(p string) bool {
	const prefix = "/actors/"
	if len(p) <= len(prefix) || p[:len(prefix)] != prefix {
		return false
	}
	for _, c := range p[len(prefix):] {
		if c == '/' {
			return false
		}
	}
	return true
}

// handleOp serves a route of op: the caller must be allowed op
// (Authorize: 403 api.forbidden, writing nothing), and a call of a
// mutating op appends one audit row before its answer is sent.
func (s *Server) handleOp(op service.Op, h func(*Server, http.ResponseWriter, *http.Request) error) http.Handler {
	rule, _ := op.Rule()
	inner := s.handle(h)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := s.svc.Authorize(r.Context(), op); err != nil {
			s.writeError(w, r, err)
			return
		}
		if !rule.Mutates {
			inner.ServeHTTP(w, r)
			return
		}
		rec := api.HoldAnswer(w)
		inner.ServeHTTP(rec, r)
		result := "ok"
		if rec.Status() >= 400 {
			var e Error
			_ = json.Unmarshal(rec.Body(), &e)
			result = e.Group + "." + e.Code
		}
		if result != "api.forbidden" && result != "api.unauthorized" {
			if err := s.svc.Audit(context.WithoutCancel(r.Context()), op, r.URL.Path, result, rec.Status()); err != nil {
				s.log.Error("rivetapi: audit row not written", "op", op, "err", err)
			}
		}
		rec.Release()
	})
}

func (s *Server) handle(h func(*Server, http.ResponseWriter, *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h(s, w, r); err != nil {
			s.writeError(w, r, err)
		}
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// decodeInput decodes an actor's input: standard base64 (padding
// optional).
func decodeInput(s string) ([]byte, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		if b2, err2 := base64.RawStdEncoding.DecodeString(s); err2 == nil {
			return b2, nil
		}
	}
	return b, err
}
