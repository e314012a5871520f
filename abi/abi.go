// Package abi is Paddock's versioned turn contract: the messages a host sends
// to a worker (TurnRequest) and the reply it expects (TurnResult), shared by
// wasm guests, plugin workers and remote workers.
//
// The wire form is JSON (see abi/README.md and abi/v1.schema.json); these Go
// types are the reference encoding. The package imports nothing outside the
// standard library so that it compiles for GOOS=wasip1 guests.
package abi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Version is the major version of the turn contract. A module, plugin or
// remote worker that speaks another major version is refused when it is
// uploaded or registered (docs/DESIGN.md "Workers").
const Version = 1

// Size limits of the v1 contract, in bytes. Hosts may configure lower ones.
const (
	// MaxRequestBytes bounds an encoded TurnRequest.
	MaxRequestBytes = 4 << 20
	// MaxResultBytes bounds an encoded TurnResult.
	MaxResultBytes = 4 << 20
	// MaxStateBytes bounds the session state blob.
	MaxStateBytes = 1 << 20
	// MaxStateEncodedBytes is the size of MaxStateBytes of state as it
	// travels in a TurnResult or TurnRequest: base64 with padding,
	// 4·⌈MaxStateBytes/3⌉ = 1 398 104 bytes.
	MaxStateEncodedBytes = 4 * ((MaxStateBytes + 2) / 3)
	// ResultHeadroomBytes is what DefaultResultBytes leaves beside a
	// maximal state for messages, alarm operations and the JSON around
	// them (512 KiB).
	ResultHeadroomBytes = 512 << 10
	// DefaultResultBytes is the default cap of an encoded TurnResult that
	// hosts configure (wasm.max_result_bytes): a maximal state, base64, plus
	// ResultHeadroomBytes = 1 922 392 bytes. A lower cap lowers the state
	// an agent can keep; hosts refuse one below it.
	DefaultResultBytes = MaxStateEncodedBytes + ResultHeadroomBytes
	// MaxMessages bounds the number of messages in one TurnResult.
	MaxMessages = 256
)

// TurnRef is the fence tuple of one delivery. A worker must echo it unchanged
// in its TurnResult; the store commits the reply only if every field equals
// the database rows (docs/DESIGN.md invariant 3).
type TurnRef struct {
	DeliveryID    string `json:"delivery_id"`
	ActivationUID string `json:"activation_uid"`
	ActorEpoch    int64  `json:"actor_epoch"`
	ActorEventID  int64  `json:"actor_event_id"`
	Revision      int64  `json:"revision"`
	AgentUID      string `json:"agent_uid"`
	SessionID     string `json:"session_id"`
}

// String renders the ref compactly for logs: session/epoch/event/delivery.
func (r TurnRef) String() string {
	return fmt.Sprintf("%s/%s@e%d/ev%d/r%d/%s", r.AgentUID, r.SessionID, r.ActorEpoch, r.ActorEventID, r.Revision, r.DeliveryID)
}

// Event kinds carried in TurnRequest.Event.Kind.
const (
	// EventMessage is a client message to the session.
	EventMessage = "message"
	// EventSteer is a steer that arrived while no turn was in flight; it is
	// queued and handled like a message. Steers that arrive during a turn
	// reach it through TurnRequest.Steers and the guest's steer poll.
	EventSteer = "steer"
	// EventAlarm is the firing of an alarm the agent set (Event.Alarm).
	EventAlarm = "alarm"
)

// Event is the actor event a turn handles.
type Event struct {
	// ID is the actor event id (unique per host database, increasing per session).
	ID int64 `json:"id"`
	// Kind is the event kind, e.g. "message".
	Kind string `json:"kind"`
	// Message is the text of a message signal.
	Message string `json:"message,omitempty"`
	// Data is optional structured JSON sent with the signal.
	Data json.RawMessage `json:"data,omitempty"`
	// AcceptedAt is when the host accepted the signal (database clock).
	AcceptedAt time.Time `json:"accepted_at"`
	// Alarm is set on alarm events: which alarm fired and when it was due.
	Alarm *AlarmFired `json:"alarm,omitempty"`
	// Wait is set on wait.resolved and wait.expired events.
	Wait *WaitEvent `json:"wait,omitempty"`
}

// AlarmFired describes an alarm event.
type AlarmFired struct {
	Name  string    `json:"name"`
	DueAt time.Time `json:"due_at"`
	// Data is what the agent attached when it set the alarm.
	Data json.RawMessage `json:"data,omitempty"`
}

// Steer is client input that arrived for the turn in flight. A worker that
// takes it in must answer with TurnRef (the newer revision); a reply echoing
// the older ref is rejected by the fences (stale_revision) and the host runs
// the turn again with the steer in TurnRequest.Steers.
type Steer struct {
	// TurnRef is the ref the worker must echo from now on.
	TurnRef TurnRef `json:"turn_ref"`
	// EventID is the steer's own actor event id.
	EventID int64           `json:"event_id"`
	Message string          `json:"message,omitempty"`
	Data    json.RawMessage `json:"data,omitempty"`
}

// Message roles.
const (
	RoleUser      = "user"
	RoleAssistant = "assistant"
	RoleSystem    = "system"
	RoleTool      = "tool"
)

// Message is one transcript entry.
type Message struct {
	// Role is one of user, assistant, system, tool.
	Role string `json:"role"`
	// Content is the message text.
	Content string `json:"content"`
}

// Session describes the session a turn belongs to.
type Session struct {
	AgentName string `json:"agent_name"`
	SessionID string `json:"session_id"`
	// Key is the client-chosen session key, if any.
	Key string `json:"key,omitempty"`
	// Input is the opaque input given at session creation.
	Input []byte `json:"input,omitempty"`
}

// TurnRequest is what a worker receives for one turn.
type TurnRequest struct {
	// ABIVersion is Version of the host that sent the request.
	ABIVersion int `json:"abi_version"`
	// TurnRef must be echoed in the TurnResult.
	TurnRef TurnRef `json:"turn_ref"`
	Session Session `json:"session"`
	Event   Event   `json:"event"`
	// State is the session state committed by the previous turn (nil for a
	// new session). Encoded as base64 in JSON.
	State []byte `json:"state"`
	// Transcript is the most recent transcript messages, oldest first.
	Transcript []Message `json:"transcript"`
	// Attempt is 1 for the first attempt of this event, 2 for the first retry...
	Attempt int `json:"attempt"`
	// Steers are steers already attached to this turn (in acceptance order)
	// when it was dispatched; their messages follow the event's in the
	// transcript. Steers arriving later come through the guest's poll.
	Steers []Steer `json:"steers,omitempty"`
}

// AlarmOp sets, replaces or clears one named alarm of the session, a
// durable timer that fires as an EventAlarm event (docs/DESIGN.md "Alarms").
// Exactly one of InMs, At or Clear is given.
type AlarmOp struct {
	// Name identifies the alarm within the session (1–100 bytes).
	Name string `json:"name"`
	// InMs sets the alarm to fire this many milliseconds after the commit
	// (by the database's clock).
	InMs int64 `json:"in_ms,omitempty"`
	// At sets the alarm to fire at this absolute time.
	At *time.Time `json:"at,omitempty"`
	// EveryMs, with InMs or At, repeats the alarm at this period. Firings
	// missed while no host ran coalesce into one.
	EveryMs int64 `json:"every_ms,omitempty"`
	// Clear removes the alarm.
	Clear bool `json:"clear,omitempty"`
	// Data is given back in the alarm event (at most 64 KiB).
	Data json.RawMessage `json:"data,omitempty"`
}

// MaxAlarmOps bounds the alarm operations of one TurnResult.
const MaxAlarmOps = 32

// MinAlarmPeriodMs is the shortest repeat period of an alarm.
const MinAlarmPeriodMs = 1000

// MaxAlarmDelayMs bounds an alarm's in_ms and every_ms: 100 years (of
// 365.25 days). Due times must stay in the years RFC 3339 can write
// (0000–9999), or the alarm could be stored but neither listed nor fired.
const MaxAlarmDelayMs = 3_155_760_000_000

// Outcome says how a turn ended.
type Outcome string

// Turn outcomes. ok, sleep, finish and wait commit the turn; error fails the
// attempt (it is retried with backoff like a crash, and nothing of it is
// committed). sleep and finish both park the session until the next signal
// once no event of it is left open (finish with sleep_reason "finish");
// neither destroys it. wait commits the turn and opens the wait of
// TurnResult.Wait; the session sleeps (sleep_reason "wait") until it is
// resolved or expires, or another signal arrives.
const (
	OutcomeOK     Outcome = "ok"
	OutcomeSleep  Outcome = "sleep"
	OutcomeFinish Outcome = "finish"
	OutcomeWait   Outcome = "wait"
	OutcomeError  Outcome = "error"
)

// Valid reports whether o is one of the five outcomes.
func (o Outcome) Valid() bool {
	switch o {
	case OutcomeOK, OutcomeSleep, OutcomeFinish, OutcomeWait, OutcomeError:
		return true
	}
	return false
}

// TurnResult is a worker's reply to one TurnRequest.
type TurnResult struct {
	// TurnRef echoes TurnRequest.TurnRef.
	TurnRef TurnRef `json:"turn_ref"`
	// Messages are appended to the transcript after the event's own message.
	Messages []Message `json:"messages"`
	// State replaces the session state. JSON null (or absent) keeps the
	// previous state; "" clears it.
	State []byte `json:"state"`
	// Outcome is ok, sleep, finish or error.
	Outcome Outcome `json:"outcome"`
	// Error explains an error outcome.
	Error string `json:"error,omitempty"`
	// Alarms sets, replaces or clears alarms, committed with the turn.
	Alarms []AlarmOp `json:"alarms,omitempty"`
	// Wait is what an outcome "wait" waits for (required with it, refused
	// with any other outcome).
	Wait *WaitSpec `json:"wait,omitempty"`
}

// ErrInvalidResult is wrapped by Validate's errors.
var ErrInvalidResult = errors.New("invalid turn result")

// Validate checks a result against the v1 contract and the request it
// answers: outcome, roles, message count and state size. It does not check
// the fences; the store does that.
func (r *TurnResult) Validate() error {
	if !r.Outcome.Valid() {
		return fmt.Errorf("%w: outcome %q is not one of ok, sleep, finish, wait, error", ErrInvalidResult, r.Outcome)
	}
	if (r.Outcome == OutcomeWait) != (r.Wait != nil) {
		return fmt.Errorf("%w: outcome wait needs \"wait\" and only it takes one (outcome %q)", ErrInvalidResult, r.Outcome)
	}
	if r.Wait != nil {
		if err := r.Wait.Validate(); err != nil {
			return fmt.Errorf("%w: %v", ErrInvalidResult, err)
		}
	}
	if len(r.Messages) > MaxMessages {
		return fmt.Errorf("%w: %d messages, limit %d", ErrInvalidResult, len(r.Messages), MaxMessages)
	}
	for i, m := range r.Messages {
		switch m.Role {
		case RoleUser, RoleAssistant, RoleSystem, RoleTool:
		default:
			return fmt.Errorf("%w: messages[%d].role %q is not one of user, assistant, system, tool", ErrInvalidResult, i, m.Role)
		}
		if err := ValidText(m.Content); err != nil {
			return fmt.Errorf("%w: messages[%d].content %v", ErrInvalidResult, i, err)
		}
	}
	if len(r.State) > MaxStateBytes {
		return fmt.Errorf("%w: state is %d bytes, limit %d", ErrInvalidResult, len(r.State), MaxStateBytes)
	}
	if r.Outcome == OutcomeError && r.Error == "" {
		return fmt.Errorf("%w: outcome error without an error message", ErrInvalidResult)
	}
	if err := ValidText(r.Error); err != nil {
		// The text becomes the event's last_error, stored like transcript
		// text (PostgreSQL refuses NUL).
		return fmt.Errorf("%w: error %v", ErrInvalidResult, err)
	}
	if len(r.Alarms) > MaxAlarmOps {
		return fmt.Errorf("%w: %d alarm operations, limit %d", ErrInvalidResult, len(r.Alarms), MaxAlarmOps)
	}
	for i, a := range r.Alarms {
		if err := a.validate(); err != nil {
			return fmt.Errorf("%w: alarms[%d]: %v", ErrInvalidResult, i, err)
		}
	}
	return nil
}

// ValidText checks that s can be stored as transcript text everywhere:
// valid UTF-8 without NUL characters (PostgreSQL text cannot hold NUL).
func ValidText(s string) error {
	if !utf8.ValidString(s) {
		return errors.New("is not valid UTF-8")
	}
	if strings.IndexByte(s, 0) >= 0 {
		return errors.New("contains a NUL character (\\u0000)")
	}
	return nil
}

// SafeText returns s made storable as text everywhere (see ValidText):
// invalid UTF-8 sequences and NUL characters become U+FFFD. Hosts pass
// text a worker or guest controls — a failure's message, a guest's stderr —
// through it before storing it.
func SafeText(s string) string {
	if ValidText(s) == nil {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

func (a AlarmOp) validate() error {
	if a.Name == "" || len(a.Name) > 100 {
		return fmt.Errorf("name must be 1–100 bytes")
	}
	if err := ValidText(a.Name); err != nil {
		return fmt.Errorf("name %v", err)
	}
	set := 0
	if a.InMs != 0 {
		set++
		if a.InMs < 0 {
			return fmt.Errorf("in_ms %d is negative", a.InMs)
		}
	}
	if a.At != nil {
		set++
		if y := a.At.UTC().Year(); y < 0 || y > 9999 {
			return fmt.Errorf("alarm %q: at %s is outside the years 0000–9999 (UTC)", a.Name, a.At.Format(time.RFC3339))
		}
	}
	if a.InMs > MaxAlarmDelayMs || a.EveryMs > MaxAlarmDelayMs {
		return fmt.Errorf("alarm %q: in_ms and every_ms must be at most %d (100 years)", a.Name, int64(MaxAlarmDelayMs))
	}
	if a.Clear {
		set++
	}
	if set != 1 {
		return fmt.Errorf("alarm %q needs exactly one of in_ms, at or clear", a.Name)
	}
	if a.EveryMs != 0 && (a.Clear || a.EveryMs < MinAlarmPeriodMs) {
		return fmt.Errorf("alarm %q: every_ms must be at least %d and not used with clear", a.Name, MinAlarmPeriodMs)
	}
	if len(a.Data) > 64<<10 {
		return fmt.Errorf("alarm %q: data is %d bytes, limit 65536", a.Name, len(a.Data))
	}
	return nil
}

// TurnFunc is the one function an agent author implements, whatever kind of
// worker runs it (wasm guest, plugin, remote worker). The SDKs echo the
// TurnRef and keep the state when the returned result leaves State nil.
// Returning an error is the same as an OutcomeError result.
type TurnFunc func(ctx context.Context, req *TurnRequest) (*TurnResult, error)

// Run calls f and normalises its result: a nil result or an error becomes an
// OutcomeError result, the TurnRef is echoed, and an empty Outcome means ok.
// SDKs call it so that every worker kind behaves the same.
func Run(ctx context.Context, f TurnFunc, req *TurnRequest) (res *TurnResult) {
	defer func() {
		if p := recover(); p != nil {
			res = &TurnResult{Outcome: OutcomeError, Error: fmt.Sprintf("agent panic: %v", p)}
		}
		res.TurnRef = req.TurnRef
	}()
	res, err := f(ctx, req)
	if err != nil {
		return &TurnResult{Outcome: OutcomeError, Error: err.Error()}
	}
	if res == nil {
		return &TurnResult{Outcome: OutcomeError, Error: "agent returned no result"}
	}
	if res.Outcome == "" {
		res.Outcome = OutcomeOK
	}
	return res
}

// Marshal encodes v as JSON the way a TurnRequest (or steer) crosses to a
// worker: like encoding/json.Marshal, but without HTML escaping, so that
// '<', '>' and '&' stay one byte each instead of six ("\u003c"). The sizes
// checked against MaxRequestBytes are those of this encoding; with
// json.Marshal a message of 1 MiB of '<' would grow to 6 MiB and fail its
// turn although the API accepted it.
func Marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
