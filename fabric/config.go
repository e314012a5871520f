package fabric

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/fabric/wire"
)

// Defaults of BrokerConfig zero fields (the heartbeat ones are sent to
// workers in WELCOME).
const (
	DefaultHeartbeatInterval = time.Second
	DefaultHeartbeatTimeout  = 5 * time.Second
	DefaultAcceptTimeout     = 2 * time.Second
	DefaultSendTimeout       = 2 * time.Second
	DefaultQueueLen          = 64
	DefaultRPCWorkers        = 4
	// DefaultMaxCallsInFlight bounds the host calls (CALL) of one worker
	// session being answered at once (WELCOME max_calls_in_flight).
	DefaultMaxCallsInFlight = 16
	DefaultClockSkew        = 2 * time.Minute
	// DefaultWindowBytes is the per-worker flow-control window: at most
	// this many bytes sent and not yet acknowledged by the worker (one
	// larger message may go when nothing is outstanding). It is kept below
	// what the kernel buffers of one TCP connection hold, so that a worker
	// that stops reading fills its window, not the socket — see the
	// package doc, "The send lock".
	DefaultWindowBytes = 256 << 10
	// DefaultSessionRetention is how long the broker keeps the keys of an
	// ended session, so that its late results still authenticate and go
	// to LateResult.
	DefaultSessionRetention = 10 * time.Minute
	// DefaultHelloBurst and DefaultHelloPerSecond rate-limit authenticated
	// HELLOs per worker id; more are dropped as flood.
	DefaultHelloBurst     = 10
	DefaultHelloPerSecond = 2.0
)

// BrokerConfig configures a Broker. Zero fields take the defaults above.
type BrokerConfig struct {
	// Endpoint is where the ROUTER binds, "<scheme>://<addr>": "tcp://" or
	// any transport registered with zmq4.RegisterTransport (e.g. the
	// guard transport). Port 0 picks a free port; Broker.Endpoint returns
	// the bound one.
	Endpoint string
	// Workers maps each worker id (1–64 bytes of [A-Za-z0-9._-], its ZMTP
	// routing identity) to its 32-byte secret key. Frames from any other
	// identity are dropped as unauthenticated.
	Workers map[string][]byte
	// HeartbeatInterval is the PING period and the HEARTBEAT period asked
	// of workers.
	HeartbeatInterval time.Duration
	// HeartbeatTimeout ends a worker session that sent nothing, or left a
	// PING unanswered, for this long; its in-flight turns fail then.
	HeartbeatTimeout time.Duration
	// AcceptTimeout bounds the wait for ACCEPTED/BUSY after a TURN went out.
	AcceptTimeout time.Duration
	// SendTimeout bounds one socket send and a message's wait in its
	// queue. A send that takes longer marks its worker lost (send_stalled).
	SendTimeout time.Duration
	// MaxMessageBytes bounds one fabric message either way
	// (default and most: wire.DefaultMaxMessageBytes).
	MaxMessageBytes int
	// QueueLen bounds each worker's send queue, in messages.
	QueueLen int
	// RPCWorkers is the number of goroutines serving worker RPCs
	// (FETCH_MODULE); their queue holds 4×RPCWorkers requests.
	RPCWorkers int
	// Modules returns the bytes of the wasm module with digest
	// ("sha256:<hex>"), for FETCH_MODULE. Nil: workers can run plugin
	// bindings only.
	Modules func(ctx context.Context, digest string) ([]byte, error)
	// LateResult receives every authenticated RESULT that no turn waits
	// for (the late reply of a lost, timed-out or cancelled turn), in a
	// goroutine of its own, one at a time. The host submits it to the
	// fences, which reject and count it. Nil: late results are counted and
	// dropped.
	LateResult func(*abi.TurnResult)
	// Disconnect, if set, closes the transport connection(s) of a routing
	// identity (fabric/guard's Guard.Disconnect). The broker calls it when
	// it gives up on a worker that stopped reading (ping timeout, not
	// reading, send stalled): a write stuck behind that peer ends at once
	// instead of at the transport's write timeout, and its buffers are
	// released. It also closes a superseded incarnation's connection when
	// the new one came over another (guard.DuplicateDistinct).
	Disconnect func(id string) int
	// Admitted, if set, is called each time a worker session is admitted
	// (a worker connected or reconnected), with the worker's id and the
	// pools it announced, on the broker's lifecycle goroutine: it must
	// return at once. The host uses it to look for sessions of those pools
	// that wait for a worker (docs/DESIGN.md "Remote pools across hosts").
	Admitted func(worker string, pools []string)
	// MaxCallsInFlight bounds the host calls (CALL messages) of one
	// worker session the broker answers at once; a CALL above it is
	// answered denied and counted as flood (abi/FABRIC.md "The request
	// lane"). It also bounds the results held for sending: at most this
	// many, each at most abi.MaxCallResultBytes, per session.
	MaxCallsInFlight int
	// ClockSkew is how far a HELLO's timestamp may be from the broker's
	// clock.
	ClockSkew time.Duration
	// WindowBytes is the flow-control window per worker session.
	WindowBytes int
	// SessionRetention is how long an ended session's keys are kept.
	SessionRetention time.Duration
}

func (c BrokerConfig) withDefaults() (BrokerConfig, error) {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.HeartbeatInterval, DefaultHeartbeatInterval)
	def(&c.HeartbeatTimeout, DefaultHeartbeatTimeout)
	def(&c.AcceptTimeout, DefaultAcceptTimeout)
	def(&c.SendTimeout, DefaultSendTimeout)
	def(&c.ClockSkew, DefaultClockSkew)
	def(&c.SessionRetention, DefaultSessionRetention)
	if c.QueueLen <= 0 {
		c.QueueLen = DefaultQueueLen
	}
	if c.RPCWorkers <= 0 {
		c.RPCWorkers = DefaultRPCWorkers
	}
	if c.MaxCallsInFlight <= 0 {
		c.MaxCallsInFlight = DefaultMaxCallsInFlight
	}
	if c.WindowBytes <= 0 {
		c.WindowBytes = DefaultWindowBytes
	}
	if c.MaxMessageBytes <= 0 || c.MaxMessageBytes > wire.DefaultMaxMessageBytes {
		c.MaxMessageBytes = wire.DefaultMaxMessageBytes
	}
	if c.MaxMessageBytes < 64<<10 {
		return c, &ConfigError{Field: "max_message_bytes", Err: fmt.Errorf("%d is below 65536", c.MaxMessageBytes)}
	}
	if c.HeartbeatTimeout <= c.HeartbeatInterval {
		return c, &ConfigError{Field: "heartbeat_timeout", Err: fmt.Errorf("%s must exceed the heartbeat interval %s", c.HeartbeatTimeout, c.HeartbeatInterval)}
	}
	if !strings.Contains(c.Endpoint, "://") {
		return c, &ConfigError{Field: "endpoint", Err: fmt.Errorf("%q is not <scheme>://<address>", c.Endpoint)}
	}
	if len(c.Workers) == 0 {
		return c, &ConfigError{Field: "workers", Err: errors.New("no worker ids and keys configured")}
	}
	keys := make(map[string][]byte, len(c.Workers))
	for id, k := range c.Workers {
		if err := wire.CheckIdentity(id); err != nil {
			return c, &ConfigError{Field: "workers", Err: err}
		}
		if len(k) != wire.KeyLen {
			return c, &ConfigError{Field: "workers." + id, Err: fmt.Errorf("key is %d bytes, want %d", len(k), wire.KeyLen)}
		}
		keys[id] = append([]byte(nil), k...)
	}
	c.Workers = keys
	return c, nil
}

// Stats is a snapshot of the broker's counters (monotonic since NewBroker,
// except the gauges LiveWorkers and Stalled).
type Stats struct {
	// Dropped counts received messages dropped, by reason.
	Dropped Drops
	// MessagesIn and MessagesOut count authenticated messages received and
	// messages handed to the socket.
	MessagesIn, MessagesOut uint64
	// Admitted counts worker sessions opened; Rejected REJECTs sent.
	Admitted, Rejected uint64
	// Lost counts worker sessions ended, by reason.
	Lost LostCounts
	// SendStalls counts socket sends that took longer than SendTimeout;
	// SendQueueFull, SendExpired and SendFailed messages not sent.
	SendStalls, SendQueueFull, SendExpired, SendFailed uint64
	// LateResults were handed to LateResult; LateDropped could not be
	// (the callback's queue was full, or the result did not decode).
	LateResults, LateDropped uint64
	// Turns counts Turn calls dispatched to a worker; Busy BUSY answers;
	// AcceptTimeouts turns that got no receipt.
	Turns, Busy, AcceptTimeouts uint64
	// ModuleChunks counts MODULE messages served.
	ModuleChunks uint64
	// HostCalls counts CALLs answered through a turn's abi.Caller;
	// CallResultChunks the CALL_RESULT messages that carried chunks of
	// long results.
	HostCalls, CallResultChunks uint64
	// LiveWorkers is the number of admitted worker sessions now.
	LiveWorkers int
	// Stalled reports a socket send in progress for longer than
	// SendTimeout now.
	Stalled bool
}

// Drops counts dropped messages by reason. Every dropped message is
// counted once, under the first reason that applies, in this order.
type Drops struct {
	// Oversized: longer than MaxMessageBytes (HELLO: wire.MaxHelloBytes).
	Oversized uint64
	// Malformed: not one frame after the identity, a short or reserved
	// header, a kind the sender may not send, or a body that does not
	// decode.
	Malformed uint64
	// UnknownVersion: byte 0 is not wire.Version.
	UnknownVersion uint64
	// Unauthenticated: the identity is not a configured worker.
	Unauthenticated uint64
	// Forged: the message does not authenticate under the worker's key.
	Forged uint64
	// Replayed: a seq not above the session's last, a HELLO incarnation
	// seen before, or a HELLO timestamp outside the skew window.
	Replayed uint64
	// Flood: over the HELLO rate limit, or an internal queue was full.
	Flood uint64
	// UnknownSession: authentic, but for a session this broker does not
	// know (e.g. from before a restart); answered with REJECT.
	UnknownSession uint64
	// StaleSession: authentic, for an ended session, and not a RESULT.
	StaleSession uint64
	// NoTurn: an authentic CALL for a delivery not in flight on its
	// session (the turn ended, or never ran there); answered CALL_RESULT
	// cancelled.
	NoTurn uint64
}

// Total is the sum of all drop reasons.
func (d Drops) Total() uint64 {
	return d.Oversized + d.Malformed + d.UnknownVersion + d.Unauthenticated + d.Forged + d.Replayed +
		d.Flood + d.UnknownSession + d.StaleSession + d.NoTurn
}

// LostCounts counts ended worker sessions by reason.
type LostCounts struct {
	HeartbeatTimeout, PingTimeout, NotReading, Goodbye, Superseded, SendStalled, Rejected uint64
}

// Reasons a session ends (TurnError.Code of KindWorkerLost).
const (
	ReasonHeartbeatTimeout = "heartbeat_timeout"
	ReasonPingTimeout      = "ping_timeout"
	ReasonNotReading       = "not_reading"
	ReasonGoodbye          = "goodbye"
	ReasonSuperseded       = "superseded"
	ReasonSendStalled      = "send_stalled"
	ReasonRejected         = "rejected"
	ReasonBrokerClosed     = "broker_closed"
)
