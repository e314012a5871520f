package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/paddock-dev/paddock/host/api/client"
	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/host/stream"
	"github.com/paddock-dev/paddock/store"
)

// Error is an API error: HTTP status, stable code, message naming the
// problem, and the offending field if any. It is the client's type, so the
// error body is defined once.
type Error = client.Error

func badRequest(code, field, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Code: code, Field: field, Message: fmt.Sprintf(format, args...)}
}

// asError maps an error of host/service (or the store's sentinels it
// passes on) to the API's status and code; nil for an unexpected error.
func asError(err error) *Error {
	var (
		unauth   *service.UnauthenticatedError
		denied   *service.ForbiddenError
		e        *Error
		invalid  *service.InvalidError
		tooLarge *service.TooLargeError
		notFound *service.NotFoundError
		conflict *service.ConflictError
		rejected *service.RejectedError
		gone     *service.GoneError
		quota    *service.QuotaError
	)
	switch {
	case errors.As(err, &e):
		return e
	case errors.As(err, &unauth):
		return &Error{Status: http.StatusUnauthorized, Code: "unauthenticated", Message: unauth.Message}
	case errors.As(err, &denied):
		return &Error{Status: http.StatusForbidden, Code: "forbidden", Message: denied.Message}
	case errors.As(err, &invalid) && invalid.Missing:
		return badRequest("missing_field", invalid.Field, "%s", invalid.Message)
	case errors.As(err, &invalid):
		return badRequest("invalid_field", invalid.Field, "%s", invalid.Message)
	case errors.As(err, &tooLarge):
		// A signal's payload; a secret's value is answered by putSecret.
		return &Error{Status: http.StatusRequestEntityTooLarge, Code: "signal_too_large", Field: tooLarge.Field, Message: tooLarge.Message}
	case errors.As(err, &notFound) && notFound.Referenced:
		return badRequest("unknown_"+string(notFound.Resource), notFound.Field, "%s", notFound.Message)
	case errors.As(err, &notFound):
		return &Error{Status: http.StatusNotFound, Code: string(notFound.Resource) + "_not_found", Field: notFound.Field, Message: notFound.Message}
	case errors.As(err, &conflict):
		return &Error{Status: http.StatusConflict, Code: string(conflict.Reason), Field: conflict.Field, Message: conflict.Message}
	case errors.As(err, &quota):
		// writeError adds Retry-After.
		return &Error{Status: http.StatusTooManyRequests, Code: "quota_exceeded", Field: quota.Quota, Message: quota.Message}
	case errors.As(err, &gone):
		return &Error{Status: http.StatusGone, Code: string(gone.Reason), Field: gone.Field, Message: gone.Message}
	case errors.As(err, &rejected):
		return badRequest("invalid_"+string(rejected.Resource), "", "%s", rejected.Error())
	case errors.Is(err, service.ErrSecretsDisabled):
		// 501 like plugins_disabled: this host is not set up to serve the
		// request (it has no secrets_key to seal a value with), and no
		// retry or other request will change that until its operator
		// configures one.
		return &Error{Status: http.StatusNotImplemented, Code: "secrets_disabled", Message: "this host has no secrets_key, so it cannot seal a secret set through the API; set secrets_key (or secrets_key_file) in its config, or declare the secret there (secrets: NAME: {env|file})"}
	case errors.Is(err, stream.ErrClosed):
		return &Error{Status: http.StatusServiceUnavailable, Code: "shutting_down", Message: "this host is shutting down; reconnect (to another host) with Last-Event-ID"}
	case errors.Is(err, service.ErrStreamsDisabled):
		return &Error{Status: http.StatusNotImplemented, Code: "streams_disabled", Message: "this server was built without a stream hub"}
	case errors.Is(err, service.ErrPluginsDisabled):
		return &Error{Status: http.StatusNotImplemented, Code: "plugins_disabled", Message: "this host runs no plugin workers"}
	case errors.Is(err, store.ErrSessionDestroyed):
		return &Error{Status: http.StatusGone, Code: "session_destroyed", Message: "the session is destroyed and accepts no signals"}
	case errors.Is(err, store.ErrUnavailable):
		return &Error{Status: http.StatusServiceUnavailable, Code: "store_unavailable", Message: "the store cannot be reached; retry later"}
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return &Error{Status: http.StatusServiceUnavailable, Code: "timeout", Message: "the store did not answer in time"}
	}
	return nil
}

// hint returns err with text appended to its message when err is answered
// with code: the HTTP route that helps, which the service (a front door
// of its own) does not name.
func hint(err error, code, text string) error {
	e := asError(err)
	if e == nil || e.Code != code {
		return err
	}
	h := *e
	h.Message += text
	return &h
}

// bindingHints adds the routes that help to a refused agent binding.
func bindingHints(err error) error {
	err = hint(err, "unknown_module", " (POST /v1/modules)")
	return hint(err, "unknown_plugin", " (POST /v1/plugins)")
}

// asParam answers a refused input of a request without a body (a query or
// path parameter) as invalid_parameter.
func asParam(err error) error {
	var invalid *service.InvalidError
	if errors.As(err, &invalid) {
		return badRequest("invalid_parameter", invalid.Field, "%s", invalid.Message)
	}
	return err
}

// writeError answers err as {"error": {...}}; an unexpected error is
// logged and answered 500 internal.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	e := asError(err)
	var quota *service.QuotaError
	if errors.As(err, &quota) {
		w.Header().Set("Retry-After", strconv.FormatInt(max(quota.RetryAfter, 1), 10))
	}
	if e == nil {
		s.log.Error("api: internal error", "method", r.Method, "path", r.URL.Path, "err", err)
		e = &Error{Status: http.StatusInternalServerError, Code: "internal", Message: "internal error"}
	}
	if a, ok := w.(*auditWriter); ok {
		a.code = e.Code
	}
	if e.Status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="paddock"`)
	}
	_ = writeJSON(w, e.Status, client.ErrorBody{Error: e})
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	return json.NewEncoder(w).Encode(v)
}
