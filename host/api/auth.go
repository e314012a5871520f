package api

import (
	"bytes"
	"context"
	"errors"
	"net/http"
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
	c, err := svc.Authenticate(ctx, bearer)
	var ue *service.UnauthenticatedError
	if bearer == "" && r.Header.Get("Authorization") != "" && errors.As(err, &ue) {
		// A header was sent, in another form than "Bearer <token>" (the
		// token alone, say): name the form, never the header's value.
		ue.Message = `the Authorization header is not of the form "Bearer <token>"`
	}
	return c, err
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
		rec := &auditWriter{HeldAnswer: HoldAnswer(w), call: &service.CallAudit{Op: op, Object: r.URL.Path}}
		next.ServeHTTP(rec, r.WithContext(service.WithCallAudit(r.Context(), rec.call)))
		if rec.call.Written() && rec.status == rec.call.Status {
			// The row went out with the call's write (a message signal's
			// event), in its transaction.
			rec.Release()
			return
		}
		if rec.code != "unauthenticated" && rec.code != "forbidden" {
			result := "ok"
			if rec.status >= 400 {
				result = rec.code
				if result == "" {
					result = http.StatusText(rec.status)
				}
			}
			object := r.URL.Path
			if loc := rec.Header().Get("Location"); loc != "" && rec.status == http.StatusCreated {
				object = loc
			}
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
		rec.Release()
	})
}

// auditWriter holds a mutating route's answer until its audit row is
// written, and the error code it answered (writeError sets code).
type auditWriter struct {
	*HeldAnswer
	// code is the error code the answer carries (writeError sets it).
	code string
	// op and namespace, when set by the handler (auditAs), are what the
	// row records instead of the route's op and the request's namespace.
	op        service.Op
	namespace string
	// call is the call's row as its store write may carry it
	// (service.CallAudit; auditWithWrite).
	call *service.CallAudit
}

// auditAs tells the audit row of the call w answers what it did when the
// route alone does not say: the op (a signal's kind decides it:
// service.SignalOp) and the namespace of the object it wrote (a token
// created for a namespace). Either may be empty (keep the route's).
func auditAs(w http.ResponseWriter, op service.Op, namespace string) {
	if a, ok := w.(*auditWriter); ok {
		if op != "" {
			a.op = op
			a.call.Op = op
		}
		if namespace != "" {
			a.namespace = namespace
		}
	}
}

// auditWithWrite lets the call's store write carry its audit row when it
// succeeds, with result "ok" and status (the status the handler then
// answers): one commit for the write and its row (service.CallAudit).
// Call it after auditAs. A call whose write carried no row, or that
// answers another status, gets its row after the handler, as any call.
func auditWithWrite(w http.ResponseWriter, status int) {
	if a, ok := w.(*auditWriter); ok && a.namespace == "" {
		a.call.Status = status
	}
}

// HeldAnswer is an http.ResponseWriter that holds a handler's answer
// (status, headers, body) until Release sends it: a front door writes a
// mutating call's audit row between the two, so that a client that reads
// the audit log after the answer finds the row (docs/DESIGN.md "Tokens,
// roles and the audit log"). Headers go to the real writer's map at once.
type HeldAnswer struct {
	w      http.ResponseWriter
	status int
	wrote  bool
	body   bytes.Buffer
}

// HoldAnswer returns a HeldAnswer in front of w (status 200 until the
// handler sets one).
func HoldAnswer(w http.ResponseWriter) *HeldAnswer {
	return &HeldAnswer{w: w, status: http.StatusOK}
}

// Header is the real writer's header map.
func (a *HeldAnswer) Header() http.Header { return a.w.Header() }

// WriteHeader keeps the first status.
func (a *HeldAnswer) WriteHeader(code int) {
	if !a.wrote {
		a.status, a.wrote = code, true
	}
}

// Write buffers b.
func (a *HeldAnswer) Write(b []byte) (int, error) {
	a.wrote = true
	return a.body.Write(b)
}

// Status is the held status; Body the held body.
func (a *HeldAnswer) Status() int { return a.status }

// Body returns the held body.
func (a *HeldAnswer) Body() []byte { return a.body.Bytes() }

// Release sends the held answer to the real writer.
func (a *HeldAnswer) Release() {
	a.w.WriteHeader(a.status)
	_, _ = a.w.Write(a.body.Bytes())
}
