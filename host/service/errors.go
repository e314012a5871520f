package service

import (
	"errors"
	"fmt"

	"github.com/paddock-dev/paddock/store"
)

// ErrPluginsDisabled: this host runs no plugin workers (the service was
// built without a plugin checker).
var ErrPluginsDisabled = errors.New("this host runs no plugin workers")

// InvalidError refuses an input: Field names it (as the front doors name
// it: "message", "key", "limit" …), Message says why.
type InvalidError struct {
	Field   string
	Message string
	// Missing: the input is required and was absent or empty.
	Missing bool
}

// Error returns the message.
func (e *InvalidError) Error() string { return e.Message }

func invalid(field, format string, args ...any) *InvalidError {
	return &InvalidError{Field: field, Message: fmt.Sprintf(format, args...)}
}

func missing(field, format string, args ...any) *InvalidError {
	return &InvalidError{Field: field, Message: fmt.Sprintf(format, args...), Missing: true}
}

// TooLargeError refuses an input over a size limit, in bytes.
type TooLargeError struct {
	Field       string
	Size, Limit int
	Message     string
}

// Error returns the message.
func (e *TooLargeError) Error() string { return e.Message }

// Resource names a kind of thing the service keeps.
type Resource string

// The resources.
const (
	ResourceModule  Resource = "module"
	ResourcePlugin  Resource = "plugin"
	ResourceAgent   Resource = "agent"
	ResourceSession Resource = "session"
	ResourceEvent   Resource = "event"
	// ResourcePool is a capacity pool of the host's configuration.
	ResourcePool Resource = "pool"
	// ResourceNamespace is a namespace (DefaultNamespace, or one the config
	// declares).
	ResourceNamespace Resource = "namespace"
)

// NotFoundError says that a named Resource does not exist. Field names the
// input that named it. Referenced is true when the thing was named inside
// the input (an agent's module or plugin) rather than addressed by the
// request. errors.Is(err, store.ErrNotFound) holds.
type NotFoundError struct {
	Resource   Resource
	Field      string
	Message    string
	Referenced bool
}

// Error returns the message.
func (e *NotFoundError) Error() string { return e.Message }

// Is makes errors.Is(err, store.ErrNotFound) true.
func (e *NotFoundError) Is(target error) bool { return target == store.ErrNotFound }

// Conflict is why a request conflicts with what is stored.
type Conflict string

// The conflicts.
const (
	// ConflictAgentExists: an agent of that name exists (UpdateAgent
	// re-binds it).
	ConflictAgentExists Conflict = "agent_exists"
	// ConflictSessionExists: the agent has a session with that key
	// (GetOrCreateSession returns it).
	ConflictSessionExists Conflict = "session_exists"
	// ConflictIdempotencyKeyReused: the idempotency key was used for a
	// different signal of the session.
	ConflictIdempotencyKeyReused Conflict = "idempotency_key_reused"
	// ConflictNothingInFlight: a cancel of "the turn in flight" found none.
	ConflictNothingInFlight Conflict = "nothing_in_flight"
	// ConflictTurnInFlight: a message under mid_turn reject arrived while
	// the session had a turn in flight; nothing was written.
	ConflictTurnInFlight Conflict = "turn_in_flight"
	// ConflictEventClosed: the event to cancel is already closed.
	ConflictEventClosed Conflict = "event_closed"
	// ConflictNotDeadLetter: the event to redrive or discard is not
	// dead-lettered.
	ConflictNotDeadLetter Conflict = "not_dead_letter"
	// ConflictSecretDeclared: the secret is declared in the host's config,
	// which wins over the API.
	ConflictSecretDeclared Conflict = "secret_declared"
	// ConflictHostOpen: a token was asked of a host without an auth_token,
	// which checks no token (docs/DESIGN.md "Tokens, roles and the audit
	// log").
	ConflictHostOpen Conflict = "host_open"
)

// ConflictError refuses a request that conflicts with what is stored.
// Field names the input at fault. errors.Is(err, store.ErrConflict) holds.
type ConflictError struct {
	Reason  Conflict
	Field   string
	Message string
	// Existing is, for ConflictSessionExists, the id of the session that
	// holds the key.
	Existing string
}

// Error returns the message.
func (e *ConflictError) Error() string { return e.Message }

// Is makes errors.Is(err, store.ErrConflict) true.
func (e *ConflictError) Is(target error) bool { return target == store.ErrConflict }

// RejectedError says that the module inspector or the plugin checker
// refused a module or a plugin worker (Resource); Err says why.
type RejectedError struct {
	Resource Resource
	Err      error
}

// Error returns the checker's message.
func (e *RejectedError) Error() string { return e.Err.Error() }

// Unwrap returns the checker's error.
func (e *RejectedError) Unwrap() error { return e.Err }

// ConflictWaitResolved: the wait to resolve was resolved already.
const ConflictWaitResolved Conflict = "wait_resolved"

// Gone is why what a request acts on is gone for good.
type Gone string

// The reasons of GoneError.
const (
	// GoneWaitExpired: the wait's timeout passed before it was resolved.
	GoneWaitExpired Gone = "wait_expired"
	// GoneWaitCancelled: the wait was cancelled (its session was
	// destroyed).
	GoneWaitCancelled Gone = "wait_cancelled"
)

// GoneError refuses a request on something gone for good (an expired or
// cancelled wait). Field names the input that named it.
// errors.Is(err, store.ErrGone) holds.
type GoneError struct {
	Reason  Gone
	Field   string
	Message string
}

// Error returns the message.
func (e *GoneError) Error() string { return e.Message }

// Is makes errors.Is(err, store.ErrGone) true.
func (e *GoneError) Is(target error) bool { return target == store.ErrGone }
