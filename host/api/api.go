// Package api is Paddock's HTTP JSON API under /v1 (docs/DESIGN.md "API shape"):
// modules, agents, an agent's sessions, a session's signals, events (with
// their journal of host calls) and transcript, and secrets (set, listed by
// name, deleted; a value is never answered or logged). Errors are
// {"error": {"code", "message", "field"}} with stable codes; unknown JSON
// fields are refused; bodies are size-limited. The
// routes are described in openapi.yaml, which a test keeps in sync.
//
// The handlers are thin: they decode a request, call the operation of
// host/service that holds its rules, and encode the answer; errors.go maps
// the service's typed errors to statuses and codes.
package api

import (
	_ "embed"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/host/stream"
	"github.com/paddock-dev/paddock/tracing"
)

// OpenAPI is the OpenAPI 3 description of the routes, served at
// /v1/openapi.yaml.
//
//go:embed openapi.yaml
var OpenAPI []byte

// MaxEventPayloadBytes bounds a signal's encoded message and data
// (service.MaxEventPayloadBytes), whatever api.max_body_bytes allows.
const MaxEventPayloadBytes = service.MaxEventPayloadBytes

// Options configure the API.
type Options struct {
	// Host is the host the API serves (required; its metrics are served
	// at /metrics).
	Host *host.Host
	// Modules inspects module uploads.
	Modules service.Modules
	// Plugins checks plugin registrations (nil: none are accepted).
	Plugins service.Plugins
	// Service, when set, is the service the handlers call; when nil, New
	// builds one from Host, Modules and Plugins.
	Service *service.Service
	// AuthToken, when set, is the bootstrap admin token: New gives it to
	// the service (Service.WithAuthToken). Once the service has one, every
	// /v1 route needs "Authorization: Bearer <token>" of it or of a stored
	// token (a GET also takes the web console's login cookie,
	// SessionCookie), and the token's role and namespace must allow the
	// route's op.
	AuthToken string
	// Stream is the hub session streams are served from when New builds
	// the service (nil: New makes one on Host's store). With Service set,
	// the service's own hub (service.WithStream) serves them.
	Stream *stream.Hub
	// StreamHeartbeat is how often an idle stream sends a comment (0:
	// DefaultStreamHeartbeat).
	StreamHeartbeat time.Duration
	// MaxBodyBytes caps JSON bodies; MaxModuleBytes caps module uploads.
	MaxBodyBytes, MaxModuleBytes int64
	Logger                       *slog.Logger
}

// Server serves the API.
type Server struct {
	o   Options
	svc *service.Service
	log *slog.Logger
	mux *http.ServeMux
	// handler is the mux behind the middleware.
	handler http.Handler
}

// Route is one API route: method and net/http pattern path, and the
// operation it calls (service.OpRules says which role may call it and
// whether it is audited).
type Route struct {
	Method, Path string
	Op           service.Op
	handle       func(*Server, http.ResponseWriter, *http.Request) error
}

// Routes lists the API's routes (the OpenAPI test compares them).
func Routes() []Route {
	return []Route{
		{"GET", "/healthz", service.OpHealth, (*Server).health},
		{"GET", "/readyz", service.OpReady, (*Server).ready},
		{"GET", "/metrics", service.OpMetrics, nil},
		{"GET", "/v1/openapi.yaml", service.OpOpenAPI, (*Server).openapi},
		{"POST", "/v1/modules", service.OpModuleUpload, (*Server).uploadModule},
		{"GET", "/v1/modules", service.OpModuleRead, (*Server).listModules},
		{"GET", "/v1/modules/{digest}", service.OpModuleRead, (*Server).getModule},
		{"POST", "/v1/plugins", service.OpPluginRegister, (*Server).registerPlugin},
		{"GET", "/v1/plugins", service.OpPluginRead, (*Server).listPlugins},
		{"GET", "/v1/plugins/{plugin}", service.OpPluginRead, (*Server).getPlugin},
		{"GET", "/v1/sessions", service.OpSessionRead, (*Server).browseSessions},
		{"POST", "/v1/agents", service.OpAgentCreate, (*Server).createAgent},
		{"GET", "/v1/agents", service.OpAgentRead, (*Server).listAgents},
		{"GET", "/v1/agents/{agent}", service.OpAgentRead, (*Server).getAgent},
		{"PUT", "/v1/agents/{agent}", service.OpAgentUpdate, (*Server).updateAgent},
		{"POST", "/v1/agents/{agent}/sessions", service.OpSessionCreate, (*Server).createSession},
		{"PUT", "/v1/agents/{agent}/sessions", service.OpSessionCreate, (*Server).getOrCreateSession},
		{"GET", "/v1/agents/{agent}/sessions", service.OpSessionRead, (*Server).listSessions},
		{"GET", "/v1/agents/{agent}/dead-letters", service.OpEventRead, (*Server).listAgentDeadLetters},
		{"GET", "/v1/agents/{agent}/sessions-by-key/{key}", service.OpSessionRead, (*Server).sessionByKey},
		{"GET", "/v1/agents/{agent}/sessions/{session}", service.OpSessionRead, (*Server).getSession},
		{"DELETE", "/v1/agents/{agent}/sessions/{session}", service.OpSessionDestroy, (*Server).destroySession},
		{"POST", "/v1/agents/{agent}/sessions/{session}/signals", service.OpSignalSend, (*Server).sendSignal},
		{"GET", "/v1/agents/{agent}/sessions/{session}/events", service.OpEventRead, (*Server).listEvents},
		{"GET", "/v1/agents/{agent}/sessions/{session}/events/{event}", service.OpEventRead, (*Server).getEvent},
		{"POST", "/v1/agents/{agent}/sessions/{session}/events/{event}/redrive", service.OpEventRedrive, (*Server).redriveEvent},
		{"POST", "/v1/agents/{agent}/sessions/{session}/events/{event}/discard", service.OpEventDiscard, (*Server).discardEvent},
		{"POST", "/v1/agents/{agent}/sessions/{session}/events/{event}/cancel", service.OpEventCancel, (*Server).cancelEvent},
		{"GET", "/v1/agents/{agent}/sessions/{session}/dead-letters", service.OpEventRead, (*Server).listSessionDeadLetters},
		{"GET", "/v1/agents/{agent}/sessions/{session}/alarms", service.OpSessionRead, (*Server).listAlarms},
		{"GET", "/v1/agents/{agent}/sessions/{session}/transcript", service.OpSessionRead, (*Server).transcript},
		{"GET", "/v1/agents/{agent}/sessions/{session}/stream", service.OpStreamRead, (*Server).streamSession},
		{"GET", "/v1/agents/{agent}/sessions/{session}/waits", service.OpWaitRead, (*Server).listSessionWaits},
		{"GET", "/v1/agents/{agent}/sessions/{session}/waits/{wait}", service.OpWaitRead, (*Server).getWait},
		{"POST", "/v1/agents/{agent}/sessions/{session}/waits/{wait}", service.OpWaitResolve, (*Server).resolveWait},
		{"GET", "/v1/agents/{agent}/waits", service.OpWaitRead, (*Server).listAgentWaits},
		{"GET", "/v1/secrets", service.OpSecretRead, (*Server).listSecrets},
		{"PUT", "/v1/secrets/{name}", service.OpSecretPut, (*Server).putSecret},
		{"DELETE", "/v1/secrets/{name}", service.OpSecretDelete, (*Server).deleteSecret},
		{"POST", "/v1/tokens", service.OpTokenCreate, (*Server).createToken},
		{"GET", "/v1/tokens", service.OpTokenRead, (*Server).listTokens},
		{"DELETE", "/v1/tokens/{id}", service.OpTokenRevoke, (*Server).revokeToken},
		{"GET", "/v1/audit", service.OpAuditRead, (*Server).listAudit},
	}
}

// New builds the API handler.
func New(o Options) *Server {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Service == nil {
		if o.Stream == nil {
			// No goroutine runs while nobody subscribes, so this hub needs
			// no Close of its own.
			o.Stream = stream.New(stream.Options{Store: o.Host.Store(), Logger: o.Logger.With("component", "stream")})
		}
		o.Service = service.New(o.Host, o.Modules, o.Plugins).WithStream(o.Stream)
	}
	if o.AuthToken != "" {
		o.Service.WithAuthToken(o.AuthToken)
	}
	s := &Server{o: o, svc: o.Service, log: o.Logger, mux: http.NewServeMux()}
	for _, r := range Routes() {
		if r.handle == nil {
			s.mux.Handle(r.Method+" "+r.Path, promhttp.HandlerFor(o.Host.Metrics().Registry, promhttp.HandlerOpts{}))
			continue
		}
		s.mux.Handle(r.Method+" "+r.Path, s.authorize(r.Op, s.errors(r.handle)))
	}
	// A request's W3C traceparent is the parent of the spans it starts.
	s.handler = tracing.Middleware(s.authenticate(s.namespace(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mux.ServeHTTP(&muxErrors{ResponseWriter: w, s: s, r: r}, r)
	}))))
	return s
}

// errors is the middleware that answers a handler's error as the API's
// JSON error (errors.go).
func (s *Server) errors(h func(*Server, http.ResponseWriter, *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h(s, w, r); err != nil {
			s.writeError(w, r, err)
		}
	})
}

// ServeHTTP authenticates /v1 requests and routes them.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.handler.ServeHTTP(w, r)
}

// muxErrors turns the router's own plain-text 404 and 405 answers into the
// API's JSON errors (405 keeps its Allow header).
type muxErrors struct {
	http.ResponseWriter
	s      *Server
	r      *http.Request
	caught bool
}

func (m *muxErrors) WriteHeader(code int) {
	if (code == http.StatusNotFound || code == http.StatusMethodNotAllowed) &&
		strings.HasPrefix(m.Header().Get("Content-Type"), "text/plain") {
		m.caught = true
		m.Header().Del("X-Content-Type-Options")
		e := &Error{Status: code, Code: "route_not_found", Message: fmt.Sprintf("no route for %s %s", m.r.Method, m.r.URL.Path)}
		if code == http.StatusMethodNotAllowed {
			e.Code, e.Message = "method_not_allowed", fmt.Sprintf("%s is not allowed on %s (allowed: %s)", m.r.Method, m.r.URL.Path, m.Header().Get("Allow"))
		}
		m.s.writeError(m.ResponseWriter, m.r, e)
		return
	}
	m.ResponseWriter.WriteHeader(code)
}

func (m *muxErrors) Write(b []byte) (int, error) {
	if m.caught {
		return len(b), nil
	}
	return m.ResponseWriter.Write(b)
}

// Unwrap gives http.ResponseController the server's writer (flushes and
// deadlines of the stream route).
func (m *muxErrors) Unwrap() http.ResponseWriter { return m.ResponseWriter }
