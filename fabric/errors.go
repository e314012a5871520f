package fabric

import (
	"errors"
	"fmt"
	"strings"

	"github.com/paddock-dev/paddock/fabric/internal/workerkind"
	"github.com/paddock-dev/paddock/fabric/wire"
)

// Kinds of a TurnError.
const (
	// KindNoWorker: no live worker of the pool announces the binding's
	// kind. Nothing was sent.
	KindNoWorker = "no_worker"
	// KindBusy: every matching worker is full (by the broker's count or
	// because it answered BUSY). Nothing ran.
	KindBusy = "busy"
	// KindSendFailed: the TURN could not be handed to the socket: the
	// per-worker send queue was full, the send stalled (SendTimeout), or
	// the worker left before it went out. Nothing ran.
	KindSendFailed = "send_failed"
	// KindAcceptTimeout: the worker did not answer ACCEPTED or BUSY within
	// AcceptTimeout. The broker sent CANCEL; the turn counts as not sent.
	KindAcceptTimeout = "accept_timeout"
	// KindWorkerLost: the worker's session ended during the turn: heartbeat
	// or ping timeout, GOODBYE, a new incarnation of the worker, a stalled
	// send to it, or the broker closing. Reason says which.
	KindWorkerLost = "worker_lost"
	// KindRemote: the worker reported the turn failed (an ERROR message);
	// Code is its error code, e.g. a wasm "trap" or "unknown_binding".
	KindRemote = "remote"
	// KindInvalidResult: the worker's result is not a valid v1
	// TurnResult, is too large, or echoes neither the request's turn_ref
	// nor that of a steer sent to the turn.
	KindInvalidResult = "invalid_result"
	// KindTimeout: the caller's deadline passed; CANCEL was sent.
	KindTimeout = "timeout"
	// KindCanceled: the caller cancelled the turn; CANCEL was sent.
	KindCanceled = "canceled"
)

// TurnError is a failed fabric turn. Accepted says whether the worker
// acknowledged the turn (ACCEPTED, or a result) before the failure: only
// then did the turn reach a worker, so only then does the attempt count
// (TurnSent; docs/DESIGN.md "What counts as an attempt").
type TurnError struct {
	// Kind is one of the Kind constants.
	Kind string
	// Pool and Binding are the instance's.
	Pool, Binding string
	// Worker is the worker id the turn went to ("" if none).
	Worker string
	// Incarnation is that worker's incarnation (hex), "" if none.
	Incarnation string
	// TurnRef is the request's turn_ref (abi.TurnRef.String).
	TurnRef string
	// Accepted reports whether the worker took the turn.
	Accepted bool
	// Code is the worker's error code (KindRemote) or the reason a
	// session ended (KindWorkerLost: heartbeat_timeout, ping_timeout,
	// goodbye, superseded, send_stalled, broker_closed).
	Code string
	// Err is the underlying error.
	Err error
}

// Error reads like "worker_lost (ping_timeout): … [fabric pool gpu worker w1]".
func (e *TurnError) Error() string {
	// The cause first (it is what a user reads in an event's last_error);
	// where it happened after. The turn_ref is in the logs and the event.
	var b strings.Builder
	b.WriteString(e.Kind)
	if e.Code != "" {
		fmt.Fprintf(&b, " (%s)", e.Code)
	}
	if e.Err != nil {
		fmt.Fprintf(&b, ": %v", e.Err)
	}
	fmt.Fprintf(&b, " [fabric pool %s", e.Pool)
	if e.Worker != "" {
		fmt.Fprintf(&b, " worker %s", e.Worker)
	}
	b.WriteString("]")
	return b.String()
}

// Unwrap returns the underlying error.
func (e *TurnError) Unwrap() error { return e.Err }

// TurnSent reports whether the turn reached the agent (host.SendAware):
// false means the host may retry it without consuming an attempt. A turn
// the worker accepted but could not load the module for
// (module_unavailable: fetch failed, or the module does not fit the
// worker's limits) never ran the agent and is not charged to the event.
func (e *TurnError) TurnSent() bool {
	return e.Accepted && !(e.Kind == KindRemote && e.Code == wire.ErrCodeModule)
}

// Sentinel errors, wrapped by the errors that report them.
var (
	// ErrClosed: the Broker is closed.
	ErrClosed = errors.New("fabric: broker closed")
	// ErrBadBinding: a binding is neither a module digest
	// "sha256:<64 hex>" nor "plugin:<name>@<sha256>".
	ErrBadBinding = workerkind.ErrBadBinding
	// ErrRequestTooLarge: the encoded TurnRequest exceeds
	// abi.MaxRequestBytes or the message limit. Nothing was sent.
	ErrRequestTooLarge = errors.New("fabric: turn request too large")
	// ErrInstanceClosed: Turn on a closed Instance.
	ErrInstanceClosed = errors.New("fabric: instance closed")
	// ErrQueueFull: the worker's send queue holds QueueLen messages.
	ErrQueueFull = errors.New("fabric: send queue full")
	// ErrSendStalled: the broker's socket is stuck in a send to another
	// worker that stopped reading (the library's global send lock); sends
	// fail fast until it clears.
	ErrSendStalled = errors.New("fabric: socket send stalled")
	// ErrSendExpired: a message waited SendTimeout in its queue.
	ErrSendExpired = errors.New("fabric: message expired in the send queue")
	// ErrWorkerGone: the message's worker session ended before it went out
	// (the broker never sends to a worker outside its live set).
	ErrWorkerGone = errors.New("fabric: worker session ended")
)

// ConfigError is a refused configuration: Field names the field, Err why.
type ConfigError struct {
	Field string
	Err   error
}

func (e *ConfigError) Error() string { return fmt.Sprintf("fabric: config %s: %v", e.Field, e.Err) }

// Unwrap returns the underlying error.
func (e *ConfigError) Unwrap() error { return e.Err }
