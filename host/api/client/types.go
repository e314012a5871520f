package client

import (
	"encoding/json"
	"time"

	"github.com/paddock-dev/paddock/store"
)

// This file holds the request and response bodies the API defines itself.
// Where the API encodes a store type as it is (a plugin worker, an alarm, a
// committed turn, an attempt's error) the methods return the store type.

// Health is the answer of GET /healthz.
type Health struct {
	// HostID identifies the answering host.
	HostID string `json:"host_id"`
	// Status is "ok".
	Status string `json:"status"`
	// Store is the store driver: "sqlite" or "postgres".
	Store string `json:"store"`
}

// Module is a stored wasm module.
type Module struct {
	// Digest is "sha256:<hex>" of the module's bytes.
	Digest string `json:"digest"`
	// Size is the module's length in bytes.
	Size int64 `json:"size"`
	// ABIVersion is the guest ABI version the module exports.
	ABIVersion int `json:"abi_version"`
	// CreatedAt is when it was first uploaded.
	CreatedAt time.Time `json:"created_at"`
	// Created is set by UploadModule only (nil elsewhere): true when this
	// upload stored it, false when it was stored already.
	Created *bool `json:"created,omitempty"`
}

// PluginRegistration is the body of RegisterPlugin (POST /v1/plugins).
type PluginRegistration struct {
	// Name is the plugin worker's name: [a-z0-9][a-z0-9_-]{0,62}.
	Name string `json:"name"`
	// Path is the plugin binary on the host.
	Path string `json:"path"`
	// SHA256 is the binary's checksum: 64 lowercase hex digits.
	SHA256 string `json:"sha256"`
	// Env is the plugin's whole environment (it inherits nothing else).
	Env map[string]string `json:"env,omitempty"`
	// Processes is how many plugin processes serve its sessions, 1–64
	// (0: 1).
	Processes int `json:"processes,omitempty"`
}

// Plugin is a registered plugin worker as the API shows it: its
// environment's names, never their values (they are often secrets).
type Plugin struct {
	Name string `json:"name"`
	// Path is the binary's path on the host.
	Path string `json:"path"`
	// SHA256 is the binary's lowercase hex sha256.
	SHA256 string `json:"sha256"`
	// EnvNames are the names of the plugin's environment variables,
	// sorted (their values are not returned).
	EnvNames []string `json:"env_names,omitempty"`
	// Processes is how many plugin processes serve its sessions.
	Processes int       `json:"processes"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Agent is a registered agent.
type Agent struct {
	UID string `json:"uid"`
	// Namespace is the agent's namespace; Name is unique within it.
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Kind is "wasm" or "plugin".
	Kind string `json:"kind"`
	// Module is the module digest of a wasm agent ("" for a plugin agent).
	Module string `json:"module,omitempty"`
	// Plugin is the plugin worker of a plugin agent ("" for a wasm agent).
	Plugin string `json:"plugin,omitempty"`
	// CrashPolicy is the default crash policy of its sessions.
	CrashPolicy store.CrashPolicy `json:"crash_policy"`
	CreatedAt   time.Time         `json:"created_at"`
	UpdatedAt   time.Time         `json:"updated_at"`
	// Capabilities are its host-call grants as the host's config sets
	// them now (not stored with the agent).
	Capabilities Capabilities `json:"capabilities"`
}

// CreateAgentRequest is the body of CreateAgent (POST /v1/agents). Exactly
// one of Module and Plugin is required.
type CreateAgentRequest struct {
	// Name is the agent's name: [a-z0-9][a-z0-9_-]{0,62}.
	Name string `json:"name"`
	// Module is an uploaded module's digest ("sha256:<hex>").
	Module string `json:"module,omitempty"`
	// Plugin is a registered plugin worker's name.
	Plugin string `json:"plugin,omitempty"`
	// CrashPolicy is restart, sleep or destroy ("": the host's default).
	CrashPolicy string `json:"crash_policy,omitempty"`
}

// UpdateAgentRequest is the body of UpdateAgent (PUT /v1/agents/{agent}):
// the agent's new binding. Exactly one of Module and Plugin is required.
type UpdateAgentRequest struct {
	Module string `json:"module,omitempty"`
	Plugin string `json:"plugin,omitempty"`
	// CrashPolicy is restart, sleep or destroy ("": unchanged).
	CrashPolicy string `json:"crash_policy,omitempty"`
}

// Session is an agent's session.
type Session struct {
	// Agent is the agent's name; AgentUID its uid.
	Agent     string `json:"agent"`
	AgentUID  string `json:"agent_uid"`
	SessionID string `json:"session_id"`
	// Key is the client-chosen key ("" when none).
	Key string `json:"key,omitempty"`
	// Input is given to the agent with every turn.
	Input       []byte              `json:"input,omitempty"`
	Status      store.SessionStatus `json:"status"`
	CrashPolicy store.CrashPolicy   `json:"crash_policy"`
	ActorEpoch  int64               `json:"actor_epoch"`
	TurnCount   int64               `json:"turn_count"`
	EventCount  int64               `json:"event_count"`
	OpenEvents  int64               `json:"open_events"`
	CreatedAt   time.Time           `json:"created_at"`
	// SleepTS is when it fell asleep (nil unless sleeping).
	SleepTS *time.Time `json:"sleep_ts,omitempty"`
	// DestroyTS is when it was destroyed (nil unless destroyed).
	DestroyTS *time.Time `json:"destroy_ts,omitempty"`
	// SleepReason is crash, capacity, pending_timeout or agent ("" unless
	// sleeping).
	SleepReason string `json:"sleep_reason,omitempty"`
	DeadLetters int64  `json:"dead_letters"`
	// PendingSince is when it began to wait for pool capacity (nil unless
	// waiting).
	PendingSince *time.Time `json:"pending_since,omitempty"`
	// Created is set by CreateSession and GetOrCreateSession only (nil
	// elsewhere): true when the call created the session, false when
	// GetOrCreateSession found it.
	Created *bool `json:"created,omitempty"`
}

// SessionRequest is the body of CreateSession and GetOrCreateSession.
type SessionRequest struct {
	// Key is a client-chosen key, unique per agent: 1–200 printable ASCII
	// characters (required by GetOrCreateSession).
	Key string `json:"key,omitempty"`
	// Input is given to the agent with every turn (at most
	// abi.MaxStateBytes).
	Input []byte `json:"input,omitempty"`
	// CrashPolicy is restart, sleep or destroy ("": the agent's).
	CrashPolicy string `json:"crash_policy,omitempty"`
}

// ListSessionsOptions page ListSessions.
type ListSessionsOptions struct {
	// Limit is the page size, 1–500 (0: the server's default, 50).
	Limit int
	// Cursor is the NextCursor of the previous page ("": the first).
	Cursor string
}

// SessionPage is one page of an agent's sessions, by session id.
type SessionPage struct {
	// NextCursor continues the listing ("" after the last page).
	NextCursor string    `json:"next_cursor,omitempty"`
	Sessions   []Session `json:"sessions"`
}

// SessionBrowse is a page of GET /v1/sessions: sessions of every agent
// (or one), filtered, by agent uid then session id.
type SessionBrowse struct {
	// NextCursor continues the listing ("" after the last page).
	NextCursor string    `json:"next_cursor,omitempty"`
	Sessions   []Session `json:"sessions"`
	// Scanned is how many sessions the indexed filters selected for this
	// page; Partial says a text filter stopped at its bound before the page
	// was full (go on from NextCursor).
	Scanned int  `json:"scanned"`
	Partial bool `json:"partial,omitempty"`
}

// Signal kinds of Signal.Kind.
const (
	SignalMessage = "message"
	SignalSteer   = "steer"
	SignalCancel  = "cancel"
	SignalWake    = "wake"
)

// Signal is the body of SendSignal. A message or steer needs Message or
// Data; a cancel takes only EventID; a wake takes nothing.
type Signal struct {
	// Kind is SignalMessage (""), SignalSteer, SignalCancel or SignalWake.
	Kind string `json:"kind,omitempty"`
	// Message is the text given to the agent.
	Message string `json:"message,omitempty"`
	// Data is JSON given to the agent with the message. Message and Data
	// together encode to at most api.MaxEventPayloadBytes.
	Data json.RawMessage `json:"data,omitempty"`
	// IdempotencyKey makes a re-sent signal return the first one's event
	// (1–200 printable ASCII characters).
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// EventID is the event a cancel aims at (0: the turn in flight).
	EventID int64 `json:"event_id,omitempty"`
	// ForceAllocation makes a sleep-policy session wait for pool capacity
	// instead of sleeping at once when its pool is full.
	ForceAllocation bool `json:"force_allocation,omitempty"`
	// MidTurn (messages only) is what the message does if the session has
	// a turn in flight: queue, steer, interrupt or reject (409
	// turn_in_flight, nothing written). Empty: the agent's policy.mid_turn.
	MidTurn string `json:"mid_turn,omitempty"`
}

// The mid_turn policies of Signal.MidTurn.
const (
	MidTurnQueue     = "queue"
	MidTurnSteer     = "steer"
	MidTurnInterrupt = "interrupt"
	MidTurnReject    = "reject"
)

// SignalResult is the answer to SendSignal and Cancel (HTTP 202). Which
// fields it carries depends on Kind (see MarshalJSON): Created is sent for
// a message and a steer only, InFlight for a steer and a cancel only;
// EventID is 0 and Seq 0 where they are not sent.
type SignalResult struct {
	// Kind is the signal's kind.
	Kind string `json:"kind"`
	// EventID is the accepted (or cancelled) event; 0 for a wake.
	EventID int64 `json:"event_id"`
	// Seq is the event's sequence number in its session (message, steer).
	Seq int64 `json:"seq"`
	// Status is the event's status, or the session's for a wake.
	Status string `json:"status"`
	// Created is false when the idempotency key returned an earlier event.
	Created bool `json:"created"`
	// InFlight: a steer was handed to the turn in flight, or a cancel hit
	// it.
	InFlight bool `json:"in_flight"`
	// MidTurn (a message) is the mid_turn policy it was accepted under.
	MidTurn string `json:"mid_turn,omitempty"`
	// InterruptedEventID (a message under mid_turn interrupt) is the event
	// whose turn in flight was cancelled; 0 when none was.
	InterruptedEventID int64 `json:"interrupted_event_id,omitempty"`
}

// MarshalJSON encodes the fields r's kind has: kind and status always;
// event_id, seq, created and mid_turn for a message (and in_flight under
// mid_turn steer or interrupt, interrupted_event_id under interrupt);
// event_id, seq, created and in_flight for a steer; event_id and in_flight
// for a cancel; nothing more for a wake.
func (r SignalResult) MarshalJSON() ([]byte, error) {
	out := map[string]any{"kind": r.Kind, "status": r.Status}
	switch r.Kind {
	case SignalWake:
	case SignalCancel:
		out["event_id"], out["in_flight"] = r.EventID, r.InFlight
	default:
		out["event_id"], out["seq"], out["created"] = r.EventID, r.Seq, r.Created
		if r.Kind == SignalSteer {
			out["in_flight"] = r.InFlight
		}
		if r.MidTurn != "" {
			out["mid_turn"] = r.MidTurn
		}
		if r.MidTurn == MidTurnSteer || r.MidTurn == MidTurnInterrupt {
			out["in_flight"] = r.InFlight
		}
		if r.MidTurn == MidTurnInterrupt {
			out["interrupted_event_id"] = r.InterruptedEventID
		}
	}
	return json.Marshal(out)
}

// Event is one of a session's actor events.
type Event struct {
	ID   int64  `json:"event_id"`
	Seq  int64  `json:"seq"`
	Kind string `json:"kind"`
	// Payload is the event's encoded {"message","data"}.
	Payload        json.RawMessage   `json:"payload"`
	IdempotencyKey string            `json:"idempotency_key,omitempty"`
	Status         store.EventStatus `json:"status"`
	// Attempts counts failed attempts.
	Attempts      int       `json:"attempts"`
	NextAttemptAt time.Time `json:"next_attempt_at"`
	// LastError is the last failed attempt's error (kept after a later
	// attempt succeeded).
	LastError  string     `json:"last_error,omitempty"`
	Binding    string     `json:"binding,omitempty"`
	AcceptedAt time.Time  `json:"accepted_at"`
	ClosedAt   *time.Time `json:"closed_at,omitempty"`
	// SteerOf is the event a steer was handed to (0: none).
	SteerOf  int64 `json:"steer_of,omitempty"`
	Redrives int   `json:"redrives,omitempty"`
	// Errors is the error chain, oldest first: set by GetEvent and the
	// dead-letter listings only.
	Errors []store.AttemptError `json:"errors,omitempty"`
	// Calls is the event's journal, by seq (set-aside rows included): set
	// by GetEvent only, absent when the event made no host call.
	Calls []HostCall `json:"calls,omitempty"`
}

// ListEventsOptions filter and page ListEvents.
type ListEventsOptions struct {
	// Status keeps events of one status ("": all).
	Status store.EventStatus
	// After lists events with an id above After.
	After int64
	// Limit is the page size, 1–1000 (0: the server's default, 100).
	Limit int
}

// DeadLetter is a dead-lettered event with its session.
type DeadLetter struct {
	// Event carries its error chain in Errors.
	Event     Event  `json:"event"`
	SessionID string `json:"session_id"`
}

// DeadLetterOptions filter and page AgentDeadLetters and
// SessionDeadLetters.
type DeadLetterOptions struct {
	// Session keeps one session's (AgentDeadLetters only).
	Session string
	// After lists events with an id above After.
	After int64
	// Limit is the page size, 1–1000 (0: the server's default, 100).
	Limit int
}

// TranscriptOptions page Transcript.
type TranscriptOptions struct {
	// After lists turns with a number above After.
	After int64
	// Limit is the page size, 1–1000 (0: the server's default, 100).
	Limit int
	// Wait, 0–60s, long-polls: the answer waits until a turn past After
	// commits or Wait has passed (then Turns is empty). Rounded to
	// milliseconds.
	Wait time.Duration
}

// TranscriptPage is a page of committed turns.
type TranscriptPage struct {
	// NextAfter is the last turn's number (After when Turns is empty):
	// the After of the next page.
	NextAfter int64        `json:"next_after"`
	Turns     []store.Turn `json:"turns"`
}

// ModuleList is the answer of ListModules (GET /v1/modules).
type ModuleList struct {
	Modules []Module `json:"modules"`
}

// PluginList is the answer of ListPlugins (GET /v1/plugins).
type PluginList struct {
	Plugins []Plugin `json:"plugins"`
}

// AgentList is the answer of ListAgents (GET /v1/agents).
type AgentList struct {
	Agents []Agent `json:"agents"`
}

// EventList is the answer of ListEvents.
type EventList struct {
	Events []Event `json:"events"`
}

// DeadLetterList is the answer of AgentDeadLetters and SessionDeadLetters.
type DeadLetterList struct {
	DeadLetters []DeadLetter `json:"dead_letters"`
}

// AlarmList is the answer of ListAlarms.
type AlarmList struct {
	Alarms []store.Alarm `json:"alarms"`
}

// Capabilities are an agent's host-call grants as the host's config sets
// them now (calls.Capabilities): the destinations its http calls may
// reach, the model endpoints it may call, the names of the secrets it may
// have filled in (never their values), and its limits.
type Capabilities struct {
	HTTP []HTTPRule `json:"http"`
	// Models are the model endpoints (config models:) it may call.
	Models []string `json:"models"`
	// Secrets are the names of the secrets its http calls may use.
	Secrets []string `json:"secrets"`
	Limits  Limits   `json:"limits"`
	// Approval names the granted calls that also need an approver's
	// decision before they go out (calls.ApprovalRules).
	Approval ApprovalRules `json:"approval"`
}

// ApprovalRules are the calls that need approval (calls.ApprovalRules).
type ApprovalRules struct {
	HTTP []ApprovalHTTPRule `json:"http"`
	// Models are model endpoints whose calls need approval.
	Models []string `json:"models"`
	// TimeoutMs, when > 0, expires an undecided approval after this many
	// milliseconds (the call is then refused).
	TimeoutMs int64 `json:"timeout_ms,omitempty"`
}

// ApprovalHTTPRule matches http calls that need approval.
type ApprovalHTTPRule struct {
	// Host is an exact name, an IP literal or a "*.suffix" wildcard.
	Host string `json:"host"`
	// Methods, upper case; absent: every method.
	Methods []string `json:"methods,omitempty"`
	// PathPrefix, when set, matches only paths that start with it.
	PathPrefix string `json:"path_prefix,omitempty"`
}

// HTTPRule allows one destination of http calls (calls.HTTPRule).
type HTTPRule struct {
	// Scheme is http or https.
	Scheme string `json:"scheme"`
	// Host is an exact name, an IP literal or a "*.suffix" wildcard.
	Host string `json:"host"`
	// Port is the destination port (0: the scheme's default).
	Port int `json:"port,omitempty"`
	// Methods are the allowed methods (empty: GET and HEAD).
	Methods []string `json:"methods,omitempty"`
	// AllowPrivate lets an exact-name rule reach private addresses.
	AllowPrivate bool `json:"allow_private,omitempty"`
	// Secrets, when set, are the only secrets filled into requests this
	// rule allows (names only).
	Secrets []string `json:"secrets,omitempty"`
}

// Limits bound an agent's host calls (calls.Limits); 0 sets no limit of
// its own.
type Limits struct {
	CallsPerTurn         int   `json:"calls_per_turn"`
	ResponseBytesPerTurn int64 `json:"response_bytes_per_turn"`
	TokensPerTurn        int64 `json:"tokens_per_turn"`
	TokensPerDay         int64 `json:"tokens_per_day"`
}

// HostCall is one row of an event's journal (store.HostCall): a host call
// an attempt of the event made, by seq.
type HostCall struct {
	// Seq is the call's number within its attempt, from 1.
	Seq int `json:"seq"`
	// Kind is http or model.
	Kind string `json:"kind"`
	// Destination is where it went, without secrets ("GET
	// https://host:443/path", "endpoint/model"). The agent chose it:
	// escape it before printing it to a terminal.
	Destination string `json:"destination"`
	// RequestDigest is "sha256:<hex>" of the request as the agent sent it.
	RequestDigest string `json:"request_digest"`
	// ErrorCode is the result's error code ("" on success).
	ErrorCode string `json:"error_code,omitempty"`
	// ErrorReason refines a denied call (destination, method, endpoint,
	// tokens_per_turn …) and ErrorMessage says why the call gave no
	// response, as the agent was told (never holding a secret).
	ErrorReason  string `json:"error_reason,omitempty"`
	ErrorMessage string `json:"error_message,omitempty"`
	// Status is the upstream HTTP status (0: none).
	Status     int       `json:"status,omitempty"`
	StartedAt  time.Time `json:"started_at"`
	DurationMS int64     `json:"duration_ms"`
	// InputTokens and OutputTokens are a model call's usage.
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
	// ActorEpoch is the epoch of the attempt that made it.
	ActorEpoch int64 `json:"actor_epoch"`
	// Replays counts later attempts that replayed it instead of calling
	// again; ReplayedEpoch is the last one's epoch (0: none).
	Replays       int   `json:"replays"`
	ReplayedEpoch int64 `json:"replayed_epoch,omitempty"`
	// SetAside: a later attempt diverged at or before this seq, so the row
	// is kept for the record but no longer replayed.
	SetAside bool `json:"set_aside"`
	// Result is the abi.CallResult the agent received, as recorded (sent
	// only with GetEventOptions.IncludeResults, ?include=results). It never
	// holds a secret's value: the host fills secrets into request headers
	// only, never records the filled request, and scrubs results. Bytes
	// that are not JSON (never written by the host) are sent as a JSON
	// string.
	Result json.RawMessage `json:"result,omitempty"`
}

// GetEventOptions ask GetEvent for more of the event.
type GetEventOptions struct {
	// IncludeResults adds each journal row's recorded result
	// (?include=results).
	IncludeResults bool
}

// Secret is a secret set through the API: its name and times, never its
// value.
type Secret struct {
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// PutSecretRequest is the body of PutSecret (PUT /v1/secrets/{name}).
type PutSecretRequest struct {
	// Value is the secret's value, 1 byte to 64 KiB
	// (service.MaxSecretBytes). It is sealed by the host and never
	// returned.
	Value string `json:"value"`
}

// SecretList is the answer of ListSecrets (GET /v1/secrets).
type SecretList struct {
	Secrets []Secret `json:"secrets"`
}

// Wait is a session's wait for a human (or a webhook): opened by a turn
// that ended with outcome wait (kind "wait") or by a host call that needs
// an approver (kind "approval").
type Wait struct {
	Agent     string `json:"agent"`
	SessionID string `json:"session_id"`
	// WaitID names the wait within its session.
	WaitID string         `json:"wait_id"`
	Kind   store.WaitKind `json:"kind"`
	// EventID is the event whose turn opened it (approval: the held event).
	EventID int64  `json:"event_id"`
	For     string `json:"for,omitempty"`
	// Data is what the agent attached (wait) or the call's request with
	// secrets unfilled (approval).
	Data json.RawMessage `json:"data,omitempty"`
	// Status is open, resolved, expired or cancelled.
	Status store.WaitStatus `json:"status"`
	// CallSeq and CallDigest identify the host call an approval is for.
	CallSeq    int    `json:"call_seq,omitempty"`
	CallDigest string `json:"call_digest,omitempty"`
	// Resolution is the resolver's payload (approval: {"approved","reason"}).
	Resolution json.RawMessage `json:"resolution,omitempty"`
	CreatedAt  time.Time       `json:"created_at"`
	ExpiresAt  *time.Time      `json:"expires_at,omitempty"`
	ClosedAt   *time.Time      `json:"closed_at,omitempty"`
}

// WaitList is a page of waits; NextAfter is the After of the next page
// (the last page repeats the After it was asked with).
type WaitList struct {
	Waits     []Wait `json:"waits"`
	NextAfter int64  `json:"next_after"`
}

// ListWaitsOptions select a page of waits.
type ListWaitsOptions struct {
	// Status is open, resolved, expired or cancelled ("" for all).
	Status store.WaitStatus
	// After is the previous page's NextAfter; Limit 1–1000 (0: 100).
	After int64
	Limit int
}

// ResolveWaitRequest is the body of ResolveWait: Data for a wait of kind
// wait (any JSON value), Approved (required) and Reason for an approval.
type ResolveWaitRequest struct {
	Data     json.RawMessage `json:"data,omitempty"`
	Approved *bool           `json:"approved,omitempty"`
	Reason   string          `json:"reason,omitempty"`
}

// Token is a stored API token as listed: never its value.
type Token struct {
	ID        string `json:"id"`
	Namespace string `json:"namespace"`
	// Role is reader, client, operator or admin.
	Role      string    `json:"role"`
	Name      string    `json:"name,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	// CreatedBy is the token id of its creator ("bootstrap" for the
	// config's auth_token).
	CreatedBy string     `json:"created_by"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

// CreateTokenRequest is the body of CreateToken (POST /v1/tokens).
type CreateTokenRequest struct {
	// Namespace is the token's namespace ("": the one the request
	// addresses, ?namespace= or the caller's, else default).
	Namespace string `json:"namespace,omitempty"`
	// Role is reader, client, operator or admin.
	Role string `json:"role"`
	// Name describes the token (at most 200 bytes).
	Name string `json:"name,omitempty"`
}

// NewToken is the answer of CreateToken: the token and, this once, its
// value (the host keeps only a hash of it).
type NewToken struct {
	Token
	// Token is the bearer token's value, "pdk_<id>_<secret>".
	Value string `json:"token"`
}

// TokenList is the answer of ListTokens (GET /v1/tokens).
type TokenList struct {
	Tokens []Token `json:"tokens"`
}

// AuditEntry is one row of the audit log: who (a token id), what (an
// operation such as "session.destroy"), which object (the addressed
// path), when, and the result ("ok" or the error code) and status.
type AuditEntry struct {
	ID        int64     `json:"id"`
	At        time.Time `json:"at"`
	TokenID   string    `json:"token_id"`
	Namespace string    `json:"namespace"`
	Action    string    `json:"action"`
	Object    string    `json:"object"`
	Result    string    `json:"result"`
	Status    int       `json:"status"`
}

// AuditPage is the answer of ListAudit (GET /v1/audit): rows newest first
// and the cursor of the next page (NextBefore, 0 when this was the last).
type AuditPage struct {
	Entries    []AuditEntry `json:"entries"`
	NextBefore int64        `json:"next_before,omitempty"`
}
