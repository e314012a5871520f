package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/paddock-dev/paddock/abi"
)

// ErrInvalid: the call's parameters are malformed (the API validates first,
// so reaching a driver with them is a caller bug). Every validation error
// of this file wraps it.
var ErrInvalid = errors.New("invalid parameters")

// Page sizes of list and transcript calls.
const (
	// DefaultPageLimit is the page size of a call that asks for none (≤ 0).
	DefaultPageLimit = 100
	// MaxPageLimit caps every page.
	MaxPageLimit = 1000
)

// PageLimit returns the page size a list call uses for the requested n:
// DefaultPageLimit when n ≤ 0, at most MaxPageLimit.
func PageLimit(n int) int {
	switch {
	case n <= 0:
		return DefaultPageLimit
	case n > MaxPageLimit:
		return MaxPageLimit
	}
	return n
}

// CheckLeaseTTL refuses a lease TTL that is not positive (ClaimActivation,
// RenewLeases), wrapping ErrInvalid.
func CheckLeaseTTL(ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("lease TTL %v must be positive: %w", ttl, ErrInvalid)
	}
	return nil
}

// AgentKind validates CreateAgent's parameters — a valid crash policy and
// a worker binding that fits the kind (a wasm agent names no plugin worker,
// a plugin agent no module) — and returns the kind to store: KindWasm (for
// "" too) or KindPlugin. Errors wrap ErrInvalid. Whether the named module
// or plugin worker exists is the database's foreign key's to decide.
func AgentKind(p CreateAgentParams) (string, error) {
	if p.Namespace != "" {
		if err := CheckNamespace(p.Namespace); err != nil {
			return "", err
		}
	}
	if !p.CrashPolicy.Valid() {
		return "", fmt.Errorf("crash policy %q: %w", p.CrashPolicy, ErrInvalid)
	}
	switch p.Kind {
	case "", KindWasm:
		if p.Plugin != "" {
			return "", fmt.Errorf("a wasm agent names no plugin worker (got %q): %w", p.Plugin, ErrInvalid)
		}
		return KindWasm, nil
	case KindPlugin:
		if p.ModuleDigest != "" {
			return "", fmt.Errorf("a plugin agent names no module (got %q): %w", p.ModuleDigest, ErrInvalid)
		}
		return KindPlugin, nil
	}
	return "", fmt.Errorf("agent kind %q: %w", p.Kind, ErrInvalid)
}

// PluginEnv validates a plugin worker registration (a name, Processes ≥ 1)
// and returns its environment encoded as a JSON object of strings, "{}" for
// a nil Env. Validation errors wrap ErrInvalid.
func PluginEnv(p PluginWorker) (string, error) {
	if p.Name == "" {
		return "", fmt.Errorf("empty plugin worker name: %w", ErrInvalid)
	}
	if p.Namespace != "" {
		if err := CheckNamespace(p.Namespace); err != nil {
			return "", err
		}
	}
	if p.Processes < 1 {
		return "", fmt.Errorf("plugin worker %q: processes %d, want at least 1: %w", p.Name, p.Processes, ErrInvalid)
	}
	if p.Env == nil {
		return "{}", nil
	}
	env, err := json.Marshal(p.Env)
	if err != nil {
		return "", fmt.Errorf("plugin worker %q: env: %w", p.Name, err)
	}
	return string(env), nil
}

// DecodePluginEnv decodes a plugin worker's stored environment (PluginEnv's
// encoding of worker name) into Env: never nil, empty for "{}" or "null".
func DecodePluginEnv(name, env string) (map[string]string, error) {
	var m map[string]string
	if err := json.Unmarshal([]byte(env), &m); err != nil {
		return nil, fmt.Errorf("plugin worker %q: env: %w", name, err)
	}
	if m == nil {
		m = map[string]string{}
	}
	return m, nil
}

// EventPayload checks a signal's payload (AppendEvent, Steer) and returns
// it as stored: empty means {}; anything else must be valid JSON (else an
// error wrapping ErrInvalid).
func EventPayload(payload json.RawMessage) (string, error) {
	if len(payload) == 0 {
		return "{}", nil
	}
	if !json.Valid(payload) {
		return "", fmt.Errorf("payload is not valid JSON: %w", ErrInvalid)
	}
	return string(payload), nil
}

// ClaimRefusal is ClaimActivation's answer for a session in status: nil
// when active, else ErrSessionSleeping or ErrSessionDestroyed naming key.
func ClaimRefusal(key ActorKey, status SessionStatus) error {
	switch status {
	case SessionActive:
		return nil
	case SessionDestroyed:
		return fmt.Errorf("session %s: %w", key, ErrSessionDestroyed)
	case SessionSleeping:
		return fmt.Errorf("session %s: %w", key, ErrSessionSleeping)
	}
	return fmt.Errorf("session %s: status %q", key, status)
}

// ClaimWake is ClaimActivation's rule for a session in status, asleep with
// sleepReason: wake is true when the claim wakes it in its transaction
// (wakeForCapacity is set and the session sleeps only for lack of
// capacity: CapacitySleepReasons, docs/DESIGN.md invariant 11); otherwise
// err is ClaimRefusal's answer. A session asleep for any other reason (the
// crash policy's sleep, the agent's sleep or finish, a wait) is never
// woken by a claim: ErrSessionSleeping.
func ClaimWake(key ActorKey, status SessionStatus, sleepReason string, wakeForCapacity bool) (wake bool, err error) {
	if wakeForCapacity && status == SessionSleeping && slices.Contains(CapacitySleepReasons(), sleepReason) {
		return true, nil
	}
	return false, ClaimRefusal(key, status)
}

// CheckModule refuses a module without a digest or with an invalid
// namespace, wrapping ErrInvalid.
func CheckModule(p PutModuleParams) error {
	if p.Digest == "" {
		return fmt.Errorf("empty module digest: %w", ErrInvalid)
	}
	if p.Namespace != "" {
		return CheckNamespace(p.Namespace)
	}
	return nil
}

// CheckSession refuses CreateSession parameters whose crash policy is
// neither empty (the agent's default applies) nor valid, wrapping
// ErrInvalid.
func CheckSession(p CreateSessionParams) error {
	if p.CrashPolicy != "" && !p.CrashPolicy.Valid() {
		return fmt.Errorf("crash policy %q: %w", p.CrashPolicy, ErrInvalid)
	}
	if p.DefaultCrashPolicy != "" && !p.DefaultCrashPolicy.Valid() {
		return fmt.Errorf("default crash policy %q: %w", p.DefaultCrashPolicy, ErrInvalid)
	}
	return nil
}

// NewSessionCrashPolicy is the crash policy CreateSession stores for a new
// session: p.CrashPolicy, else p.DefaultCrashPolicy, else "" (the driver
// then takes the agent's).
func NewSessionCrashPolicy(p CreateSessionParams) CrashPolicy {
	if p.CrashPolicy != "" {
		return p.CrashPolicy
	}
	return p.DefaultCrashPolicy
}

// CommitOutcome is the outcome a commit records: p.Outcome, or
// abi.OutcomeOK when empty.
func CommitOutcome(p CommitTurnParams) abi.Outcome {
	if p.Outcome == "" {
		return abi.OutcomeOK
	}
	return p.Outcome
}

// CheckCommitNext validates CommitTurnParams.Next before any database
// access: the next turn is asked of the committing turn's own activation
// (uid, session and epoch of Ref; ErrInvalid names what differs). Without
// a Next it returns nil.
func CheckCommitNext(p CommitTurnParams) error {
	n := p.Next
	if n == nil {
		return nil
	}
	a, r := n.Activation, p.Ref
	if a.UID != r.ActivationUID || a.AgentUID != r.AgentUID || a.SessionID != r.SessionID || a.ActorEpoch != r.ActorEpoch {
		return fmt.Errorf("next turn asked of activation %s of %s at epoch %d, the commit is of activation %s of %s at epoch %d: %w",
			a.UID, a.ActorKey, a.ActorEpoch, r.ActivationUID, KeyOf(r), r.ActorEpoch, ErrInvalid)
	}
	return nil
}

// CheckCommitDeferred validates CommitTurnParams.Deferred before any
// database access: its delivery and activation are Ref's (id, key,
// activation, epoch, event, revision), and the commit opens no wait.
// ErrInvalid names what differs. Without Deferred it returns nil.
func CheckCommitDeferred(p CommitTurnParams) error {
	d := p.Deferred
	if d == nil {
		return nil
	}
	if p.Wait != nil {
		return fmt.Errorf("a deferred turn's commit opens a wait (promote it first): %w", ErrInvalid)
	}
	got := d.Delivery.TurnRef()
	if got != p.Ref || d.Activation.UID != p.Ref.ActivationUID || d.Activation.ActorEpoch != p.Ref.ActorEpoch ||
		d.Activation.ActorKey != KeyOf(p.Ref) {
		return fmt.Errorf("deferred dispatch %s (activation %s at epoch %d) is not the commit's turn_ref %s: %w",
			got, d.Activation.UID, d.Activation.ActorEpoch, p.Ref, ErrInvalid)
	}
	return nil
}

// CheckClaimFirst validates ClaimActivationParams.First before any
// database access: the first turn is asked of the activation being claimed
// (its uid, lease id and key; ErrInvalid names what differs). Without a
// First it returns nil.
func CheckClaimFirst(p ClaimActivationParams) error {
	f := p.First
	if f == nil {
		return nil
	}
	if a := f.Activation; a.UID != p.UID || a.LeaseID != p.LeaseID || a.ActorKey != p.Key {
		return fmt.Errorf("first turn asked of activation %s (lease %s) of %s, the claim is of activation %s (lease %s) of %s: %w",
			a.UID, a.LeaseID, a.ActorKey, p.UID, p.LeaseID, p.Key, ErrInvalid)
	}
	if f.Activation.ActorEpoch == 0 && (!f.Defer || f.Expect == nil) {
		return fmt.Errorf("first turn of activation %s asked without its epoch: only a deferred first turn (Defer, Expect) may take the claim's: %w",
			p.UID, ErrInvalid)
	}
	return nil
}

// CheckNextDelivery validates NextDeliveryParams before any database
// access: the activation is named by its epoch (≥ 1, what its claim gave).
// Epoch 0 stands for "the claim's" only in a claim's deferred first turn
// (ClaimActivationParams.First, CheckClaimFirst); asked of NextDelivery it
// would match whatever epoch the activation has in one driver and none in
// the other, so it is refused with ErrInvalid.
func CheckNextDelivery(p NextDeliveryParams) error {
	if p.Activation.ActorEpoch < 1 {
		return fmt.Errorf("next delivery of activation %s asked at epoch %d: an activation's epoch is at least 1: %w",
			p.Activation.UID, p.Activation.ActorEpoch, ErrInvalid)
	}
	return nil
}

// PayloadMessage returns a signal payload's "message" string
// ({"message": "...", "data": {...}}) when it has a non-empty one.
func PayloadMessage(payload string) (string, bool) {
	var pl struct {
		Message *string `json:"message"`
	}
	if json.Unmarshal([]byte(payload), &pl) != nil || pl.Message == nil || *pl.Message == "" {
		return "", false
	}
	return *pl.Message, true
}

// TurnMessages is a committed turn's transcript: the user message of each
// payload — the event's, then its attached steers' in acceptance order, by
// PayloadMessage, none for a payload without one — then the worker's
// messages; Index counts from 0.
func TurnMessages(payloads []string, msgs []abi.Message) []TranscriptMessage {
	out := make([]TranscriptMessage, 0, len(payloads)+len(msgs))
	for _, p := range payloads {
		if text, ok := PayloadMessage(p); ok {
			out = append(out, TranscriptMessage{Index: len(out), Role: abi.RoleUser, Content: text})
		}
	}
	for _, m := range msgs {
		out = append(out, TranscriptMessage{Index: len(out), Role: m.Role, Content: m.Content})
	}
	return out
}

// AlarmPayload is the payload of the event a firing alarm appends:
// {"alarm": {"name", "due_at" (RFC 3339, UTC), "data"}}. data is the
// alarm's stored data ("" for none); data that is not JSON is given as a
// JSON string.
func AlarmPayload(name string, due time.Time, data string) (string, error) {
	f := abi.AlarmFired{Name: name, DueAt: due.UTC()}
	if data != "" {
		if json.Valid([]byte(data)) {
			f.Data = json.RawMessage(data)
		} else {
			b, err := json.Marshal(data)
			if err != nil {
				return "", fmt.Errorf("alarm %q: data: %w", name, err)
			}
			f.Data = b
		}
	}
	b, err := json.Marshal(struct {
		Alarm abi.AlarmFired `json:"alarm"`
	}{f})
	if err != nil {
		return "", fmt.Errorf("alarm %q: payload: %w", name, err)
	}
	return string(b), nil
}

// AlarmIdempotencyKey is the idempotency key of the event an alarm due at
// due appends, "alarm:<name>:<due unix ms>": each (session, alarm, due
// time) fires once across hosts.
func AlarmIdempotencyKey(name string, due time.Time) string {
	return fmt.Sprintf("alarm:%s:%d", name, due.UnixMilli())
}

// NotDeadLetter explains a redrive or discard whose compare-and-set on
// status dead_letter matched no row, from the event's status read after it
// ("" when the event does not exist): ErrNotFound, or a
// *NotDeadLetterError naming the status (errors.Is ErrConflict).
func NotDeadLetter(key ActorKey, eventID int64, status EventStatus) error {
	if status == "" {
		return fmt.Errorf("event %d of %s: %w", eventID, key, ErrNotFound)
	}
	return &NotDeadLetterError{Key: key, EventID: eventID, Status: status}
}

// CheckExistingSession decides a CreateSession whose key is taken by the
// live session existing: nil when p.GetOrCreate and p asks for that same
// session (CrashPolicy empty, meaning the agent's, or equal to the
// existing one's; Input empty, meaning no opinion, or byte-equal), which
// the driver then returns with created=false. Otherwise a
// *SessionExistsError (errors.Is ErrConflict) naming the existing session
// and the field: "key" without GetOrCreate, else "crash_policy" or
// "input", like a reused idempotency key with another signal.
func CheckExistingSession(existing Session, p CreateSessionParams) error {
	field := ""
	switch {
	case !p.GetOrCreate:
		field = "key"
	case p.CrashPolicy != "" && p.CrashPolicy != existing.CrashPolicy:
		field = "crash_policy"
	case len(p.Input) > 0 && !bytes.Equal(p.Input, existing.Input):
		field = "input"
	default:
		return nil
	}
	return &SessionExistsError{Existing: existing.ActorKey, Key: p.Key, Field: field}
}
