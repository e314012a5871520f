package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Error is an error answer of the API: the body {"error": {"code",
// "message", "field"}} with the answer's HTTP status. An answer that is
// not such a body (a proxy's error page, say) has Code CodeHTTPError and
// the body's text as Message.
type Error struct {
	// Status is the HTTP status code (400, 404, 409, 410, 413, 503…).
	Status int `json:"-"`
	// Code is the API's stable error code, e.g. CodeSessionNotFound.
	Code string `json:"code"`
	// Message is a sentence naming the problem.
	Message string `json:"message"`
	// Field names the offending request field, path value or query
	// parameter ("" when none).
	Field string `json:"field,omitempty"`
	// RetryAfter is the answer's Retry-After header in whole seconds (a
	// 429 quota_exceeded: when to try again), 0 when it has none.
	RetryAfter time.Duration `json:"-"`
}

// Error returns "<code> (HTTP <status>): <message>", followed by
// " [field <field>]" when Field is set.
func (e *Error) Error() string {
	s := fmt.Sprintf("%s (HTTP %d): %s", e.Code, e.Status, e.Message)
	if e.Field != "" {
		s += " [field " + e.Field + "]"
	}
	return s
}

// Is reports whether target is an *Error that e matches: each of target's
// Status, Code and Field that is non-zero equals e's. So
// errors.Is(err, &client.Error{Code: client.CodeAgentNotFound}) tests a
// code and errors.Is(err, &client.Error{Status: 404}) a status.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok {
		return false
	}
	return (t.Status == 0 || t.Status == e.Status) && (t.Code == "" || t.Code == e.Code) &&
		(t.Field == "" || t.Field == e.Field)
}

// Error codes of the API (host/api), for IsCode and Error.Is.
const (
	CodeHTTPError            = "http_error" // set by this package: an error answer without the API's error body
	CodeUnauthenticated      = "unauthenticated"
	CodeRouteNotFound        = "route_not_found"
	CodeMethodNotAllowed     = "method_not_allowed"
	CodeMalformedJSON        = "malformed_json"
	CodeUnknownField         = "unknown_field"
	CodeInvalidField         = "invalid_field"
	CodeMissingField         = "missing_field"
	CodeInvalidParameter     = "invalid_parameter"
	CodeBodyTooLarge         = "body_too_large"
	CodeInvalidModule        = "invalid_module"
	CodeModuleNotFound       = "module_not_found"
	CodeUnknownModule        = "unknown_module"
	CodeInvalidPlugin        = "invalid_plugin"
	CodeUnknownPlugin        = "unknown_plugin"
	CodePluginNotFound       = "plugin_not_found"
	CodePluginsDisabled      = "plugins_disabled"
	CodeAgentNotFound        = "agent_not_found"
	CodeAgentExists          = "agent_exists"
	CodeSessionNotFound      = "session_not_found"
	CodeSessionExists        = "session_exists"
	CodeSessionDestroyed     = "session_destroyed"
	CodeEventNotFound        = "event_not_found"
	CodeEventClosed          = "event_closed"
	CodeNotDeadLetter        = "not_dead_letter"
	CodeNothingInFlight      = "nothing_in_flight"
	CodeTurnInFlight         = "turn_in_flight"
	CodeIdempotencyKeyReused = "idempotency_key_reused"
	CodeSignalTooLarge       = "signal_too_large"
	CodeWaitNotFound         = "wait_not_found"
	CodeWaitResolved         = "wait_resolved"
	CodeWaitExpired          = "wait_expired"
	CodeWaitCancelled        = "wait_cancelled"
	CodeResolutionTooLarge   = "resolution_too_large"
	CodeTimeout              = "timeout"
	CodeStoreUnavailable     = "store_unavailable"
	CodeInternal             = "internal"
)

// AsError returns the *Error in err's chain, or nil.
func AsError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return nil
}

// IsCode reports whether err is an API error with the given code.
func IsCode(err error, code string) bool {
	e := AsError(err)
	return e != nil && e.Code == code
}

// IsNotFound reports whether err is an API error with status 404 (no such
// module, plugin, agent, session, event or route).
func IsNotFound(err error) bool { return isStatus(err, http.StatusNotFound) }

// IsConflict reports whether err is an API error with status 409 (exists
// already, an event closed or not dead-lettered, nothing in flight, a
// reused idempotency key).
func IsConflict(err error) bool { return isStatus(err, http.StatusConflict) }

// IsGone reports whether err is an API error with status 410 (the session
// is destroyed, a wait expired or was cancelled).
func IsGone(err error) bool { return isStatus(err, http.StatusGone) }

// IsUnauthenticated reports whether err is an API error with status 401
// (a missing or wrong bearer token).
func IsUnauthenticated(err error) bool { return isStatus(err, http.StatusUnauthorized) }

// IsBadRequest reports whether err is an API error with status 400 (a
// malformed or invalid request; Error.Field names the field).
func IsBadRequest(err error) bool { return isStatus(err, http.StatusBadRequest) }

// IsServerError reports whether err is an API error with a 5xx status
// (the store did not answer in time, an internal error): the same call may
// succeed later.
func IsServerError(err error) bool {
	e := AsError(err)
	return e != nil && e.Status >= 500
}

func isStatus(err error, status int) bool {
	e := AsError(err)
	return e != nil && e.Status == status
}

// ErrorBody is the body of an error answer: {"error": {...}}.
type ErrorBody struct {
	Error *Error `json:"error"`
}

// decodeError turns an error answer (its status, header and body) into
// an *Error.
func decodeError(status int, header http.Header, body []byte) *Error {
	var e *Error
	var env ErrorBody
	if json.Unmarshal(body, &env) == nil && env.Error != nil && env.Error.Code != "" {
		e = env.Error
		e.Status = status
	} else {
		e = &Error{Status: status, Code: CodeHTTPError, Message: strings.TrimSpace(string(body))}
	}
	if n, err := strconv.ParseInt(strings.TrimSpace(header.Get("Retry-After")), 10, 64); err == nil && n > 0 && n < 1<<31 {
		e.RetryAfter = time.Duration(n) * time.Second
	}
	return e
}
