package wire

import (
	"encoding/json"

	"github.com/paddock-dev/paddock/abi"
)

// Bodies of the message kinds: UTF-8 JSON objects, sealed. Receivers
// ignore properties they do not know; times are Unix milliseconds;
// durations milliseconds.

// Hello opens a session (worker → host). Sealed under the zero session.
type Hello struct {
	// TimeMs is the worker's clock when it sent the HELLO; the host
	// accepts it within its skew window (default ±2 min).
	TimeMs int64 `json:"time_ms"`
	// ABIVersion is the turn contract the worker speaks (abi.Version).
	ABIVersion int `json:"abi_version"`
	// Pools the worker serves (1–32 names).
	Pools []string `json:"pools"`
	// Kinds the worker runs: "wasm" and/or "plugin:<name>@<sha256>".
	Kinds []string `json:"kinds"`
	// Capacity is how many turns it runs at once (≥ 1).
	Capacity int `json:"capacity"`
	// Software names the implementation, for logs (optional).
	Software string `json:"software,omitempty"`
}

// Welcome answers a HELLO (host → worker) on the new session.
type Welcome struct {
	TimeMs              int64 `json:"time_ms"`
	HeartbeatIntervalMs int64 `json:"heartbeat_interval_ms"`
	HeartbeatTimeoutMs  int64 `json:"heartbeat_timeout_ms"`
	MaxMessageBytes     int   `json:"max_message_bytes"`
	// WindowBytes is the flow-control window: the worker acknowledges the
	// bytes it received (Heartbeat.RxBytes) at least every WindowBytes/4.
	WindowBytes int `json:"window_bytes"`
	// MaxCallsInFlight is the host's request lane: how many CALLs of the
	// session it answers at once. Absent or 0: the host has no request
	// lane (an older host), and the worker answers its turns' host calls
	// not_configured itself, sending no CALL.
	MaxCallsInFlight int `json:"max_calls_in_flight,omitempty"`
}

// Reject codes.
const (
	RejectUnknownVersion = "unknown_version"
	RejectABIVersion     = "abi_version"
	RejectClockSkew      = "clock_skew"
	RejectBadHello       = "bad_hello"
	RejectUnknownSession = "unknown_session"
	RejectEvicted        = "evicted"
)

// Reject refuses a HELLO or ends a session the host no longer knows.
type Reject struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// Versions are the wire versions the host speaks (unknown_version).
	Versions []int `json:"versions,omitempty"`
	// GotVersion is the version the host received (unknown_version).
	GotVersion int `json:"got_version,omitempty"`
	// TimeMs is the host's clock (clock_skew).
	TimeMs int64 `json:"time_ms,omitempty"`
}

// Heartbeat reports liveness, capacity and received bytes (worker → host).
type Heartbeat struct {
	Free    int `json:"free"`
	Running int `json:"running"`
	// RxBytes is the total length of the host messages the worker has
	// received and processed on this session (flow control).
	RxBytes uint64 `json:"rx_bytes"`
}

// Ping asks for a Pong (host → worker).
type Ping struct {
	Nonce uint64 `json:"nonce"`
}

// Pong answers a Ping, echoing its nonce.
type Pong struct {
	Nonce   uint64 `json:"nonce"`
	RxBytes uint64 `json:"rx_bytes"`
}

// Goodbye ends the session.
type Goodbye struct {
	Reason string `json:"reason,omitempty"`
}

// Turn dispatches a turn (host → worker).
type Turn struct {
	// DeliveryID keys the turn lane: every lane message echoes it. It is
	// Request.TurnRef.DeliveryID and does not change when steers do.
	DeliveryID string `json:"delivery_id"`
	// TurnRef is Request.TurnRef.
	TurnRef abi.TurnRef `json:"turn_ref"`
	// Binding is what runs the turn: a wasm module digest
	// "sha256:<hex>" or "plugin:<name>@<sha256>".
	Binding string `json:"binding"`
	// DeadlineMs is how long the worker may run the turn (from receipt).
	DeadlineMs int64           `json:"deadline_ms"`
	Request    json.RawMessage `json:"request"`
	// Traceparent is the W3C traceparent of the host's turn attempt span
	// ("00-<trace id>-<span id>-<flags>"), absent when the turn is not
	// traced: a worker continues the signal's trace under it.
	Traceparent string `json:"traceparent,omitempty"`
}

// Accepted is the receipt of a TURN the worker runs.
type Accepted struct {
	DeliveryID string      `json:"delivery_id"`
	TurnRef    abi.TurnRef `json:"turn_ref"`
}

// Busy refuses a TURN for lack of capacity; nothing ran.
type Busy struct {
	DeliveryID string      `json:"delivery_id"`
	TurnRef    abi.TurnRef `json:"turn_ref"`
	Free       int         `json:"free"`
}

// Result carries the TurnResult; TurnRef is Result's turn_ref.
type Result struct {
	DeliveryID string          `json:"delivery_id"`
	TurnRef    abi.TurnRef     `json:"turn_ref"`
	Result     json.RawMessage `json:"result"`
}

// Steer hands a steer to the running turn; TurnRef is the steer's (new) ref.
type Steer struct {
	DeliveryID string          `json:"delivery_id"`
	TurnRef    abi.TurnRef     `json:"turn_ref"`
	Steer      json.RawMessage `json:"steer"`
}

// Cancel stops a turn; TurnRef is the newest ref the host knows.
type Cancel struct {
	DeliveryID string      `json:"delivery_id"`
	TurnRef    abi.TurnRef `json:"turn_ref"`
	Reason     string      `json:"reason,omitempty"`
}

// Progress is observability only.
type Progress struct {
	DeliveryID string      `json:"delivery_id"`
	TurnRef    abi.TurnRef `json:"turn_ref"`
	Stage      string      `json:"stage"`
	Detail     string      `json:"detail,omitempty"`
}

// Call is a host call of a running turn (worker → host), answered by
// CALL_RESULT with the same CallID.
type Call struct {
	// DeliveryID is the turn's (its TURN's delivery_id).
	DeliveryID string `json:"delivery_id"`
	// CallID numbers the worker's calls on the session: ≥ 1, unique.
	CallID uint64 `json:"call_id"`
	// Request is the abi CallRequest, at most abi.MaxCallRequestBytes.
	Request json.RawMessage `json:"request"`
}

// CallResult answers a Call (host → worker). A CallResult JSON of at most
// MaxCallResultChunk bytes travels whole in Result, with Last set; a
// longer one travels in order in chunks of Data (offsets 0, then each
// chunk's end), the final one with Last set and Offset + len(Data) =
// TotalBytes.
type CallResult struct {
	// DeliveryID and CallID are the Call's.
	DeliveryID string `json:"delivery_id"`
	CallID     uint64 `json:"call_id"`
	// Result is the whole abi CallResult (absent in chunks).
	Result json.RawMessage `json:"result,omitempty"`
	// Offset, TotalBytes and Data (base64 in JSON) carry one chunk of
	// the CallResult JSON.
	Offset     int64  `json:"offset,omitempty"`
	TotalBytes int64  `json:"total_bytes,omitempty"`
	Data       []byte `json:"data,omitempty"`
	// Last marks the message that completes the result.
	Last bool `json:"last,omitempty"`
}

// FetchModule asks for bytes [Offset, Offset+MaxBytes) of a wasm module.
type FetchModule struct {
	RequestID uint64 `json:"request_id"`
	Digest    string `json:"digest"`
	Offset    int64  `json:"offset"`
	MaxBytes  int    `json:"max_bytes"`
}

// Module is one chunk of a module.
type Module struct {
	RequestID  uint64 `json:"request_id"`
	Digest     string `json:"digest"`
	Offset     int64  `json:"offset"`
	TotalBytes int64  `json:"total_bytes"`
	// Data is base64 in JSON (Go []byte), at most MaxModuleChunk bytes.
	Data []byte `json:"data"`
}

// Error codes. Turn-lane failures use the worker kind's failure names
// (wasm: trap, exit, oom, timeout, canceled, oversized, invalid_result;
// plugin: crash, unresponsive, protocol, …) or these.
const (
	ErrCodeUnknownBinding = "unknown_binding"
	ErrCodeBadRequest     = "bad_request"
	ErrCodeModule         = "module_unavailable"
	ErrCodeNotFound       = "not_found"
	ErrCodeBusy           = "busy"
	ErrCodeInternal       = "internal"
	ErrCodeDuplicate      = "duplicate"
)

// Error reports a failed request (RequestID) or turn (DeliveryID).
type Error struct {
	RequestID  uint64       `json:"request_id,omitempty"`
	DeliveryID string       `json:"delivery_id,omitempty"`
	TurnRef    *abi.TurnRef `json:"turn_ref,omitempty"`
	Code       string       `json:"code"`
	Message    string       `json:"message"`
}
