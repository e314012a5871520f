package api

import (
	"bytes"
	"context"
	"net/http"
	"regexp"
	"strings"

	"github.com/paddock-dev/paddock/host/service"
)

// SessionCookie is the cookie the web console (host/console) keeps a
// logged-in browser's login in: HttpOnly, SameSite=Strict, Path=/. Its
// value is the id of a console login (service.ConsoleLogin), never a
// token.
const SessionCookie = "paddock_session"

// Bearer returns the token of r's "Authorization: Bearer <token>" (the
// scheme case-insensitive, RFC 9110 11.1), or "".
func Bearer(r *http.Request) string {
	scheme, got, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimLeft(got, " ")
}

// Authenticate resolves r's caller with svc: its bearer token, or, for a
// GET or HEAD without one, the web console's login cookie (the browser's
// EventSource cannot send a header; the cookie is HttpOnly and
// SameSite=Strict, so never sent by another site's page; writes need the
// header). Every front door that takes the API's tokens calls it; the
// error is an *service.UnauthenticatedError (401) or a store failure.
func Authenticate(ctx context.Context, svc *service.Service, r *http.Request) (service.Caller, error) {
	bearer := Bearer(r)
	if bearer == "" && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		if c, err := r.Cookie(SessionCookie); err == nil {
			return svc.ConsoleCaller(ctx, c.Value)
		}
	}
	return svc.Authenticate(ctx, bearer)
}

// authenticate is the middleware that resolves the caller of every /v1
// request (Authenticate) into its context, or answers 401 with
// WWW-Authenticate (the namespace middleware, which runs after it, reads
// ?namespace=). Routes outside /v1 (/healthz, /readyz,
// /metrics) are public.
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/v1/") {
			next.ServeHTTP(w, r)
			return
		}
		c, err := Authenticate(r.Context(), s.svc, r)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		next.ServeHTTP(w, r.WithContext(service.WithCaller(r.Context(), c)))
	})
}

// authorize is the middleware of one route: it refuses the caller an op
// its role or namespace does not allow (403, before the handler runs, so a
// refused request writes nothing), and appends one audit row for each
// call of a mutating op that reached its handler — before the answer is
// sent, so that a client that reads the audit log after the answer finds
// its row.
func (s *Server) authorize(op service.Op, next http.Handler) http.Handler {
	rule, _ := op.Rule()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := s.svc.Authorize(r.Context(), op); err != nil {
			s.writeError(w, r, err)
			return
		}
		if !rule.Mutates {
			next.ServeHTTP(w, r)
			return
		}
		rec := &auditWriter{w: w, header: w.Header(), status: http.StatusOK}
		next.ServeHTTP(rec, r)
		if rec.code != "unauthenticated" && rec.code != "forbidden" {
			result := "ok"
			if rec.status >= 400 {
				result = rec.code
				if result == "" {
					result = http.StatusText(rec.status)
				}
			}
			object := r.URL.Path
			if loc := rec.header.Get("Location"); loc != "" && rec.status == http.StatusCreated {
				object = loc
			}
			object = redactTokens(object)
			// The call is done: its row is written even if the client
			// went away meanwhile.
			ctx, act := context.WithoutCancel(r.Context()), op
			if rec.op != "" {
				act = rec.op
			}
			if rec.namespace != "" {
				ctx = service.WithNamespace(ctx, rec.namespace)
			}
			if err := s.svc.Audit(ctx, act, object, result, rec.status); err != nil {
				s.log.Error("api: audit row not written", "op", act, "object", object, "err", err)
			}
		}
		rec.flush()
	})
}

// auditWriter holds a mutating route's answer until its audit row is
// written, and the error code it answered (writeError sets code).
type auditWriter struct {
	w      http.ResponseWriter
	header http.Header
	status int
	wrote  bool
	code   string
	body   bytes.Buffer
	// op and namespace, when set by the handler (auditAs), are what the
	// row records instead of the route's op and the request's namespace.
	op        service.Op
	namespace string
}

// auditAs tells the audit row of the call w answers what it did when the
// route alone does not say: the op (a signal's kind decides it:
// service.SignalOp) and the namespace of the object it wrote (a token
// created for a namespace). Either may be empty (keep the route's).
func auditAs(w http.ResponseWriter, op service.Op, namespace string) {
	if a, ok := w.(*auditWriter); ok {
		if op != "" {
			a.op = op
		}
		if namespace != "" {
			a.namespace = namespace
		}
	}
}

// tokenInPath matches a bearer token's value pasted into a path (a
// revoke given the value instead of the id).
var tokenInPath = regexp.MustCompile(`pdk_[^/]*`)

// redactTokens replaces every token value in path by "pdk_…": the audit
// log records paths, and a token's secret never reaches a row.
func redactTokens(path string) string {
	return tokenInPath.ReplaceAllString(path, service.TokenPrefix+"…")
}

func (a *auditWriter) Header() http.Header { return a.header }

func (a *auditWriter) WriteHeader(code int) {
	if !a.wrote {
		a.status, a.wrote = code, true
	}
}

func (a *auditWriter) Write(b []byte) (int, error) {
	a.wrote = true
	return a.body.Write(b)
}

func (a *auditWriter) flush() {
	a.w.WriteHeader(a.status)
	_, _ = a.w.Write(a.body.Bytes())
}
