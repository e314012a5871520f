package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/paddock-dev/paddock/abi"
)

// ActorKey identifies a session: {agent_uid, session_id}.
type ActorKey struct {
	AgentUID  string `json:"agent_uid"`
	SessionID string `json:"session_id"`
}

// String renders the key as agent_uid/session_id.
func (k ActorKey) String() string { return k.AgentUID + "/" + k.SessionID }

// KeyOf returns the actor key a turn_ref names.
func KeyOf(ref abi.TurnRef) ActorKey {
	return ActorKey{AgentUID: ref.AgentUID, SessionID: ref.SessionID}
}

// CrashPolicy is what happens to a session after a failed attempt
// (docs/DESIGN.md "Failure, retry and crash policy").
type CrashPolicy string

// Crash policies.
const (
	CrashRestart CrashPolicy = "restart"
	CrashSleep   CrashPolicy = "sleep"
	CrashDestroy CrashPolicy = "destroy"
)

// Valid reports whether p is restart, sleep or destroy.
func (p CrashPolicy) Valid() bool {
	return p == CrashRestart || p == CrashSleep || p == CrashDestroy
}

// SessionStatus is the session state machine (docs/DESIGN.md "State machines").
type SessionStatus string

// Session statuses.
const (
	SessionActive    SessionStatus = "active"
	SessionSleeping  SessionStatus = "sleeping"
	SessionDestroyed SessionStatus = "destroyed"
)

// ActivationState is the activation state machine.
type ActivationState string

// Activation states; starting, active and draining are live.
const (
	ActivationStarting ActivationState = "starting"
	ActivationActive   ActivationState = "active"
	ActivationDraining ActivationState = "draining"
	ActivationStopped  ActivationState = "stopped"
	ActivationFailed   ActivationState = "failed"
)

// DeliveryState is the delivery state machine.
type DeliveryState string

// Delivery states.
const (
	DeliveryCreated    DeliveryState = "created"
	DeliverySent       DeliveryState = "sent"
	DeliveryAccepted   DeliveryState = "accepted"
	DeliverySendFailed DeliveryState = "send_failed"
	DeliverySuperseded DeliveryState = "superseded"
)

// EventStatus is the actor event state machine.
type EventStatus string

// Event statuses; open is the only non-terminal one.
const (
	EventOpen       EventStatus = "open"
	EventDone       EventStatus = "done"
	EventCancelled  EventStatus = "cancelled"
	EventDeadLetter EventStatus = "dead_letter"
	EventDiscarded  EventStatus = "discarded"
)

// OutcomeCancelled is the outcome of a transcript turn that records a
// cancelled in-flight turn (no worker result is committed with it).
const OutcomeCancelled abi.Outcome = "cancelled"

// Module is an uploaded wasm agent module, content-addressed by sha256.
type Module struct {
	// Namespace is the namespace the module was read in ("" from a read
	// of AnyNamespace): a module is stored once by digest and visible in
	// each namespace it was uploaded to.
	Namespace string `json:"namespace,omitempty"`
	// Digest is "sha256:" + lowercase hex of the module bytes.
	Digest     string `json:"digest"`
	Size       int64  `json:"size"`
	ABIVersion int    `json:"abi_version"`
	// CreatedAt is when it was first uploaded to Namespace (to any
	// namespace, from a read of AnyNamespace).
	CreatedAt time.Time `json:"created_at"`
	// Bytes is the module binary; empty in list results.
	Bytes []byte `json:"-"`
}

// Worker kinds an agent can be bound to (docs/DESIGN.md "Workers").
const (
	KindWasm   = "wasm"
	KindPlugin = "plugin"
)

// Agent is a registered agent definition.
type Agent struct {
	UID string `json:"uid"`
	// Namespace is the agent's namespace; Name is unique within it.
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Kind is the worker kind that runs the agent: wasm or plugin.
	Kind string `json:"kind"`
	// ModuleDigest is the wasm module a wasm agent runs ("" otherwise).
	ModuleDigest string `json:"module_digest,omitempty"`
	// Plugin is the plugin worker a plugin agent runs ("" otherwise).
	Plugin string `json:"plugin,omitempty"`
	// CrashPolicy is the default for sessions created without one.
	CrashPolicy CrashPolicy `json:"crash_policy"`
	CreatedAt   time.Time   `json:"created_at"`
	UpdatedAt   time.Time   `json:"updated_at"`
}

// PluginWorker is a registered plugin worker: a binary on the host's
// machine that serves agents over hashicorp/go-plugin.
type PluginWorker struct {
	// Namespace is the registration's namespace ("" when put: the
	// default); Name is unique within it, and agents of that namespace
	// name it.
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Path is the binary's path on the host.
	Path string `json:"path"`
	// SHA256 is the lowercase hex sha256 of the binary, checked at every
	// start of a plugin process.
	SHA256 string `json:"sha256"`
	// Env is the plugin's whole environment (it inherits nothing).
	Env map[string]string `json:"env,omitempty"`
	// Processes is how many plugin processes serve its sessions (≥ 1).
	Processes int       `json:"processes"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// SessionPeek is PeekSession's answer: the session row without its
// counters (OpenEvents and DeadLetters are 0), whether any event is open,
// and the session's agent row (what a controller needs before it claims an
// activation, in one read).
type SessionPeek struct {
	Session Session
	AnyOpen bool
	Agent   Agent
}

// Session is a session row with its counters.
type Session struct {
	ActorKey
	// Key is the optional client-chosen key, unique per agent.
	Key         string        `json:"key,omitempty"`
	Input       []byte        `json:"input,omitempty"`
	Status      SessionStatus `json:"status"`
	CrashPolicy CrashPolicy   `json:"crash_policy"`
	// ActorEpoch is the highest epoch issued for this actor key.
	ActorEpoch int64      `json:"actor_epoch"`
	CreatedAt  time.Time  `json:"created_at"`
	SleepTS    *time.Time `json:"sleep_ts,omitempty"`
	DestroyTS  *time.Time `json:"destroy_ts,omitempty"`
	// TurnCount is the number of committed turns.
	TurnCount int64 `json:"turn_count"`
	// EventCount is the number of accepted events.
	EventCount int64 `json:"event_count"`
	// OpenEvents is the number of events still open.
	OpenEvents int64 `json:"open_events"`
	// DeadLetters is the number of dead-lettered events.
	DeadLetters int64 `json:"dead_letters"`
	// PendingSince is set while the session waits for capacity on a host.
	PendingSince *time.Time `json:"pending_since,omitempty"`
	// SleepReason says why the session sleeps (crash, capacity, pending
	// timeout, agent); empty when active.
	SleepReason string `json:"sleep_reason,omitempty"`
}

// Event is an actor event row.
type Event struct {
	ID int64 `json:"id"`
	ActorKey
	// Seq is the acceptance order within the session, from 1.
	Seq  int64  `json:"seq"`
	Kind string `json:"kind"`
	// Payload is the signal body as JSON: {"message": "...", "data": {...}}.
	Payload        json.RawMessage `json:"payload"`
	IdempotencyKey string          `json:"idempotency_key,omitempty"`
	Status         EventStatus     `json:"status"`
	// Attempts counts failed attempts that a worker had accepted.
	Attempts      int       `json:"attempts"`
	NextAttemptAt time.Time `json:"next_attempt_at"`
	LastError     string    `json:"last_error,omitempty"`
	// Binding is the module digest recorded at the first attempt
	// (docs/DESIGN.md invariant 10); empty before it.
	Binding    string     `json:"binding,omitempty"`
	AcceptedAt time.Time  `json:"accepted_at"`
	ClosedAt   *time.Time `json:"closed_at,omitempty"`
	// SteerOf is, for a steer attached to a turn in flight, the event that
	// turn handles; the steer is closed with it. 0 otherwise.
	SteerOf int64 `json:"steer_of,omitempty"`
	// Redrives counts how often the event was redriven from dead_letter.
	Redrives int `json:"redrives,omitempty"`
	// Traceparent is the W3C traceparent of the signal's acceptance
	// (AppendEventParams.Traceparent): the turn's spans join that trace.
	// Empty when none was given.
	Traceparent string `json:"traceparent,omitempty"`
}

// AttemptError is one failed attempt of an event: its error chain entry.
type AttemptError struct {
	EventID    int64     `json:"event_id"`
	Attempt    int       `json:"attempt"`
	ActorEpoch int64     `json:"actor_epoch"`
	Counted    bool      `json:"counted"`
	Error      string    `json:"error"`
	FailedAt   time.Time `json:"failed_at"`
}

// DeadLetter is a dead-lettered event with its error chain.
type DeadLetter struct {
	Event  Event          `json:"event"`
	Errors []AttemptError `json:"errors"`
}

// Alarm is a durable timer of a session.
type Alarm struct {
	ActorKey
	Name  string    `json:"name"`
	DueAt time.Time `json:"due_at"`
	// EveryMs is the repeat period, 0 for a one-shot alarm.
	EveryMs int64           `json:"every_ms,omitempty"`
	Data    json.RawMessage `json:"data,omitempty"`
	SetAt   time.Time       `json:"set_at"`
}

// Activation is the runtime lease projection of a live session.
type Activation struct {
	UID string `json:"activation_uid"`
	ActorKey
	ActorEpoch     int64           `json:"actor_epoch"`
	LeaseID        string          `json:"lease_id"`
	LeaseExpiresAt time.Time       `json:"lease_expires_at"`
	CurrentEventID int64           `json:"current_event_id,omitempty"` // 0 = none
	Revision       int64           `json:"revision"`
	State          ActivationState `json:"state"`
	HostID         string          `json:"host_id"`
	// First is the turn ClaimActivation took for the new activation
	// (ClaimActivationParams.First); nil otherwise, and in every other
	// read of an activation.
	First *Dispatch `json:"-"`
}

// Ref returns the activation's compare-and-set identity.
func (a Activation) Ref() ActivationRef {
	return ActivationRef{UID: a.UID, ActorKey: a.ActorKey, ActorEpoch: a.ActorEpoch, LeaseID: a.LeaseID}
}

// ActivationRef is what maintenance writes compare-and-set on: actor key,
// activation uid, epoch and lease id.
type ActivationRef struct {
	UID string
	ActorKey
	ActorEpoch int64
	LeaseID    string
}

// Delivery is a delivery row: the fence tuple copied from the activation.
type Delivery struct {
	ID string `json:"delivery_id"`
	ActorKey
	ActivationUID string        `json:"activation_uid"`
	ActorEpoch    int64         `json:"actor_epoch"`
	EventID       int64         `json:"actor_event_id"`
	Revision      int64         `json:"revision"`
	State         DeliveryState `json:"state"`
	Binding       string        `json:"binding"`
}

// TurnRef returns the fence tuple a worker must echo.
func (d Delivery) TurnRef() abi.TurnRef {
	return abi.TurnRef{
		DeliveryID: d.ID, ActivationUID: d.ActivationUID, ActorEpoch: d.ActorEpoch,
		ActorEventID: d.EventID, Revision: d.Revision, AgentUID: d.AgentUID, SessionID: d.SessionID,
	}
}

// TranscriptMessage is one message of a committed turn.
type TranscriptMessage struct {
	// Index is the message's position within its turn, from 0.
	Index   int    `json:"index"`
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Turn is one committed turn with its messages.
type Turn struct {
	ActorKey
	// TurnNo is the turn's position in the transcript, from 1.
	TurnNo      int64               `json:"turn_no"`
	EventID     int64               `json:"actor_event_id"`
	DeliveryID  string              `json:"delivery_id"`
	ActorEpoch  int64               `json:"actor_epoch"`
	Outcome     abi.Outcome         `json:"outcome"`
	CommittedAt time.Time           `json:"committed_at"`
	Messages    []TranscriptMessage `json:"messages"`
	// Usage is the turn's model-token usage: the sum over its event's
	// journal rows that are not set aside (docs/DESIGN.md invariant 12), as
	// of the commit (CommitTurn; for a cancelled turn, CancelEvent), stored
	// with the turn and read back by Transcript.
	Usage abi.Usage `json:"usage"`
	// NextOpen is a hint set by CommitTurn: whether the session had another
	// open event (not a steer) when the turn committed. False lets a
	// controller wait for a wake-up instead of asking NextDelivery at once
	// (an event appended later wakes it), and dispatch the event of that
	// wake-up without a read (host/wakedispatch.go). A driver that does not
	// compute it must report true.
	NextOpen bool `json:"-"`
	// Next is the session's next turn when CommitTurnParams.Next asked for
	// it and the driver took an event in the commit's transaction: the
	// Dispatch NextDelivery would have returned right after the commit. Nil
	// when nothing was due, the activation could not take it, or the driver
	// left it to NextDelivery (the caller then calls it as usual).
	Next *Dispatch `json:"-"`
}

// Dispatch is everything a controller needs to run one turn: the delivery
// (with its fence tuple), the event, and the session's inputs.
type Dispatch struct {
	Delivery Delivery
	Event    Event
	// Session is the session row without its counters (OpenEvents and
	// DeadLetters are 0): counting costs O(the session's open events), and
	// a turn's cost must not grow with the events waiting behind it.
	Session Session
	// State is the committed session state: nil when none was ever
	// committed (or the last commit removed it), non-nil empty when an
	// empty state was committed (see StateFromColumn).
	State []byte
	// Tail is the most recent transcript messages, oldest first.
	Tail []abi.Message
	// Attempt is Event.Attempts + 1.
	Attempt int
	// Steers are the steer events attached to Event (SteerOf = Event.ID),
	// in acceptance order.
	Steers []Event
	// Agent is what the agent runs as NextDelivery read it with the event
	// (under the activation's lock): a caller passes it back, with the
	// binding Bind gives for it, as the next call's
	// NextDeliveryParams.Expect.
	Agent AgentBinding
	// Deferred says nothing of this dispatch was written
	// (NextDeliveryParams.Defer): Delivery is what NextDelivery would have
	// created (state sent), but no row has it yet, the event is not the
	// activation's current one, its binding is not recorded and no
	// turn.started frame exists. Promote writes them, or CommitTurn with
	// CommitTurnParams.Deferred writes them with the commit.
	Deferred bool
}

// Deferrable is the rule of NextDeliveryParams.Defer, shared by the
// drivers: only an event's first attempt — nothing of it ever written: no
// attempt counted, no binding recorded (so no earlier delivery and no
// journal to replay) — with no steers attached is dispatched deferred;
// anything else is taken at once. recorded is the event's binding as
// stored before the dispatch.
func Deferrable(attempts int, recorded string, steers int) bool {
	return attempts == 0 && recorded == "" && steers == 0
}

// DeferredOf is the deferred dispatch of e (Dispatch.Deferred, attempt 1)
// under the activation ref at its revision, with the delivery id
// deliveryID and what x says the agent runs: the delivery NextDelivery
// would have created (state sent), nothing of it written. The caller has
// checked Deferrable and fills Session, State and Tail. It is shared by
// PostgreSQL's deferred read and the host's dispatch from a wake-up
// (docs/DESIGN.md "Deferred dispatch"), whose commit checks what a read
// would have.
func DeferredOf(ref ActivationRef, revision int64, deliveryID string, x ExpectedBinding, e Event) Dispatch {
	e.Binding = x.Binding
	return Dispatch{
		Event: e, Agent: x.Agent, Attempt: 1, Deferred: true,
		Delivery: Delivery{
			ID: deliveryID, ActorKey: ref.ActorKey, ActivationUID: ref.UID, ActorEpoch: ref.ActorEpoch,
			EventID: e.ID, Revision: revision, State: DeliverySent, Binding: x.Binding,
		},
	}
}

// Store is the interface the host needs. Methods take a context (drivers
// put a deadline on every call) and return the typed errors of errors.go.
type Store interface {
	// Driver is "sqlite" or "postgres".
	Driver() string
	// Close releases connections.
	Close() error

	// PutModule stores a module by digest and makes it visible in
	// p.Namespace; created is false when it was visible there already.
	PutModule(ctx context.Context, p PutModuleParams) (m Module, created bool, err error)
	// GetModule returns the module with its bytes if it is visible in
	// namespace (AnyNamespace: the runtime's read by digest), or
	// ErrNotFound.
	GetModule(ctx context.Context, namespace, digest string) (Module, error)
	// ListModules returns the modules visible in namespace (AnyNamespace:
	// every module) without bytes, newest first.
	ListModules(ctx context.Context, namespace string) ([]Module, error)

	// CreateAgent registers an agent. A name already taken returns
	// ErrConflict unless p.Upsert, which updates binding and policy instead.
	// An unknown module digest returns ErrNotFound.
	CreateAgent(ctx context.Context, p CreateAgentParams) (Agent, error)
	// GetAgent finds an agent of namespace by name or uid, or returns
	// ErrNotFound (also for an agent of another namespace). AnyNamespace
	// finds an agent of any namespace by uid only.
	GetAgent(ctx context.Context, namespace, nameOrUID string) (Agent, error)
	// ListAgents returns the agents of namespace (AnyNamespace: of every
	// namespace) by name.
	ListAgents(ctx context.Context, namespace string) ([]Agent, error)

	// PutPluginWorker registers a plugin worker in p.Namespace (""
	// default), or replaces the registration of that name there (created
	// false).
	PutPluginWorker(ctx context.Context, p PluginWorker) (w PluginWorker, created bool, err error)
	// GetPluginWorker returns a plugin worker of namespace by name, or
	// ErrNotFound.
	GetPluginWorker(ctx context.Context, namespace, name string) (PluginWorker, error)
	// ListPluginWorkers returns the plugin workers of namespace
	// (AnyNamespace: of every namespace) by namespace and name.
	ListPluginWorkers(ctx context.Context, namespace string) ([]PluginWorker, error)

	// CreateSession creates a session. A Key is unique per agent among
	// sessions that are not destroyed (a destroyed session's key makes a
	// new session). With a Key a live session holds it returns a
	// *SessionExistsError naming that session (errors.Is ErrConflict), or,
	// when p.GetOrCreate, the existing session and created=false, unless
	// p's CrashPolicy (when set) or Input differs from the session's, which
	// is refused with a *SessionExistsError naming the field
	// (CheckExistingSession). An unknown agent returns ErrNotFound.
	CreateSession(ctx context.Context, p CreateSessionParams) (s Session, created bool, err error)
	// GetSession returns the session with its counters, or ErrNotFound.
	// The counters cost O(the session's open events); the host's own
	// reads use PeekSession.
	GetSession(ctx context.Context, key ActorKey) (Session, error)
	// PeekSession returns the session without its counters, whether
	// any of its events is open (the first entry of the open-events
	// index) and its agent's row, or ErrNotFound: what a controller reads
	// before claiming, in one round trip, at a cost that does not grow
	// with the events waiting.
	PeekSession(ctx context.Context, key ActorKey) (SessionPeek, error)
	// ListSessions pages an agent's sessions by session id.
	ListSessions(ctx context.Context, p ListSessionsParams) ([]Session, error)
	// SessionState returns the committed session state: nil before the
	// first turn that set one, []byte{} (non-nil) when the state committed
	// is empty. Unknown session: ErrNotFound.
	SessionState(ctx context.Context, key ActorKey) ([]byte, error)

	// AppendEvent persists a signal as an actor event (next seq of the
	// session). An idempotency key already used in this session returns the
	// first event and created=false (invariant 7). Unknown session:
	// ErrNotFound; destroyed session: ErrSessionDestroyed. With
	// p.RefuseIfInFlight, a session whose live activation has a current
	// event gets a *TurnInFlightError (errors.Is ErrConflict) and nothing
	// is written, decided in the append's transaction; a re-send of an
	// accepted key still returns the first event.
	AppendEvent(ctx context.Context, p AppendEventParams) (e Event, created bool, err error)
	// ListEvents pages a session's events by id, optionally by status.
	ListEvents(ctx context.Context, p ListEventsParams) ([]Event, error)

	// ClaimActivation starts a new activation for the key: epoch =
	// session epoch + 1, a fresh lease id and lease. With a live activation
	// present it returns ErrActivationLive (invariant 1, decided by the
	// partial unique index). Unknown session: ErrNotFound; destroyed:
	// ErrSessionDestroyed.
	ClaimActivation(ctx context.Context, p ClaimActivationParams) (Activation, error)
	// RenewLeases extends, in one statement, the leases of the given live,
	// unexpired activations held by p.HostID (compare-and-set on uid, key,
	// epoch and lease id). It returns the refs still held — renewed, or (a
	// driver may do this) skipped because a turn transaction held the row
	// at that instant, to be renewed next time; the others are lost.
	RenewLeases(ctx context.Context, p RenewLeasesParams) ([]ActivationRef, error)
	// StopActivation ends a live activation with no current event
	// (compare-and-set). It returns ErrNotLive when the activation is no
	// longer live, or has a current event, under that ref.
	StopActivation(ctx context.Context, ref ActivationRef) error
	// NextDelivery takes the session's oldest open event if it is due (DB
	// clock), makes it the activation's current event and creates its
	// delivery. It returns *NoDueEventError when nothing is due, and
	// ErrNotLive when the activation is not live under ref.
	NextDelivery(ctx context.Context, p NextDeliveryParams) (Dispatch, error)
	// Promote writes a deferred dispatch (Dispatch.Deferred) as
	// NextDelivery would have written it: the event becomes the
	// activation's current one, its binding is recorded, the delivery is
	// created sent and turn.started appended — only if, inside the
	// transaction, the activation is still live and idle at that epoch and
	// revision with an unexpired lease, the event is still the session's
	// due candidate (first attempt, no binding recorded) and the agent still
	// runs what the dispatch read. Otherwise nothing is written and it returns a
	// *FenceError classified by ClassifyFence with FencePromote (the
	// activation not live or of another epoch: stale_epoch; another
	// revision: stale_revision; lease expired: expired_lease; another
	// candidate, the event closed or the agent changed:
	// superseded_delivery). A delivery id already used is ErrConflict.
	Promote(ctx context.Context, p PromoteParams) error
	// MarkDeliverySent moves a delivery created → sent (invariant 9).
	MarkDeliverySent(ctx context.Context, ref abi.TurnRef) error
	// CommitTurn checks the fences and, in the same transaction, appends the
	// turn (the event's message first, then p.Messages), replaces the state,
	// closes the event done, accepts the delivery and clears the current
	// event. Outcome sleep or finish parks the session (OutcomeSleepReason)
	// unless another event is open. A mismatch writes nothing and returns
	// *FenceError.
	CommitTurn(ctx context.Context, p CommitTurnParams) (Turn, error)
	// FailAttempt records a failed attempt under the same fences as a commit
	// (lease expiry aside): activation failed, delivery superseded (or
	// send_failed when !p.Counted), event attempts+1 when p.Counted,
	// next_attempt_at = DB now + p.Backoff, dead letter once attempts reach
	// p.MaxAttempts. A mismatch writes nothing and returns *FenceError.
	FailAttempt(ctx context.Context, p FailAttemptParams) (FailResult, error)
	// ExpiredActivations lists live activations whose lease expired (DB clock).
	ExpiredActivations(ctx context.Context, limit int) ([]ActivationRef, error)
	// ExpireActivation is the watchdog's write: compare-and-set on ref with
	// the lease expired, it fails the activation; a current event whose
	// delivery was sent counts an attempt (the worker had it), one only
	// created does not. Returns ErrNotLive when ref no longer matches, and
	// without waiting when a transaction in progress holds the activation
	// (a commit, or a host stalled mid-turn): the next scan looks again.
	ExpireActivation(ctx context.Context, p ExpireActivationParams) (FailResult, error)
	// RunnableSessions lists sessions with a due open event and no live
	// activation that are active or asleep for lack of capacity
	// (CapacitySleepReasons: the host wakes them when it has a slot, docs/DESIGN.md
	// invariant 11), oldest due first; sessions of p.BlockedAgents that
	// hold a dead letter are left out (dead-letter policy "block"), and
	// sessions of p.SkipAgents altogether.
	RunnableSessions(ctx context.Context, p RunnableSessionsParams) ([]ActorKey, error)
	// Transcript pages committed turns with their messages, by turn number.
	Transcript(ctx context.Context, p TranscriptParams) ([]Turn, error)
	// DestroySession destroys a session (idempotent): status destroyed,
	// destroy_ts, open events discarded, alarms deleted, a live activation
	// failed (so a reply in flight is fenced off). Unknown: ErrNotFound.
	DestroySession(ctx context.Context, key ActorKey) (Session, error)
	// WakeSession moves a sleeping session to active (a no-op when active).
	// Destroyed: ErrSessionDestroyed; unknown: ErrNotFound.
	WakeSession(ctx context.Context, key ActorKey) (Session, error)
	// SleepSession parks an active session with no live activation:
	// sleeping, sleep_ts, p.Reason. Destroyed: ErrSessionDestroyed; a live
	// activation: ErrActivationLive.
	SleepSession(ctx context.Context, p SleepSessionParams) (Session, error)
	// SetPending records (or clears, with pending=false) that the session
	// waits for capacity, for the API.
	SetPending(ctx context.Context, key ActorKey, pending bool) error

	// ListDeadLetters pages dead-lettered events by event id, of one agent
	// or one session, each with its error chain.
	ListDeadLetters(ctx context.Context, p ListDeadLettersParams) ([]DeadLetter, error)
	// RedriveEvent re-opens a dead-lettered event for a new attempt under a
	// new epoch: status open, attempts 0, due now, redrives+1, session epoch
	// +1, a sleeping session woken. Not dead-lettered: a
	// *NotDeadLetterError (errors.Is ErrConflict).
	RedriveEvent(ctx context.Context, key ActorKey, eventID int64) (Event, error)
	// DiscardEvent closes a dead-lettered event as discarded. Not
	// dead-lettered: a *NotDeadLetterError (errors.Is ErrConflict).
	DiscardEvent(ctx context.Context, key ActorKey, eventID int64) (Event, error)
	// EventErrors returns an event's error chain, oldest first.
	EventErrors(ctx context.Context, key ActorKey, eventID int64) ([]AttemptError, error)

	// Steer persists a steer signal. With a turn in flight (the live
	// activation has a current event whose delivery is sent) it raises the
	// activation's revision, supersedes that delivery, creates a new sent one
	// with the new revision (p.DeliveryID) and attaches the steer event to the
	// current event; otherwise the steer is queued like a message. Errors as
	// AppendEvent.
	Steer(ctx context.Context, p SteerParams) (SteerResult, error)
	// CancelEvent cancels an event. The event in flight (p.EventID 0 means
	// "the current one"): status cancelled, its delivery superseded, the
	// activation's current event cleared and revision raised, a transcript
	// turn with outcome cancelled recorded, its steers cancelled. A queued
	// open event: status cancelled. Already closed: ErrConflict; nothing in
	// flight with EventID 0: ErrNotFound.
	CancelEvent(ctx context.Context, p CancelEventParams) (CancelResult, error)
	// InFlight returns, for a live activation, the newest delivery of its
	// current event and that event's attached steers, so a controller can
	// tell whether its running turn was steered or cancelled. No current
	// event or not live: ErrNotLive.
	InFlight(ctx context.Context, ref ActivationRef) (Dispatch, error)

	// ListAlarms returns a session's alarms by name.
	ListAlarms(ctx context.Context, key ActorKey) ([]Alarm, error)
	// FireDueAlarms fires up to limit due alarms (DB clock), oldest first,
	// in transactions of a batch of alarms (possibly of several sessions),
	// each alarm by its own compare-and-set on (key, name, due_at): an
	// EventAlarm event is appended
	// with idempotency key "alarm:<name>:<due unix ms>" (so each (session,
	// alarm, due time) fires once across hosts), a sleeping session is woken,
	// and the alarm is deleted or, if it repeats, moved to its next due time
	// after now (missed firings coalesce). Alarms of destroyed sessions are
	// deleted. It returns the keys that received events.
	FireDueAlarms(ctx context.Context, limit int) ([]ActorKey, error)

	// HostCalls returns an event's journal, set-aside rows included, by
	// Seq then ID. Unknown session: ErrNotFound.
	HostCalls(ctx context.Context, key ActorKey, eventID int64) ([]HostCall, error)
	// RecordHostCall appends a host call to its event's journal under the
	// attempt's fences (docs/DESIGN.md invariant 12): a zombie attempt's
	// row is refused with *FenceError and nothing is written. A journal row
	// not set aside already at that (event, Seq) returns ErrConflict.
	RecordHostCall(ctx context.Context, p RecordHostCallParams) (HostCall, error)
	// ReplayHostCall records that the attempt of ref replayed the journal
	// row (event, seq) instead of calling again (Replays+1, ReplayedEpoch),
	// under the same fences as RecordHostCall. No such row not set aside:
	// ErrNotFound.
	ReplayHostCall(ctx context.Context, ref abi.TurnRef, seq int) error
	// AgentTokensSince sums the input and output tokens of an agent's
	// journal rows started at or after since (set-aside rows included: they
	// were paid for).
	AgentTokensSince(ctx context.Context, agentUID string, since time.Time) (int64, error)
	// NamespaceTokensSince is AgentTokensSince summed over the agents of
	// namespace (its model_tokens_per_day quota).
	NamespaceTokensSince(ctx context.Context, namespace string, since time.Time) (int64, error)
	// LiveSessionsUpTo counts the sessions of namespace's agents that are
	// not destroyed, reading at most limit of them: min(count, limit), the
	// cost of a live_sessions quota check bounded by the quota.
	LiveSessionsUpTo(ctx context.Context, namespace string, limit int64) (int64, error)

	// PutSecret stores a secret's sealed value (encrypted by the caller;
	// the store never sees the plain value) in namespace ("" default),
	// creating or replacing it.
	PutSecret(ctx context.Context, namespace, name string, sealed []byte) (s Secret, created bool, err error)
	// SealedSecret returns the sealed value of a secret of namespace, or
	// ErrNotFound.
	SealedSecret(ctx context.Context, namespace, name string) ([]byte, error)
	// ListSecrets returns the metadata of namespace's secrets
	// (AnyNamespace: of every namespace) by namespace and name.
	ListSecrets(ctx context.Context, namespace string) ([]Secret, error)
	// DeleteSecret deletes a secret of namespace, or returns ErrNotFound.
	DeleteSecret(ctx context.Context, namespace, name string) error

	// CreateToken stores a token (CheckToken: ErrInvalid); an id that
	// exists: ErrConflict. CreatedAt is the database clock.
	CreateToken(ctx context.Context, p CreateTokenParams) (Token, error)
	// GetToken returns a token by id, revoked or not (with its Hash: the
	// authentication reads it), or ErrNotFound.
	GetToken(ctx context.Context, id string) (Token, error)
	// ListTokens returns the tokens of namespace ("" = every namespace),
	// revoked ones included, oldest first, without their hashes.
	ListTokens(ctx context.Context, namespace string) ([]Token, error)
	// RevokeToken revokes a token and returns it. Revoking a revoked token
	// changes nothing and returns it with its first RevokedAt. Unknown id:
	// ErrNotFound.
	RevokeToken(ctx context.Context, id string) (Token, error)
	// AppendAudit appends a row to the audit log (CheckAudit: ErrInvalid)
	// stamped with the database clock.
	AppendAudit(ctx context.Context, p AppendAuditParams) (AuditEntry, error)
	// ListAudit returns a page of the audit log, newest first
	// (CheckListAudit: ErrInvalid).
	ListAudit(ctx context.Context, p ListAuditParams) ([]AuditEntry, error)

	// AppendChunks appends one chunk frame (a batch of the attempt's
	// chunks, body from CheckChunks) to the session stream under the
	// attempt's fences (as RecordHostCall): a stale attempt's chunks are
	// refused with *FenceError and nothing is written.
	AppendChunks(ctx context.Context, p AppendChunksParams) (Frame, error)
	// RestartStream says on the stream that the attempt's output so far
	// is void and its turn runs again in the same attempt (a steer's
	// rerun): a turn.retrying frame (body AttemptEndedBody with p.Reason,
	// no NextAttemptAt) then a turn.started frame (TurnStartedBody of the
	// event), both of p.Ref's event, epoch and p.Attempt, in one
	// transaction under the fences of AppendChunks: a stale ref is
	// refused with *FenceError and nothing is written. The rerun's chunk
	// offsets start at 0 again. It returns the two frames in order.
	RestartStream(ctx context.Context, p RestartStreamParams) ([]Frame, error)
	// StreamFrames pages a session's stream by Seq. Unknown session:
	// ErrNotFound.
	StreamFrames(ctx context.Context, p StreamFramesParams) (StreamPage, error)
	// StreamHeads returns the last frame Seq of each of keys that has one
	// (absent: none yet, or unknown): one statement, for hosts that poll
	// the sessions their clients watch.
	StreamHeads(ctx context.Context, keys []ActorKey) (map[ActorKey]int64, error)
	// CompactStream deletes up to p.Limit frames created before p.Before
	// whose event is not open (frames without an event by age alone); it
	// returns how many it deleted. Seq numbering is not reset.
	CompactStream(ctx context.Context, p CompactStreamParams) (int, error)

	// ResolveWait resolves an open wait in one transaction: status
	// resolved, Resolution stored, frame wait.resolved; kind wait appends
	// a wait.resolved event (payload WaitEventPayload, idempotency key
	// "wait:<id>"); kind approval releases its held event (due now); a
	// sleeping session is woken. Unknown session or wait: ErrNotFound;
	// destroyed session: ErrSessionDestroyed; not open: *WaitClosedError
	// (ErrConflict when resolved, ErrGone when expired or cancelled).
	ResolveWait(ctx context.Context, p ResolveWaitParams) (Wait, error)
	// GetWait returns one wait, or ErrNotFound.
	GetWait(ctx context.Context, key ActorKey, waitID string) (Wait, error)
	// ListWaits pages an agent's or a session's waits, oldest first.
	ListWaits(ctx context.Context, p ListWaitsParams) (WaitPage, error)
	// ExpireDueWaits expires up to limit open waits whose expires_at
	// passed (DB clock), each by compare-and-set: status expired, frame
	// wait.resolved; kind wait appends a wait.expired event (idempotency
	// key "wait:<id>"); kind approval releases its held event (the call is
	// then refused as not approved); a sleeping session is woken. It
	// returns the keys that have something to run.
	ExpireDueWaits(ctx context.Context, limit int) ([]ActorKey, error)

	// ListAgentVersions pages an agent's versions (AgentVersion), newest
	// first; CreateAgent appends them (NewAgentVersion). Unknown agent: an
	// empty page.
	ListAgentVersions(ctx context.Context, p ListAgentVersionsParams) ([]AgentVersion, error)
	// CurrentActivation returns a session's live activation, or else its
	// last one, with the database clock; ErrNotFound when it never had one.
	CurrentActivation(ctx context.Context, key ActorKey) (ActivationInfo, error)
	// BrowseSessions pages sessions of every agent or one by (agent uid,
	// session id), filtered by status, sleep reason, pending, key (each
	// decided by an index) and text (within at most BrowseScan rows), in
	// one statement; it builds its page with BrowsePage. Invalid params
	// (CheckBrowse): ErrInvalid.
	BrowseSessions(ctx context.Context, p BrowseSessionsParams) (SessionPage, error)
	// ClusterFigures reads the overview's figures in one snapshot.
	ClusterFigures(ctx context.Context) (ClusterFigures, error)

	// Subscribe returns a channel of actor keys that received events
	// (postgres: LISTEN/NOTIFY from every host; sqlite: this process). It is
	// a wake-up hint only; it closes when ctx ends.
	Subscribe(ctx context.Context) (<-chan ActorKey, error)
}

// EchoSubscriber is a Store whose wake-ups also come back to the process
// that wrote (postgres: a NOTIFY reaches the sender's own listener too).
// A host that already woke its controller for an append it made need not
// act on that append's echo (host.Host.Appended); the other hints it must.
type EchoSubscriber interface {
	// SubscribeEchoes is Subscribe whose hints say which ones are the echo
	// of an AppendEvent or Steer that appended an event through this very
	// Store value (Wakeup.EchoSeq).
	SubscribeEchoes(ctx context.Context) (<-chan Wakeup, error)
}

// Wakeup is one of SubscribeEchoes' hints: Key received events.
type Wakeup struct {
	Key ActorKey
	// EchoSeq is the seq of the event whose append, made through the
	// subscribing Store value by AppendEvent or Steer, sent this hint; 0
	// for every other hint (another process's writes, and writes other than
	// those appends).
	EchoSeq int64
}

// PutModuleParams are PutModule's inputs.
type PutModuleParams struct {
	// Namespace is where the module becomes visible ("" default).
	Namespace  string
	Digest     string
	ABIVersion int
	Bytes      []byte
}

// CreateAgentParams are CreateAgent's inputs. Kind "" means wasm. A wasm
// agent names an existing module (else ErrNotFound); a plugin agent names
// an existing plugin worker (else ErrNotFound).
type CreateAgentParams struct {
	// UID is generated by the caller (a UUID).
	UID string
	// Namespace is the agent's namespace ("" default); its module or
	// plugin worker must be visible there.
	Namespace    string
	Name         string
	Kind         string
	ModuleDigest string
	Plugin       string
	CrashPolicy  CrashPolicy
	Upsert       bool
}

// CreateSessionParams are CreateSession's inputs.
type CreateSessionParams struct {
	AgentUID string
	// SessionID is generated by the caller (a UUID).
	SessionID string
	Key       string
	Input     []byte
	// CrashPolicy is the session's crash policy as the caller asked for
	// it; empty for none (a get-or-create then accepts the existing
	// session's, whatever it is).
	CrashPolicy CrashPolicy
	// DefaultCrashPolicy is a new session's policy when CrashPolicy is
	// empty (empty: the agent's); it is never compared with an existing
	// session's (the host's configured default may have changed since).
	DefaultCrashPolicy CrashPolicy
	GetOrCreate        bool
}

// ListSessionsParams page an agent's sessions.
type ListSessionsParams struct {
	AgentUID string
	// After is the last session id of the previous page ("" = start).
	After string
	Limit int
}

// AppendEventParams are AppendEvent's inputs.
type AppendEventParams struct {
	Key            ActorKey
	Kind           string
	Payload        json.RawMessage
	IdempotencyKey string
	// RefuseIfInFlight refuses the append (*TurnInFlightError, nothing
	// written) while the session has a turn in flight: its live
	// activation has a current event (RefuseInFlight decides).
	RefuseIfInFlight bool
	// Traceparent is the W3C traceparent ("00-<32 hex>-<16 hex>-<2 hex>",
	// at most 55 bytes) the event's turns continue (docs/DESIGN.md
	// "Tracing"); empty stores NULL. A re-send of an idempotency key keeps
	// the first event's.
	Traceparent string
	// Audit, when set, is the audit row of the API call that appends the
	// event (CheckAudit's rules): written in the append's own transaction
	// if and only if the event is created (created true), so that a
	// call's event and its row commit together and the call costs one
	// commit, not two. When the append creates nothing (an idempotent
	// re-send, a refusal, an error) no row is written: the caller writes
	// the row of what it answers (docs/DESIGN.md "Tokens and audit").
	Audit *AppendAuditParams
}

// ListEventsParams page a session's events.
type ListEventsParams struct {
	Key    ActorKey
	Status EventStatus // "" = all
	After  int64
	Limit  int
}

// ClaimActivationParams are ClaimActivation's inputs.
type ClaimActivationParams struct {
	Key ActorKey
	// UID and LeaseID are generated by the caller (UUIDs).
	UID      string
	LeaseID  string
	HostID   string
	LeaseTTL time.Duration
	// WakeForCapacity lets the claim take a session asleep only for lack
	// of capacity (CapacitySleepReasons): the same transaction wakes it
	// (status active, sleep cleared) and claims it, so a session slept for
	// another reason meanwhile (the crash policy's sleep) is refused with
	// ErrSessionSleeping and stays asleep (ClaimWake; docs/DESIGN.md
	// invariant 11). Without it a sleeping session is refused.
	WakeForCapacity bool
	// First, when set, asks for the new activation's first turn in the
	// claim's transaction: after the claim, the driver takes the oldest due
	// event as NextDelivery would with these parameters and returns it as
	// Activation.First. First.Activation names the claimed activation (UID,
	// LeaseID, Key) at the epoch the caller expects the claim to give —
	// the session's epoch + 1 as it last read it; by the fences' equality,
	// nothing is taken when the claim gives another. It saves the first
	// dispatch's own transaction and round trip for a session woken by a
	// signal. Whatever the dispatch finds never undoes the claim: Activation.First
	// is then nil and the caller asks NextDelivery. A driver may always
	// leave it nil (PostgreSQL does without First.Expect). With First.Defer
	// (and First.Expect) the first turn is read deferred, as NextDelivery
	// with Defer reads it — nothing written, Dispatch.Deferred set — or,
	// when it may not be deferred (store.Deferrable, the agent not the
	// expected one), not taken at all. A deferred first turn may leave
	// First.Activation.ActorEpoch 0: the epoch the claim gives, whatever
	// it is (the activation's UID names it alone), so that a caller that
	// did not read the session first (a cold start after this host's own
	// append) can still have its first turn read in the claim's
	// transaction; Activation.First then carries that epoch. Without
	// First.Defer and First.Expect the epoch must be given
	// (CheckClaimFirst: ErrInvalid).
	First *NextDeliveryParams
}

// RenewLeasesParams are RenewLeases' inputs.
type RenewLeasesParams struct {
	HostID   string
	LeaseTTL time.Duration
	Refs     []ActivationRef
}

// NextDeliveryParams are NextDelivery's inputs.
type NextDeliveryParams struct {
	Activation ActivationRef
	// DeliveryID is generated by the caller (a UUID).
	DeliveryID string
	// Binding is recorded on the event at its first attempt when Bind is
	// nil; retries keep the recorded one (invariant 10).
	Binding string
	// Bind, when set, maps what the agent runs now — read under the
	// activation's lock, in the same statement as the candidate event — to
	// the binding recorded on an event at its first attempt, instead of
	// Binding. It is how an agent update reaches a live activation's next
	// new event without a read of its own (docs/DESIGN.md invariant 10). An
	// error from Bind is returned, wrapped, and nothing is written.
	Bind func(AgentBinding) (string, error)
	// BlockOnDeadLetter: a dead-lettered event of the session blocks its
	// later events until redriven or discarded (agent dead-letter policy
	// "block"); NextDelivery then returns *NoDueEventError.
	BlockOnDeadLetter bool
	// MarkSent creates the delivery directly as sent, for in-process workers
	// whose bytes leave the host in the same step (invariant 9).
	MarkSent bool
	// TailMessages is how many recent transcript messages to return.
	TailMessages int
	// ExpectDue says the caller knows or expects an event to be open (the
	// commit before said so: Turn.NextOpen; or a wake-up said one was
	// written), so a driver skips any cheaper read it would make first to
	// answer "nothing due" without a transaction (PostgreSQL: one round
	// trip fewer per turn, one more when nothing is due after all). The
	// answer is the same either way.
	ExpectDue bool
	// Expect, when set, is what the caller expects the agent to run (the
	// Dispatch.Agent of its last dispatch) and the binding Bind gives for
	// it. A driver may then take the event in one round trip when the
	// agent row still matches it, recording Expect.Binding at a first
	// attempt instead of calling Bind (PostgreSQL: the dispatch is one
	// round trip and one implicit transaction instead of two round trips,
	// BEGIN and COMMIT); otherwise it calls Bind as usual. The answer is
	// the same either way.
	Expect *ExpectedBinding
	// Defer asks for a deferred dispatch (Dispatch.Deferred): the event is
	// chosen as usual and nothing is written. It needs Expect (ignored
	// without it): a driver defers only what Deferrable allows and only
	// while the agent is Expect.Agent (so the binding is Expect.Binding,
	// whose worker the caller knows runs in its process), and takes
	// anything else at once (Deferred false).
	// Only for workers in this process whose turn's bytes never leave it
	// before the caller promotes (invariant 9): the caller must Promote
	// before anything of the turn is written or sent (a host call, a
	// stream chunk, a wait, a failed attempt) and otherwise commits with
	// CommitTurnParams.Deferred (docs/DESIGN.md "Deferred dispatch").
	Defer bool
}

// PromoteParams are Promote's inputs, and CommitTurnParams.Deferred's
// (PromoteOf builds them from the dispatch).
type PromoteParams struct {
	// Activation is the activation that dispatched (its ref, lease id
	// included).
	Activation ActivationRef
	// Delivery is the deferred dispatch's delivery (id, epoch, revision,
	// event, binding): what is written, and checked against the rows.
	Delivery Delivery
	// Agent is what the agent ran as the dispatch read it
	// (Dispatch.Agent): the write is refused when the agent changed.
	Agent AgentBinding
	// BlockOnDeadLetter as the dispatch's NextDeliveryParams had it.
	BlockOnDeadLetter bool
}

// PromoteOf returns the PromoteParams of deferred dispatch d of activation
// ref, dispatched with p.
func PromoteOf(ref ActivationRef, p NextDeliveryParams, d Dispatch) PromoteParams {
	return PromoteParams{Activation: ref, Delivery: d.Delivery, Agent: d.Agent, BlockOnDeadLetter: p.BlockOnDeadLetter}
}

// ExpectedBinding is NextDeliveryParams.Expect: an agent as Dispatch.Agent
// gave it and the binding Bind returns for it.
type ExpectedBinding struct {
	Agent   AgentBinding
	Binding string
}

// AgentBinding is what an agent runs, as NextDelivery reads it: its kind,
// its module digest (wasm) or its plugin worker's name and the registered
// binary's lowercase hex sha256 (plugin; "" when the plugin worker is not
// registered).
type AgentBinding struct {
	// Namespace is the agent's (its plugin worker is of it).
	Namespace    string
	Kind         string
	ModuleDigest string
	Plugin       string
	PluginSHA256 string
}

// Resolve returns the binding recorded at an event's first attempt: Bind's
// answer when set, else Binding. Both drivers call it with the agent row
// they read under the activation's lock.
func (p NextDeliveryParams) Resolve(b AgentBinding) (string, error) {
	if p.Bind == nil {
		return p.Binding, nil
	}
	out, err := p.Bind(b)
	if err != nil {
		return "", fmt.Errorf("binding of the agent (%s): %w", b.Kind, err)
	}
	return out, nil
}

// CommitTurnParams are CommitTurn's inputs.
type CommitTurnParams struct {
	Ref      abi.TurnRef
	Messages []abi.Message
	// State replaces the session state unless KeepState: nil removes it
	// (reads give nil, as never set; abi `null`), a non-nil empty slice
	// stores an empty state (reads give []byte{}; abi `""`).
	State     []byte
	KeepState bool
	Outcome   abi.Outcome
	// Alarms are set, replaced or cleared in the same transaction.
	Alarms []abi.AlarmOp
	// Payloads, when set, are the payloads of Ref's event and of the steers
	// attached to it (acceptance order) as the caller dispatched them at
	// Ref's revision — the user messages of the transcript (TurnMessages).
	// A steer attached since raised the activation's revision, so the
	// fence refuses such a commit; the payloads a commit passes are
	// therefore the stored ones. A driver may use them instead of reading
	// the payloads under the activation's lock (PostgreSQL: the commit is
	// then one round trip instead of two). Nil: the driver reads them.
	Payloads []string
	// Next, when set, asks for the session's next turn in the commit's
	// transaction: after the commit's writes, the driver takes the oldest
	// due event as NextDelivery would with these parameters
	// (Next.Activation is Ref's activation) and returns it as Turn.Next.
	// It saves the dispatch's own transaction and round trip for a session
	// with events waiting. Whatever the dispatch finds — nothing due, an
	// agent that changed, an error of Bind — never undoes the commit: the
	// driver then leaves Turn.Next nil and the caller asks NextDelivery. A
	// driver may always leave it nil (PostgreSQL does without Next.Expect or
	// with a Wait). Nothing is taken when the commit is refused.
	Next *NextDeliveryParams
	// LeaseTTL, when positive, renews the activation's lease in the
	// commit's own write of the activation row, to the database clock +
	// LeaseTTL (never shortening it): a renewal by the lease's holder, under
	// the commit's fences, that spares RenewLeases a write for an
	// activation that commits often. Zero leaves the lease as it is.
	LeaseTTL time.Duration
	// Wait, with Outcome wait (and only with it), opens this wait of kind
	// wait in the same transaction (frame wait.opened after
	// turn.committed); the session sleeps with SleepReasonWait unless
	// another event is open. A wait id the session already used: ErrConflict
	// and nothing is written. Validated by CheckWait (ErrInvalid).
	Wait *WaitParams
	// Deferred, when set, says Ref's dispatch was deferred and never
	// promoted: the commit first writes what Promote would (under the same
	// checks) and then commits, in one transaction — the delivery ends
	// accepted, turn.started precedes turn.committed. A check that fails
	// writes nothing and returns *FenceError (a not-live activation is
	// stale_epoch; another candidate, superseded_delivery). Not with a
	// Wait (ErrInvalid: a turn that waits was promoted when it asked for
	// its wait); checked by CheckCommitDeferred.
	Deferred *PromoteParams
}

// FailAttemptParams are FailAttempt's inputs.
type FailAttemptParams struct {
	Ref abi.TurnRef
	// Error is recorded as the event's last_error.
	Error string
	// Counted: the worker had accepted the turn, so the attempt counts
	// toward MaxAttempts (docs/DESIGN.md "What counts as an attempt").
	Counted     bool
	Backoff     time.Duration
	MaxAttempts int
	// Hold, when set, ends the attempt as a wait of kind approval instead
	// of a failure: not counted (Counted must be false), the event stays
	// open but is held (next_attempt_at = HeldUntil) until the wait is
	// resolved or expires, the session sleeps with SleepReasonApproval, and
	// the frames are turn.retrying (reason approval) then wait.opened.
	Hold *WaitParams
}

// HeldUntil is the next_attempt_at of an event held by an approval wait:
// never due until ResolveWait or ExpireDueWaits releases it (due now).
var HeldUntil = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)

// ExpireActivationParams are ExpireActivation's inputs.
type ExpireActivationParams struct {
	Ref         ActivationRef
	Backoff     time.Duration
	MaxAttempts int
}

// FailResult reports what a failed attempt did to its event and session.
// A counted failure applies the session's crash policy in the same
// transaction: restart leaves the session active; sleep parks it (sleeping,
// sleep_ts, reason "crash") unless the failure dead-lettered the event,
// which moves the session on; destroy destroys it and discards its open
// events (docs/DESIGN.md "Crash policy").
type FailResult struct {
	EventID       int64
	Attempts      int
	DeadLettered  bool
	NextAttemptAt time.Time
	// SessionStatus is the session's status after the failure.
	SessionStatus SessionStatus
}

// RunnableSessionsParams are RunnableSessions' inputs.
type RunnableSessionsParams struct {
	Limit int
	// BlockedAgents are agent uids whose dead-letter policy is "block".
	BlockedAgents []string
	// SkipAgents are agent uids whose sessions are left out: the caller
	// cannot run their pool now (a remote pool without a live worker on
	// this host), so they must not fill the page and hide the sessions it
	// can run (docs/DESIGN.md "Remote pools across hosts").
	SkipAgents []string
}

// SleepSessionParams are SleepSession's inputs.
type SleepSessionParams struct {
	Key ActorKey
	// Reason is recorded as sleep_reason, e.g. "capacity".
	Reason string
}

// ListDeadLettersParams page dead letters: of one agent, or of one
// session when SessionID is set.
type ListDeadLettersParams struct {
	AgentUID  string
	SessionID string
	// After is the last event id of the previous page.
	After int64
	Limit int
}

// SteerParams are Steer's inputs.
type SteerParams struct {
	Key            ActorKey
	Payload        json.RawMessage
	IdempotencyKey string
	// DeliveryID is used for the new delivery when a turn is in flight.
	DeliveryID string
	// Traceparent is stored with the steer's event, as
	// AppendEventParams.Traceparent ("" stores none).
	Traceparent string
}

// SteerResult reports a steer.
type SteerResult struct {
	Event   Event
	Created bool
	// InFlight is true when the steer was attached to a turn in flight;
	// Ref is then the new turn_ref the worker must echo.
	InFlight bool
	Ref      abi.TurnRef
}

// CancelEventParams are CancelEvent's inputs.
type CancelEventParams struct {
	Key ActorKey
	// EventID is the event to cancel; 0 means the one in flight.
	EventID int64
	// Reason is recorded in the transcript and as last_error.
	Reason string
}

// CancelResult reports a cancellation.
type CancelResult struct {
	Event Event
	// InFlight is true when the event's turn was running; its worker must
	// be aborted (its late reply is fenced off either way).
	InFlight bool
}

// TranscriptParams page a session's transcript.
type TranscriptParams struct {
	Key ActorKey
	// AfterTurn is the last turn number already seen (0 = start).
	AfterTurn int64
	Limit     int
}
