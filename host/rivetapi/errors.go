package rivetapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/store"
)

// Error is Rivet's error body (rivet_api_builder ErrorResponse):
// {"group", "code", "message", "metadata"?}. Status is the HTTP status
// it is answered with.
type Error struct {
	Status   int            `json:"-"`
	Group    string         `json:"group"`
	Code     string         `json:"code"`
	Message  string         `json:"message"`
	Metadata map[string]any `json:"metadata,omitempty"`
}

// Error returns group.code: message.
func (e *Error) Error() string { return e.Group + "." + e.Code + ": " + e.Message }

// badRequest is Rivet's api.bad_request (a body or query that does not
// parse: a missing or unknown field, a value of the wrong type).
func badRequest(format string, args ...any) *Error {
	reason := fmt.Sprintf(format, args...)
	return &Error{Status: http.StatusBadRequest, Group: "api", Code: "bad_request",
		Message: "Request is invalid: " + reason, Metadata: map[string]any{"reason": reason}}
}

// invalidInput is Rivet's validation.invalid_input.
func invalidInput(format string, args ...any) *Error {
	msg := fmt.Sprintf(format, args...)
	return &Error{Status: http.StatusBadRequest, Group: "validation", Code: "invalid_input", Message: msg,
		Metadata: map[string]any{"message": msg}}
}

// actorNotFound is Rivet's actor.not_found.
func actorNotFound(id string) *Error {
	return &Error{Status: http.StatusBadRequest, Group: "actor", Code: "not_found",
		Message: fmt.Sprintf("The actor does not exist or was destroyed (no actor %q).", id)}
}

// reqKey is what an error mapping needs of the request: the key sent.
type reqKey struct {
	key       string
	namespace string
	pool      string
}

// asError maps an error of host/service to Rivet's error; nil for an
// unexpected error.
func asError(err error, rq reqKey) *Error {
	var (
		e        *Error
		invalid  *service.InvalidError
		notFound *service.NotFoundError
		conflict *service.ConflictError
		unauth   *service.UnauthenticatedError
		denied   *service.ForbiddenError
		quota    *service.QuotaError
	)
	switch {
	case errors.As(err, &e):
		return e
	case errors.As(err, &quota):
		// Paddock's namespace quotas (docs/DESIGN.md "Namespaces");
		// writeErrorFor adds Retry-After.
		return &Error{Status: http.StatusTooManyRequests, Group: "quota", Code: quota.Quota, Message: quota.Message,
			Metadata: map[string]any{"namespace": quota.Namespace, "retry_after": quota.RetryAfter}}
	case errors.As(err, &invalid):
		switch invalid.Field {
		case "key":
			if len(rq.key) > service.MaxKeyBytes {
				return &Error{Status: http.StatusBadRequest, Group: "actor", Code: "key_too_large",
					Message:  fmt.Sprintf("Key label too large (max %d bytes): %s", service.MaxKeyBytes, rq.key[:service.MaxKeyBytes]),
					Metadata: map[string]any{"max_size": service.MaxKeyBytes, "key_preview": rq.key[:service.MaxKeyBytes]}}
			}
		case "input":
			return &Error{Status: http.StatusBadRequest, Group: "actor", Code: "input_too_large",
				Message:  fmt.Sprintf("Input too large (max %d): %s", abi.MaxStateBytes, invalid.Message),
				Metadata: map[string]any{"max_size": abi.MaxStateBytes}}
		}
		return invalidInput("%s: %s", invalid.Field, invalid.Message)
	case errors.As(err, &notFound):
		switch notFound.Resource {
		case service.ResourceNamespace:
			return &Error{Status: http.StatusBadRequest, Group: "namespace", Code: "not_found",
				Message: "The namespace does not exist: " + notFound.Message}
		case service.ResourcePool:
			return &Error{Status: http.StatusBadRequest, Group: "actor", Code: "no_runner_config_configured",
				Message:  notFound.Message,
				Metadata: map[string]any{"namespace": rq.namespace, "pool_name": rq.pool}}
		case service.ResourceAgent:
			return invalidInput("name: %s (register the agent first: POST /v1/agents)", notFound.Message)
		}
		return &Error{Status: http.StatusBadRequest, Group: "actor", Code: "not_found",
			Message: "The actor does not exist or was destroyed: " + notFound.Message}
	case errors.As(err, &conflict) && conflict.Reason == service.ConflictSessionExists && conflict.Field == "key" && conflict.Existing != "":
		return &Error{Status: http.StatusBadRequest, Group: "actor", Code: "duplicate_key",
			Message:  fmt.Sprintf("Actor key '%s' already in use for actor '%s'", rq.key, conflict.Existing),
			Metadata: map[string]any{"key": rq.key, "existing_actor_id": conflict.Existing}}
	case errors.As(err, &conflict):
		return invalidInput("%s", conflict.Message)
	case errors.As(err, &unauth):
		return &Error{Status: http.StatusUnauthorized, Group: "api", Code: "unauthorized", Message: "Authentication required: " + unauth.Message}
	case errors.As(err, &denied):
		return &Error{Status: http.StatusForbidden, Group: "api", Code: "forbidden", Message: denied.Message}
	case errors.Is(err, store.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
		return &Error{Status: http.StatusServiceUnavailable, Group: "guard", Code: "service_unavailable",
			Message: "Service unavailable: the store cannot be reached; retry later."}
	}
	return nil
}

// writeError answers err as Rivet's error body; an unexpected error is
// logged and answered 500 core.internal_error.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	s.writeErrorFor(w, r, err, reqKey{})
}

func (s *Server) writeErrorFor(w http.ResponseWriter, r *http.Request, err error, rq reqKey) {
	e := asError(err, rq)
	if e != nil && e.Status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="paddock"`)
	}
	var quota *service.QuotaError
	if errors.As(err, &quota) {
		w.Header().Set("Retry-After", strconv.FormatInt(max(quota.RetryAfter, 1), 10))
	} else if e != nil && e.Status == http.StatusTooManyRequests {
		// Already converted (conv): the wait is in its metadata.
		if n, ok := e.Metadata["retry_after"].(int64); ok {
			w.Header().Set("Retry-After", strconv.FormatInt(max(n, 1), 10))
		}
	}
	if e == nil {
		s.log.Error("rivetapi: internal error", "method", r.Method, "path", r.URL.Path, "err", err)
		e = &Error{Status: http.StatusInternalServerError, Group: "core", Code: "internal_error", Message: "An internal error occurred"}
	}
	writeJSON(w, e.Status, e)
}
