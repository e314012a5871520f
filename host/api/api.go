// Package api is Paddock's HTTP JSON API under /v1 (DESIGN "API shape"):
// modules, agents, an agent's sessions, a session's signals, events and
// transcript. Errors are {"error": {"code", "message", "field"}} with stable
// codes; unknown JSON fields are refused; bodies are size-limited. The
// routes are described in openapi.yaml, which a test keeps in sync.
package api

import (
	"bytes"
	"context"
	"crypto/subtle"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/store"
)

// OpenAPI is the OpenAPI 3 description of the routes, served at
// /v1/openapi.yaml.
//
//go:embed openapi.yaml
var OpenAPI []byte

// Modules validates uploaded wasm modules. Errors it returns for a bad
// module must name what is wrong; they are answered with 400.
type Modules interface {
	// Inspect checks that b is a wasm module exporting Paddock's guest ABI
	// and returns its digest ("sha256:<hex>") and ABI version.
	Inspect(ctx context.Context, b []byte) (digest string, abiVersion int, err error)
}

// Plugins checks plugin worker registrations. Errors it returns name what
// is wrong (missing or non-executable binary, wrong checksum, a handshake
// or ABI version mismatch); they are answered with 400.
type Plugins interface {
	// CheckPlugin verifies w on this host: the binary exists, is
	// executable, matches w.SHA256, and starts and speaks our protocol.
	CheckPlugin(ctx context.Context, w store.PluginWorker) error
}

// MaxEventPayloadBytes bounds a signal's encoded message and data
// (abi.Marshal of {"message","data"}), whatever api.max_body_bytes allows:
// a quarter of abi.MaxRequestBytes, so that the event, a steer or two, the
// session state and a trimmed transcript tail still fit in one TurnRequest.
const MaxEventPayloadBytes = abi.MaxRequestBytes / 4

// Options configure the API.
type Options struct {
	Host    *host.Host
	Modules Modules
	// Plugins checks plugin registrations.
	Plugins Plugins
	// AuthToken, when set, is required as "Authorization: Bearer <token>"
	// on every /v1 route.
	AuthToken string
	// MaxBodyBytes caps JSON bodies; MaxModuleBytes caps module uploads.
	MaxBodyBytes, MaxModuleBytes int64
	Logger                       *slog.Logger
}

// Server serves the API.
type Server struct {
	o   Options
	st  store.Store
	log *slog.Logger
	mux *http.ServeMux
}

// Route is one API route: method and net/http pattern path.
type Route struct {
	Method, Path string
	handle       func(*Server, http.ResponseWriter, *http.Request) error
}

// Routes lists the API's routes (the OpenAPI test compares them).
func Routes() []Route {
	return []Route{
		{"GET", "/healthz", (*Server).health},
		{"GET", "/metrics", nil},
		{"GET", "/v1/openapi.yaml", (*Server).openapi},
		{"POST", "/v1/modules", (*Server).uploadModule},
		{"GET", "/v1/modules", (*Server).listModules},
		{"GET", "/v1/modules/{digest}", (*Server).getModule},
		{"POST", "/v1/plugins", (*Server).registerPlugin},
		{"GET", "/v1/plugins", (*Server).listPlugins},
		{"GET", "/v1/plugins/{plugin}", (*Server).getPlugin},
		{"POST", "/v1/agents", (*Server).createAgent},
		{"GET", "/v1/agents", (*Server).listAgents},
		{"GET", "/v1/agents/{agent}", (*Server).getAgent},
		{"PUT", "/v1/agents/{agent}", (*Server).updateAgent},
		{"POST", "/v1/agents/{agent}/sessions", (*Server).createSession},
		{"PUT", "/v1/agents/{agent}/sessions", (*Server).getOrCreateSession},
		{"GET", "/v1/agents/{agent}/sessions", (*Server).listSessions},
		{"GET", "/v1/agents/{agent}/dead-letters", (*Server).listAgentDeadLetters},
		{"GET", "/v1/agents/{agent}/sessions/{session}", (*Server).getSession},
		{"DELETE", "/v1/agents/{agent}/sessions/{session}", (*Server).destroySession},
		{"POST", "/v1/agents/{agent}/sessions/{session}/signals", (*Server).sendSignal},
		{"GET", "/v1/agents/{agent}/sessions/{session}/events", (*Server).listEvents},
		{"GET", "/v1/agents/{agent}/sessions/{session}/events/{event}", (*Server).getEvent},
		{"POST", "/v1/agents/{agent}/sessions/{session}/events/{event}/redrive", (*Server).redriveEvent},
		{"POST", "/v1/agents/{agent}/sessions/{session}/events/{event}/discard", (*Server).discardEvent},
		{"POST", "/v1/agents/{agent}/sessions/{session}/events/{event}/cancel", (*Server).cancelEvent},
		{"GET", "/v1/agents/{agent}/sessions/{session}/dead-letters", (*Server).listSessionDeadLetters},
		{"GET", "/v1/agents/{agent}/sessions/{session}/alarms", (*Server).listAlarms},
		{"GET", "/v1/agents/{agent}/sessions/{session}/transcript", (*Server).transcript},
	}
}

// New builds the API handler.
func New(o Options) *Server {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	s := &Server{o: o, st: o.Host.Store(), log: o.Logger, mux: http.NewServeMux()}
	for _, r := range Routes() {
		if r.handle == nil {
			s.mux.Handle(r.Method+" "+r.Path, promhttp.HandlerFor(o.Host.Metrics().Registry, promhttp.HandlerOpts{}))
			continue
		}
		h := r.handle
		s.mux.HandleFunc(r.Method+" "+r.Path, func(w http.ResponseWriter, req *http.Request) {
			if err := h(s, w, req); err != nil {
				s.writeError(w, req, err)
			}
		})
	}
	return s
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

// ServeHTTP authenticates /v1 requests and routes them.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.o.AuthToken != "" && strings.HasPrefix(r.URL.Path, "/v1/") {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(s.o.AuthToken)) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="paddock"`)
			s.writeError(w, r, &Error{Status: http.StatusUnauthorized, Code: "unauthenticated",
				Message: "missing or wrong bearer token (Authorization: Bearer <token>)"})
			return
		}
	}
	s.mux.ServeHTTP(&muxErrors{ResponseWriter: w, s: s, r: r}, r)
}

// Error is an API error: HTTP status, stable code, message naming the
// problem, and the offending field if any.
type Error struct {
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

func badRequest(code, field, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Code: code, Field: field, Message: fmt.Sprintf(format, args...)}
}

func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	var e *Error
	switch {
	case errors.As(err, &e):
	case errors.Is(err, store.ErrSessionDestroyed):
		e = &Error{Status: http.StatusGone, Code: "session_destroyed", Message: "the session is destroyed and accepts no signals"}
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		e = &Error{Status: http.StatusServiceUnavailable, Code: "timeout", Message: "the store did not answer in time"}
	default:
		s.log.Error("api: internal error", "method", r.Method, "path", r.URL.Path, "err", err)
		e = &Error{Status: http.StatusInternalServerError, Code: "internal", Message: "internal error"}
	}
	writeJSON(w, e.Status, map[string]*Error{"error": e})
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	return json.NewEncoder(w).Encode(v)
}

// decode reads a JSON body strictly: size-limited, a JSON object, field
// names matched exactly (encoding/json alone would match them ignoring
// case), unknown fields refused, one value only.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, v any) error {
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.o.MaxBodyBytes))
	if err != nil {
		return jsonError(err, s.o.MaxBodyBytes)
	}
	body := bytes.TrimSpace(raw)
	if len(body) == 0 {
		return badRequest("malformed_json", "", "the body is empty; a JSON object is required")
	}
	if body[0] != '{' {
		return badRequest("malformed_json", "", "the body must be a JSON object, not %s", jsonKind(body[0]))
	}
	var fields map[string]json.RawMessage
	first := json.NewDecoder(bytes.NewReader(body))
	if err := first.Decode(&fields); err != nil {
		return jsonError(err, s.o.MaxBodyBytes)
	}
	if _, err := first.Token(); err != io.EOF {
		return badRequest("malformed_json", "", "the body holds more than one JSON value")
	}
	allowed := jsonFields(v)
	for name := range fields {
		if !allowed[name] {
			return badRequest("unknown_field", name, "unknown field %q (fields: %s)", name, strings.Join(sortedKeys(allowed), ", "))
		}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err, s.o.MaxBodyBytes)
	}
	return nil
}

func jsonKind(b byte) string {
	switch b {
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 'n':
		return "null"
	case 't', 'f':
		return "a boolean"
	}
	return "a number or invalid JSON"
}

// jsonFields returns the JSON field names of the struct v points to.
func jsonFields(v any) map[string]bool {
	out := map[string]bool{}
	t := reflect.TypeOf(v).Elem()
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			out[name] = true
		}
	}
	return out
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func jsonError(err error, limit int64) error {
	var (
		maxErr    *http.MaxBytesError
		syntaxErr *json.SyntaxError
		typeErr   *json.UnmarshalTypeError
	)
	switch {
	case errors.As(err, &maxErr):
		return &Error{Status: http.StatusRequestEntityTooLarge, Code: "body_too_large",
			Message: fmt.Sprintf("the body exceeds the limit of %d bytes", limit)}
	case errors.Is(err, io.EOF):
		return badRequest("malformed_json", "", "the body is empty; a JSON object is required")
	case errors.As(err, &syntaxErr):
		return badRequest("malformed_json", "", "malformed JSON at byte %d: %s", syntaxErr.Offset, syntaxErr.Error())
	case errors.As(err, &typeErr):
		return badRequest("invalid_field", typeErr.Field, "field %q must be %s, not JSON %s", typeErr.Field, typeErr.Type, typeErr.Value)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return badRequest("malformed_json", "", "malformed JSON: unexpected end of the body")
	}
	if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		f = strings.Trim(f, `"`)
		return badRequest("unknown_field", f, "unknown field %q", f)
	}
	return badRequest("malformed_json", "", "malformed JSON: %s", err.Error())
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// sha256RE matches a lowercase hex sha256.
var sha256RE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// envNameRE matches the environment variable names a plugin may be given.
var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func boolKeys(m map[string]string) map[string]bool {
	out := make(map[string]bool, len(m))
	for k := range m {
		out[k] = true
	}
	return out
}

// keyRE bounds session keys and idempotency keys: printable, 1–200 bytes.
var keyRE = regexp.MustCompile(`^[\x21-\x7e]{1,200}$`)

func (s *Server) health(w http.ResponseWriter, r *http.Request) error {
	return writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "store": s.st.Driver(), "host_id": s.o.Host.ID()})
}

func (s *Server) openapi(w http.ResponseWriter, r *http.Request) error {
	w.Header().Set("Content-Type", "application/yaml")
	_, err := w.Write(OpenAPI)
	return err
}

// ---- modules

type moduleJSON struct {
	Digest     string    `json:"digest"`
	Size       int64     `json:"size"`
	ABIVersion int       `json:"abi_version"`
	CreatedAt  time.Time `json:"created_at"`
	Created    *bool     `json:"created,omitempty"`
}

func toModuleJSON(m store.Module) moduleJSON {
	return moduleJSON{Digest: m.Digest, Size: m.Size, ABIVersion: m.ABIVersion, CreatedAt: m.CreatedAt}
}

func (s *Server) uploadModule(w http.ResponseWriter, r *http.Request) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.o.MaxModuleBytes))
	if err != nil {
		var maxErr *http.MaxBytesError
		if errors.As(err, &maxErr) {
			return &Error{Status: http.StatusRequestEntityTooLarge, Code: "body_too_large",
				Message: fmt.Sprintf("the module exceeds the limit of %d bytes (api.max_module_bytes)", s.o.MaxModuleBytes)}
		}
		return badRequest("unreadable_body", "", "reading the body: %v", err)
	}
	if len(body) == 0 {
		return badRequest("invalid_module", "", "the body is empty; send the raw .wasm bytes (Content-Type: application/wasm)")
	}
	digest, version, err := s.o.Modules.Inspect(r.Context(), body)
	if err != nil {
		return badRequest("invalid_module", "", "%s", err.Error())
	}
	m, created, err := s.st.PutModule(r.Context(), store.PutModuleParams{Digest: digest, ABIVersion: version, Bytes: body})
	if err != nil {
		return err
	}
	out := toModuleJSON(m)
	out.Created = &created
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	w.Header().Set("Location", "/v1/modules/"+m.Digest)
	return writeJSON(w, status, out)
}

func (s *Server) listModules(w http.ResponseWriter, r *http.Request) error {
	ms, err := s.st.ListModules(r.Context())
	if err != nil {
		return err
	}
	out := make([]moduleJSON, 0, len(ms))
	for _, m := range ms {
		out = append(out, toModuleJSON(m))
	}
	return writeJSON(w, http.StatusOK, map[string]any{"modules": out})
}

func (s *Server) getModule(w http.ResponseWriter, r *http.Request) error {
	m, err := s.st.GetModule(r.Context(), r.PathValue("digest"))
	if errors.Is(err, store.ErrNotFound) {
		return &Error{Status: http.StatusNotFound, Code: "module_not_found", Field: "digest",
			Message: fmt.Sprintf("no module with digest %q", r.PathValue("digest"))}
	}
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, toModuleJSON(m))
}

// ---- agents

type agentJSON struct {
	UID         string            `json:"uid"`
	Name        string            `json:"name"`
	Kind        string            `json:"kind"`
	Module      string            `json:"module,omitempty"`
	Plugin      string            `json:"plugin,omitempty"`
	CrashPolicy store.CrashPolicy `json:"crash_policy"`
	CreatedAt   time.Time         `json:"created_at"`
	UpdatedAt   time.Time         `json:"updated_at"`
}

func toAgentJSON(a store.Agent) agentJSON {
	return agentJSON{UID: a.UID, Name: a.Name, Kind: a.Kind, Module: a.ModuleDigest, Plugin: a.Plugin,
		CrashPolicy: a.CrashPolicy, CreatedAt: a.CreatedAt, UpdatedAt: a.UpdatedAt}
}

func (s *Server) createAgent(w http.ResponseWriter, r *http.Request) error {
	var in agentIn
	if err := s.decode(w, r, &in); err != nil {
		return err
	}
	return s.putAgent(w, r, in, false)
}

// updateAgent re-binds an existing agent (a new module or plugin, or
// another default crash policy): new events run the new binding, events
// already started keep theirs (DESIGN invariant 10).
func (s *Server) updateAgent(w http.ResponseWriter, r *http.Request) error {
	old, err := s.agent(r)
	if err != nil {
		return err
	}
	var in struct {
		Module      string `json:"module"`
		Plugin      string `json:"plugin"`
		CrashPolicy string `json:"crash_policy"`
	}
	if err := s.decode(w, r, &in); err != nil {
		return err
	}
	if in.CrashPolicy == "" {
		in.CrashPolicy = string(old.CrashPolicy)
	}
	return s.putAgent(w, r, agentIn{Name: old.Name, Module: in.Module, Plugin: in.Plugin, CrashPolicy: in.CrashPolicy}, true)
}

// agentIn is the body of agent registration.
type agentIn struct {
	Name        string `json:"name"`
	Module      string `json:"module"`
	Plugin      string `json:"plugin"`
	CrashPolicy string `json:"crash_policy"`
}

func (s *Server) putAgent(w http.ResponseWriter, r *http.Request, in agentIn, update bool) error {
	if !nameRE.MatchString(in.Name) {
		return badRequest("invalid_field", "name", "name %q must match %s", in.Name, nameRE)
	}
	kind := store.KindWasm
	switch {
	case in.Module != "" && in.Plugin != "":
		return badRequest("invalid_field", "plugin", "an agent runs either a module or a plugin, not both")
	case in.Plugin != "":
		kind = store.KindPlugin
	case in.Module == "":
		return badRequest("missing_field", "module", "module (a module digest, sha256:<hex>) or plugin (a plugin worker name) is required")
	}
	// The one configured default (DESIGN "Crash policy"), or the agent's
	// override in the config.
	policy, err := s.policy(in.CrashPolicy, s.o.Host.Policy().For(in.Name).CrashPolicy)
	if err != nil {
		return err
	}
	a, err := s.st.CreateAgent(r.Context(), store.CreateAgentParams{
		UID: uuid.NewString(), Name: in.Name, Kind: kind, ModuleDigest: in.Module, Plugin: in.Plugin, CrashPolicy: policy,
		Upsert: update,
	})
	switch {
	case errors.Is(err, store.ErrConflict):
		return &Error{Status: http.StatusConflict, Code: "agent_exists", Field: "name",
			Message: fmt.Sprintf("an agent named %q already exists; PUT /v1/agents/%s (paddock agent update) re-binds it", in.Name, in.Name)}
	case errors.Is(err, store.ErrNotFound) && kind == store.KindPlugin:
		return badRequest("unknown_plugin", "plugin", "no plugin worker named %q; register it first (POST /v1/plugins)", in.Plugin)
	case errors.Is(err, store.ErrNotFound):
		return badRequest("unknown_module", "module", "no module with digest %q; upload it first (POST /v1/modules)", in.Module)
	case err != nil:
		return err
	}
	w.Header().Set("Location", "/v1/agents/"+a.Name)
	if update {
		return writeJSON(w, http.StatusOK, toAgentJSON(a))
	}
	return writeJSON(w, http.StatusCreated, toAgentJSON(a))
}

// ---- plugin workers

func (s *Server) registerPlugin(w http.ResponseWriter, r *http.Request) error {
	var in struct {
		Name      string            `json:"name"`
		Path      string            `json:"path"`
		SHA256    string            `json:"sha256"`
		Env       map[string]string `json:"env"`
		Processes int               `json:"processes"`
	}
	if err := s.decode(w, r, &in); err != nil {
		return err
	}
	switch {
	case !nameRE.MatchString(in.Name):
		return badRequest("invalid_field", "name", "name %q must match %s", in.Name, nameRE)
	case in.Path == "":
		return badRequest("missing_field", "path", "path (the plugin binary on the host) is required")
	case !sha256RE.MatchString(in.SHA256):
		return badRequest("invalid_field", "sha256", "sha256 %q must be the binary's 64 lowercase hex digits (sha256sum)", in.SHA256)
	case in.Processes < 0 || in.Processes > 64:
		return badRequest("invalid_field", "processes", "processes %d must be between 1 and 64 (0: 1)", in.Processes)
	}
	for _, k := range sortedKeys(boolKeys(in.Env)) {
		// "A=B": "x" would reach the plugin as A="B=x"; NUL cannot be
		// passed to a process (nor stored by PostgreSQL).
		if !envNameRE.MatchString(k) {
			return badRequest("invalid_field", "env", "env name %q must be letters, digits and '_', not starting with a digit", k)
		}
		if strings.IndexByte(in.Env[k], 0) >= 0 {
			return badRequest("invalid_field", "env", "env %s holds a NUL character", k)
		}
	}
	if in.Processes == 0 {
		in.Processes = 1
	}
	pw := store.PluginWorker{Name: in.Name, Path: in.Path, SHA256: in.SHA256, Env: in.Env, Processes: in.Processes}
	if s.o.Plugins == nil {
		return &Error{Status: http.StatusNotImplemented, Code: "plugins_disabled", Message: "this host runs no plugin workers"}
	}
	if err := s.o.Plugins.CheckPlugin(r.Context(), pw); err != nil {
		return badRequest("invalid_plugin", "", "%s", err.Error())
	}
	pw, created, err := s.st.PutPluginWorker(r.Context(), pw)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	w.Header().Set("Location", "/v1/plugins/"+pw.Name)
	return writeJSON(w, status, pw)
}

func (s *Server) listPlugins(w http.ResponseWriter, r *http.Request) error {
	ps, err := s.st.ListPluginWorkers(r.Context())
	if err != nil {
		return err
	}
	if ps == nil {
		ps = []store.PluginWorker{}
	}
	return writeJSON(w, http.StatusOK, map[string]any{"plugins": ps})
}

func (s *Server) getPlugin(w http.ResponseWriter, r *http.Request) error {
	p, err := s.st.GetPluginWorker(r.Context(), r.PathValue("plugin"))
	if errors.Is(err, store.ErrNotFound) {
		return &Error{Status: http.StatusNotFound, Code: "plugin_not_found", Field: "plugin", Message: fmt.Sprintf("no plugin worker named %q", r.PathValue("plugin"))}
	}
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, p)
}

func (s *Server) policy(in string, def store.CrashPolicy) (store.CrashPolicy, error) {
	if in == "" {
		return def, nil
	}
	p := store.CrashPolicy(in)
	if !p.Valid() {
		return "", badRequest("invalid_field", "crash_policy", "crash_policy %q must be restart, sleep or destroy", in)
	}
	return p, nil
}

func (s *Server) listAgents(w http.ResponseWriter, r *http.Request) error {
	as, err := s.st.ListAgents(r.Context())
	if err != nil {
		return err
	}
	out := make([]agentJSON, 0, len(as))
	for _, a := range as {
		out = append(out, toAgentJSON(a))
	}
	return writeJSON(w, http.StatusOK, map[string]any{"agents": out})
}

func (s *Server) agent(r *http.Request) (store.Agent, error) {
	name := r.PathValue("agent")
	a, err := s.st.GetAgent(r.Context(), name)
	if errors.Is(err, store.ErrNotFound) {
		return a, &Error{Status: http.StatusNotFound, Code: "agent_not_found", Field: "agent", Message: fmt.Sprintf("no agent named %q", name)}
	}
	return a, err
}

func (s *Server) getAgent(w http.ResponseWriter, r *http.Request) error {
	a, err := s.agent(r)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, toAgentJSON(a))
}

// ---- sessions

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
	a, err := s.agent(r)
	if err != nil {
		return err
	}
	var in sessionIn
	if err := s.decode(w, r, &in); err != nil {
		return err
	}
	if in.Key != "" && !keyRE.MatchString(in.Key) {
		return badRequest("invalid_field", "key", "key must be 1–200 printable ASCII characters without spaces")
	}
	if getOrCreate && in.Key == "" {
		return badRequest("missing_field", "key", "get-or-create (PUT) needs a key")
	}
	if len(in.Input) > abi.MaxStateBytes {
		return badRequest("invalid_field", "input", "input is %d bytes, limit %d", len(in.Input), abi.MaxStateBytes)
	}
	def := a.CrashPolicy
	if p, ok := s.o.Host.Policy().Agents[a.Name]; ok {
		def = p.CrashPolicy // the config's override for this agent
	}
	policy, err := s.policy(in.CrashPolicy, def)
	if err != nil {
		return err
	}
	x, created, err := s.st.CreateSession(r.Context(), store.CreateSessionParams{
		AgentUID: a.UID, SessionID: uuid.NewString(), Key: in.Key, Input: in.Input, CrashPolicy: policy, GetOrCreate: getOrCreate,
	})
	if errors.Is(err, store.ErrConflict) {
		return &Error{Status: http.StatusConflict, Code: "session_exists", Field: "key",
			Message: fmt.Sprintf("agent %q already has a session with key %q (get-or-create: PUT, or paddock session create --get-or-create)", a.Name, in.Key)}
	}
	if err != nil {
		return err
	}
	out := toSessionJSON(a, x)
	out.Created = &created
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	w.Header().Set("Location", "/v1/agents/"+a.Name+"/sessions/"+x.SessionID)
	return writeJSON(w, status, out)
}

func (s *Server) session(r *http.Request) (store.Agent, store.Session, error) {
	a, err := s.agent(r)
	if err != nil {
		return a, store.Session{}, err
	}
	id := r.PathValue("session")
	x, err := s.st.GetSession(r.Context(), store.ActorKey{AgentUID: a.UID, SessionID: id})
	if errors.Is(err, store.ErrNotFound) {
		return a, x, &Error{Status: http.StatusNotFound, Code: "session_not_found", Field: "session",
			Message: fmt.Sprintf("agent %q has no session %q", a.Name, id)}
	}
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
	a, err := s.agent(r)
	if err != nil {
		return err
	}
	limit, err := intParam(r, "limit", 50, 1, 500)
	if err != nil {
		return err
	}
	xs, err := s.st.ListSessions(r.Context(), store.ListSessionsParams{AgentUID: a.UID, After: r.URL.Query().Get("cursor"), Limit: limit})
	if err != nil {
		return err
	}
	out := make([]sessionJSON, 0, len(xs))
	for _, x := range xs {
		out = append(out, toSessionJSON(a, x))
	}
	resp := map[string]any{"sessions": out}
	if len(xs) == limit {
		resp["next_cursor"] = xs[len(xs)-1].SessionID
	}
	return writeJSON(w, http.StatusOK, resp)
}

func intParam(r *http.Request, name string, def, lo, hi int) (int, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, badRequest("invalid_parameter", name, "%s=%q must be an integer between %d and %d", name, v, lo, hi)
	}
	return n, nil
}

// ---- signals and events

type eventJSON struct {
	ID             int64             `json:"event_id"`
	Seq            int64             `json:"seq"`
	Kind           string            `json:"kind"`
	Payload        json.RawMessage   `json:"payload"`
	IdempotencyKey string            `json:"idempotency_key,omitempty"`
	Status         store.EventStatus `json:"status"`
	Attempts       int               `json:"attempts"`
	NextAttemptAt  time.Time         `json:"next_attempt_at"`
	LastError      string            `json:"last_error,omitempty"`
	Binding        string            `json:"binding,omitempty"`
	AcceptedAt     time.Time         `json:"accepted_at"`
	ClosedAt       *time.Time        `json:"closed_at,omitempty"`
	SteerOf        int64             `json:"steer_of,omitempty"`
	Redrives       int               `json:"redrives,omitempty"`
	// Errors is the error chain, on single-event and dead-letter reads.
	Errors []store.AttemptError `json:"errors,omitempty"`
}

func toEventJSON(e store.Event) eventJSON {
	return eventJSON{ID: e.ID, Seq: e.Seq, Kind: e.Kind, Payload: e.Payload, IdempotencyKey: e.IdempotencyKey,
		Status: e.Status, Attempts: e.Attempts, NextAttemptAt: e.NextAttemptAt, LastError: e.LastError,
		Binding: e.Binding, AcceptedAt: e.AcceptedAt, ClosedAt: e.ClosedAt, SteerOf: e.SteerOf, Redrives: e.Redrives}
}

// sendSignal accepts a signal: message (the default kind), steer, cancel
// or wake (DESIGN "Steering and cancellation").
func (s *Server) sendSignal(w http.ResponseWriter, r *http.Request) error {
	a, err := s.agent(r)
	if err != nil {
		return err
	}
	var in struct {
		Kind           string          `json:"kind"`
		Message        string          `json:"message"`
		Data           json.RawMessage `json:"data"`
		IdempotencyKey string          `json:"idempotency_key"`
		// EventID names the event a cancel aims at (0: the one in flight).
		EventID int64 `json:"event_id"`
		// ForceAllocation: a sleep-policy session waits for capacity
		// instead of sleeping at once when its pool is full.
		ForceAllocation bool `json:"force_allocation"`
	}
	if err := s.decode(w, r, &in); err != nil {
		return err
	}
	if in.Kind == "" {
		in.Kind = abi.EventMessage
	}
	if string(in.Data) == "null" {
		in.Data = nil
	}
	if err := abi.ValidText(in.Message); err != nil {
		return badRequest("invalid_field", "message", "message %v", err)
	}
	if in.IdempotencyKey != "" && !keyRE.MatchString(in.IdempotencyKey) {
		return badRequest("invalid_field", "idempotency_key", "idempotency_key must be 1–200 printable ASCII characters without spaces")
	}
	key := store.ActorKey{AgentUID: a.UID, SessionID: r.PathValue("session")}
	notFound := func(err error) error {
		if errors.Is(err, store.ErrNotFound) {
			return &Error{Status: http.StatusNotFound, Code: "session_not_found", Field: "session",
				Message: fmt.Sprintf("agent %q has no session %q", a.Name, key.SessionID)}
		}
		return err
	}
	if in.ForceAllocation {
		// Marked before the store write, so that the controller its
		// wake-up starts already sees it (Host.Force).
		s.o.Host.Force(key)
	}
	ensure := func() { s.o.Host.Ensure(key) }
	switch in.Kind {
	case abi.EventMessage, abi.EventSteer:
		if in.Message == "" && len(in.Data) == 0 {
			return badRequest("missing_field", "message", "a %s signal needs a message (or data)", in.Kind)
		}
		if in.EventID != 0 {
			return badRequest("invalid_field", "event_id", "event_id is only for cancel signals")
		}
		payload, err := abi.Marshal(struct {
			Message string          `json:"message,omitempty"`
			Data    json.RawMessage `json:"data,omitempty"`
		}{in.Message, in.Data})
		if err != nil {
			return err
		}
		if len(payload) > MaxEventPayloadBytes {
			// Refused now rather than accepted and failed at every attempt
			// (a turn request too large for a worker is not retryable).
			return &Error{Status: http.StatusRequestEntityTooLarge, Code: "signal_too_large", Field: "message",
				Message: fmt.Sprintf("message and data encode to %d bytes; a signal may carry at most %d (a quarter of a turn request, abi.MaxRequestBytes)", len(payload), MaxEventPayloadBytes)}
		}
		var e store.Event
		var created, inFlight bool
		if in.Kind == abi.EventSteer {
			res, err := s.st.Steer(r.Context(), store.SteerParams{Key: key, Payload: payload, IdempotencyKey: in.IdempotencyKey, DeliveryID: uuid.NewString()})
			if err != nil {
				return notFound(err)
			}
			e, created, inFlight = res.Event, res.Created, res.InFlight
		} else {
			e, created, err = s.st.AppendEvent(r.Context(), store.AppendEventParams{Key: key, Kind: in.Kind, Payload: payload, IdempotencyKey: in.IdempotencyKey})
			if err != nil {
				return notFound(err)
			}
		}
		if !created && (e.Kind != in.Kind || !bytes.Equal(e.Payload, payload)) {
			// The key was used for another signal: refuse rather than drop
			// this one silently (the first one stays as it was).
			return &Error{Status: http.StatusConflict, Code: "idempotency_key_reused", Field: "idempotency_key",
				Message: fmt.Sprintf("idempotency_key %q was used for a different signal (event %d); use a new key", in.IdempotencyKey, e.ID)}
		}
		if created {
			ensure()
		}
		out := map[string]any{"kind": in.Kind, "event_id": e.ID, "seq": e.Seq, "status": e.Status, "created": created}
		if in.Kind == abi.EventSteer {
			out["in_flight"] = inFlight
		}
		return writeJSON(w, http.StatusAccepted, out)
	case "cancel":
		if in.Message != "" || len(in.Data) > 0 || in.IdempotencyKey != "" {
			return badRequest("invalid_field", "message", "a cancel signal takes only event_id (0 or absent: the turn in flight)")
		}
		return s.cancel(w, r, a, key, in.EventID)
	case "wake":
		if in.Message != "" || len(in.Data) > 0 || in.EventID != 0 {
			return badRequest("invalid_field", "message", "a wake signal takes no message, data or event_id")
		}
		x, err := s.st.WakeSession(r.Context(), key)
		if err != nil {
			return notFound(err)
		}
		ensure()
		return writeJSON(w, http.StatusAccepted, map[string]any{"kind": "wake", "status": x.Status})
	default:
		return badRequest("invalid_field", "kind", "kind %q must be message, steer, cancel or wake", in.Kind)
	}
}

// cancel cancels an event (0: the turn in flight) and pokes the owning
// controller, which aborts the worker; its late reply is fenced off. A
// destroyed session answers 410 session_destroyed, as to any signal.
func (s *Server) cancel(w http.ResponseWriter, r *http.Request, a store.Agent, key store.ActorKey, eventID int64) error {
	res, err := s.st.CancelEvent(r.Context(), store.CancelEventParams{Key: key, EventID: eventID, Reason: "cancelled by client"})
	if errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrConflict) {
		// The store cancels nothing in a destroyed session (its events
		// are closed, its activation failed): say why.
		x, gerr := s.st.GetSession(r.Context(), key)
		switch {
		case errors.Is(gerr, store.ErrNotFound):
			return &Error{Status: http.StatusNotFound, Code: "session_not_found", Field: "session",
				Message: fmt.Sprintf("agent %q has no session %q", a.Name, key.SessionID)}
		case gerr != nil:
			return gerr
		case x.Status == store.SessionDestroyed:
			return fmt.Errorf("cancel in session %s: %w", key, store.ErrSessionDestroyed)
		}
	}
	switch {
	case errors.Is(err, store.ErrNotFound) && eventID == 0:
		return &Error{Status: http.StatusConflict, Code: "nothing_in_flight", Field: "event_id",
			Message: "no turn is in flight; name a queued event with event_id (paddock signal cancel --event) to cancel it"}
	case errors.Is(err, store.ErrNotFound):
		return &Error{Status: http.StatusNotFound, Code: "event_not_found", Field: "event_id",
			Message: fmt.Sprintf("session %q has no event %d", key.SessionID, eventID)}
	case errors.Is(err, store.ErrConflict):
		return &Error{Status: http.StatusConflict, Code: "event_closed", Field: "event_id",
			Message: fmt.Sprintf("event %d is already closed", eventID)}
	case err != nil:
		return err
	}
	if res.InFlight {
		s.o.Host.Ensure(key)
	}
	return writeJSON(w, http.StatusAccepted, map[string]any{
		"kind": "cancel", "event_id": res.Event.ID, "status": res.Event.Status, "in_flight": res.InFlight,
	})
}

func (s *Server) destroySession(w http.ResponseWriter, r *http.Request) error {
	a, x, err := s.session(r)
	if err != nil {
		return err
	}
	x, err = s.st.DestroySession(r.Context(), x.ActorKey)
	if err != nil {
		return err
	}
	s.o.Host.Ensure(x.ActorKey) // a running controller notices and aborts
	return writeJSON(w, http.StatusOK, toSessionJSON(a, x))
}

// eventParam parses the {event} path value.
func eventParam(r *http.Request) (int64, error) {
	v := r.PathValue("event")
	id, err := strconv.ParseInt(v, 10, 64)
	if err != nil || id < 1 {
		return 0, badRequest("invalid_parameter", "event", "event %q must be a positive event id", v)
	}
	return id, nil
}

func (s *Server) eventOf(r *http.Request) (store.Agent, store.Session, store.Event, error) {
	a, x, err := s.session(r)
	if err != nil {
		return a, x, store.Event{}, err
	}
	id, err := eventParam(r)
	if err != nil {
		return a, x, store.Event{}, err
	}
	es, err := s.st.ListEvents(r.Context(), store.ListEventsParams{Key: x.ActorKey, After: id - 1, Limit: 1})
	if err != nil {
		return a, x, store.Event{}, err
	}
	if len(es) == 0 || es[0].ID != id {
		return a, x, store.Event{}, &Error{Status: http.StatusNotFound, Code: "event_not_found", Field: "event",
			Message: fmt.Sprintf("session %q has no event %d", x.SessionID, id)}
	}
	return a, x, es[0], nil
}

func (s *Server) getEvent(w http.ResponseWriter, r *http.Request) error {
	_, x, e, err := s.eventOf(r)
	if err != nil {
		return err
	}
	chain, err := s.st.EventErrors(r.Context(), x.ActorKey, e.ID)
	if err != nil {
		return err
	}
	out := toEventJSON(e)
	out.Errors = chain
	return writeJSON(w, http.StatusOK, out)
}

// deadLetterOp redrives or discards a dead-lettered event.
func (s *Server) deadLetterOp(w http.ResponseWriter, r *http.Request, redrive bool) error {
	_, x, e, err := s.eventOf(r)
	if err != nil {
		return err
	}
	if redrive {
		e, err = s.st.RedriveEvent(r.Context(), x.ActorKey, e.ID)
	} else {
		e, err = s.st.DiscardEvent(r.Context(), x.ActorKey, e.ID)
	}
	// The store's conflict names the event's current status (e, the
	// store's answer, is zero on error).
	var ndl *store.NotDeadLetterError
	if errors.As(err, &ndl) {
		return &Error{Status: http.StatusConflict, Code: "not_dead_letter", Field: "event",
			Message: fmt.Sprintf("event %d is %s, not dead_letter", ndl.EventID, ndl.Status)}
	}
	if err != nil {
		return err
	}
	if redrive {
		s.o.Host.Ensure(x.ActorKey)
	}
	return writeJSON(w, http.StatusOK, toEventJSON(e))
}

func (s *Server) redriveEvent(w http.ResponseWriter, r *http.Request) error {
	return s.deadLetterOp(w, r, true)
}

func (s *Server) discardEvent(w http.ResponseWriter, r *http.Request) error {
	return s.deadLetterOp(w, r, false)
}

func (s *Server) cancelEvent(w http.ResponseWriter, r *http.Request) error {
	a, x, err := s.session(r)
	if err != nil {
		return err
	}
	id, err := eventParam(r)
	if err != nil {
		return err
	}
	return s.cancel(w, r, a, x.ActorKey, id)
}

func (s *Server) listDeadLetters(w http.ResponseWriter, r *http.Request, agentUID, sessionID string) error {
	limit, err := intParam(r, "limit", 100, 1, 1000)
	if err != nil {
		return err
	}
	after, err := intParam(r, "after", 0, 0, int(^uint(0)>>1))
	if err != nil {
		return err
	}
	dls, err := s.st.ListDeadLetters(r.Context(), store.ListDeadLettersParams{AgentUID: agentUID, SessionID: sessionID, After: int64(after), Limit: limit})
	if err != nil {
		return err
	}
	out := make([]map[string]any, 0, len(dls))
	for _, d := range dls {
		ev := toEventJSON(d.Event)
		ev.Errors = d.Errors
		out = append(out, map[string]any{"session_id": d.Event.SessionID, "event": ev})
	}
	return writeJSON(w, http.StatusOK, map[string]any{"dead_letters": out})
}

func (s *Server) listAgentDeadLetters(w http.ResponseWriter, r *http.Request) error {
	a, err := s.agent(r)
	if err != nil {
		return err
	}
	return s.listDeadLetters(w, r, a.UID, r.URL.Query().Get("session"))
}

func (s *Server) listSessionDeadLetters(w http.ResponseWriter, r *http.Request) error {
	_, x, err := s.session(r)
	if err != nil {
		return err
	}
	return s.listDeadLetters(w, r, x.AgentUID, x.SessionID)
}

func (s *Server) listAlarms(w http.ResponseWriter, r *http.Request) error {
	_, x, err := s.session(r)
	if err != nil {
		return err
	}
	as, err := s.st.ListAlarms(r.Context(), x.ActorKey)
	if err != nil {
		return err
	}
	if as == nil {
		as = []store.Alarm{}
	}
	return writeJSON(w, http.StatusOK, map[string]any{"alarms": as})
}

func (s *Server) listEvents(w http.ResponseWriter, r *http.Request) error {
	_, x, err := s.session(r)
	if err != nil {
		return err
	}
	status := store.EventStatus(r.URL.Query().Get("status"))
	switch status {
	case "", store.EventOpen, store.EventDone, store.EventCancelled, store.EventDeadLetter, store.EventDiscarded:
	default:
		return badRequest("invalid_parameter", "status", "status %q must be open, done, cancelled, dead_letter or discarded", status)
	}
	limit, err := intParam(r, "limit", 100, 1, 1000)
	if err != nil {
		return err
	}
	after, err := intParam(r, "after", 0, 0, int(^uint(0)>>1))
	if err != nil {
		return err
	}
	es, err := s.st.ListEvents(r.Context(), store.ListEventsParams{Key: x.ActorKey, Status: status, After: int64(after), Limit: limit})
	if err != nil {
		return err
	}
	out := make([]eventJSON, 0, len(es))
	for _, e := range es {
		out = append(out, toEventJSON(e))
	}
	return writeJSON(w, http.StatusOK, map[string]any{"events": out})
}

// transcript pages committed turns after ?after=N. With ?wait=<duration>
// (at most 60s) it long-polls until a turn past N commits.
func (s *Server) transcript(w http.ResponseWriter, r *http.Request) error {
	_, x, err := s.session(r)
	if err != nil {
		return err
	}
	limit, err := intParam(r, "limit", 100, 1, 1000)
	if err != nil {
		return err
	}
	after, err := intParam(r, "after", 0, 0, int(^uint(0)>>1))
	if err != nil {
		return err
	}
	var wait time.Duration
	if v := r.URL.Query().Get("wait"); v != "" {
		wait, err = time.ParseDuration(v)
		if err != nil || wait < 0 || wait > time.Minute {
			return badRequest("invalid_parameter", "wait", "wait=%q must be a duration between 0s and 60s", v)
		}
	}
	deadline := time.Now().Add(wait)
	for {
		signal := s.o.Host.CommitSignal()
		turns, err := s.st.Transcript(r.Context(), store.TranscriptParams{Key: x.ActorKey, AfterTurn: int64(after), Limit: limit})
		if err != nil {
			return err
		}
		left := time.Until(deadline)
		if len(turns) > 0 || left <= 0 {
			next := int64(after)
			if len(turns) > 0 {
				next = turns[len(turns)-1].TurnNo
			}
			if turns == nil {
				turns = []store.Turn{}
			}
			return writeJSON(w, http.StatusOK, map[string]any{"turns": turns, "next_after": next})
		}
		// Wake on a local commit, or poll (another host may commit).
		select {
		case <-signal:
		case <-time.After(min(left, time.Second)):
		case <-r.Context().Done():
			return r.Context().Err()
		}
	}
}
