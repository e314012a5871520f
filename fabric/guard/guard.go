// Package guard is a hardened TCP transport for github.com/go-zeromq/zmq4
// (v0.17.0) meant for the host-side ROUTER socket that remote workers connect
// to. It works around defects of zmq4 that cannot be fixed from outside the
// library's API by standing between the kernel socket and zmq4:
//
//   - zmq4 runs the ZMTP handshake inline in its accept loop without a
//     deadline, so one silent TCP client blocks every later connection. The
//     guard accepts in its own loop and performs the pre-handshake (greeting
//     exchange and the peer's READY command) in a goroutine per connection
//     with a deadline (Options.HandshakeTimeout). zmq4's accept loop only ever
//     sees connections whose handshake bytes are already buffered, which it
//     consumes without waiting on the network.
//   - zmq4 allocates frames with the size read from the wire. The guard parses
//     the ZMTP framing of every byte it hands to zmq4 and cuts the connection
//     (returning an error instead of the size bytes) when a frame, a message
//     or a command exceeds the configured limits, before zmq4 can allocate.
//   - zmq4 parses READY metadata without bounds checks: a 14-byte malformed
//     READY command panics the accept goroutine and crashes the process
//     (see TestPlainTCPMalformedReadyCrashes). The guard validates READY.
//   - zmq4's ROUTER writes while holding one socket-wide mutex and never
//     bounds the write; zmq4.WithTimeout does not help (see README.md). The
//     guard puts a deadline on each outgoing message (Options.WriteTimeout);
//     when it expires the connection is closed, zmq4 drops it and the mutex
//     is released.
//   - zmq4 has no way to drop one peer. Listener-side connections are tracked
//     by their ZMTP identity: Guard.Disconnect closes them, and duplicate
//     identities are handled by Options.DuplicateIdentity instead of zmq4's
//     silent fan-out.
//
// Only the NULL security mechanism is accepted (zmq4's PLAIN does not
// authenticate and it has no CURVE), so the guard is a robustness layer, not
// an authentication layer: run it on a trusted network or inside a tunnel.
//
// Usage on the host:
//
//	if err := guard.Register(); err != nil { ... }      // scheme "gtcp"
//	router := zmq4.NewRouter(ctx, zmq4.WithID(...))
//	err := router.Listen("gtcp://0.0.0.0:5555")
//	stats := guard.Default().Stats()
//
// or, with custom options, g, _ := guard.New(opts); g.Register("gtcp-broker").
// Workers connect with plain "tcp://host:5555" from any ZMTP 3.x
// implementation (libzmq, zmq4, ...); a Go worker may also dial "gtcp://",
// which adds the frame limits and write deadline on its side.
//
// Package-level state: zmq4's transport registry is process-global and has
// no way to unregister, so a scheme name can be registered once per process.
// The only package-level mutable state here is the sync.Once that guards the
// registration of the default guard under DefaultScheme (see Register and
// Default). Guards created with New hold all their state themselves.
package guard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// DefaultScheme is the zmq4 transport scheme registered by Register.
const DefaultScheme = "gtcp"

// Defaults used for zero-valued Options fields.
const (
	DefaultHandshakeTimeout    = 5 * time.Second
	DefaultWriteTimeout        = 5 * time.Second
	DefaultMaxPending          = 256
	DefaultMaxPendingPerIP     = 16
	DefaultMaxConns            = 4096
	DefaultMaxFrameSize        = 8 << 20  // bytes (8 MiB)
	DefaultMaxMessageSize      = 16 << 20 // bytes (16 MiB)
	DefaultMaxFramesPerMessage = 64
	// MaxCommandSize is the fixed limit in bytes on the body of a ZMTP
	// command frame (READY, PING, ...). Real READY commands are well under
	// 1 KiB.
	MaxCommandSize = 64 << 10
)

// DuplicatePolicy says what a listener does when a peer completes the
// handshake with a routing identity that an open connection already uses.
// zmq4 itself would keep both and send every message to both.
type DuplicatePolicy int

const (
	// DuplicateHandover closes the older connection and admits the new one
	// (like libzmq's ZMQ_ROUTER_HANDOVER). It lets a worker reconnect at once
	// after a network failure the host has not noticed yet.
	DuplicateHandover DuplicatePolicy = iota
	// DuplicateReject refuses the new connection (libzmq's default).
	DuplicateReject
	// DuplicateAllow admits both (zmq4 then sends each message to both).
	DuplicateAllow
	// DuplicateDistinct gives every connection a routing identity of its
	// own: the peer's identity, IdentitySeparator and a per-guard connection
	// number (16 hex digits), e.g. "w1\x00000000000000002a". zmq4 never sees
	// two connections under one identity, so a newcomer claiming a worker's
	// id — a misconfigured copy, or a client without its key — cannot
	// displace the open connection. The application maps the routing
	// identity back with BaseIdentity, decides which connection is
	// authoritative (fabric's broker: the one that last authenticated) and
	// closes the others with Disconnect(routingIdentity). An empty identity
	// is left empty (zmq4 then makes one up).
	DuplicateDistinct
)

// IdentitySeparator ends the peer's own identity in a routing identity
// made by DuplicateDistinct. Peer identities containing it are refused
// under that policy.
const IdentitySeparator = "\x00"

// BaseIdentity returns the identity the peer announced, given the routing
// identity zmq4 reports for it: routing itself unless DuplicateDistinct
// extended it.
func BaseIdentity(routing string) string {
	if i := strings.Index(routing, IdentitySeparator); i >= 0 {
		return routing[:i]
	}
	return routing
}

// Options configures a Guard. Zero values select the defaults above; for the
// numeric limits and timeouts a negative value disables the limit.
type Options struct {
	// HandshakeTimeout bounds the pre-handshake of one accepted connection:
	// sending our greeting, reading the peer's 64-byte greeting and its READY
	// command. Default 5 s.
	HandshakeTimeout time.Duration
	// WriteTimeout bounds the time to write one outgoing ZMTP message (all
	// its frames) to one peer. When it expires the connection is closed and
	// the write fails with ErrWriteStalled, which makes zmq4 drop the peer
	// and release its ROUTER send lock. This is the upper bound on how long
	// one peer that stopped reading can hold up sends to every other peer.
	// A message of S bytes needs a peer that reads at least S/WriteTimeout
	// bytes per second. Default 5 s.
	WriteTimeout time.Duration
	// MaxPending caps the connections in pre-handshake at once; more are
	// closed at once (counted in Stats.FloodRejected). Default 256.
	MaxPending int
	// MaxPendingPerIP caps the connections in pre-handshake from one source
	// IPv4 address or IPv6 /64 (Stats.FloodRejectedPerIP). Default 16.
	MaxPendingPerIP int
	// MaxConns caps the established connections handed to zmq4 per listener
	// (Stats.ConnLimitRejected). Default 4096.
	MaxConns int
	// MaxFrameSize is the largest declared size in bytes of one received
	// message frame. Default 8 MiB.
	MaxFrameSize int64
	// MaxMessageSize is the largest sum in bytes of the declared sizes of the
	// frames of one received multipart message. Default 16 MiB, and never
	// less than MaxFrameSize.
	MaxMessageSize int64
	// MaxFramesPerMessage is the most frames one received message may have
	// (zero-length frames cost zmq4 a slice header each). Default 64.
	MaxFramesPerMessage int
	// PeerSocketTypes lists the ZMTP socket types (as sent in READY, e.g.
	// "DEALER") accepted from peers. Default: DEALER, REQ, ROUTER — the
	// types zmq4 accepts for a ROUTER. zmq4 leaks the file descriptor of a
	// connection it rejects itself, so reject here instead.
	PeerSocketTypes []string
	// DuplicateIdentity is the policy for a second connection with the same
	// routing identity. Default DuplicateHandover.
	DuplicateIdentity DuplicatePolicy
	// Logger receives rejections (Debug) and cut connections (Warn).
	// Default slog.Default().
	Logger *slog.Logger
}

// withDefaults returns o with defaults applied, or an error for invalid
// combinations.
func (o Options) withDefaults() (Options, error) {
	dur := func(v *time.Duration, def time.Duration) {
		switch {
		case *v == 0:
			*v = def
		case *v < 0:
			*v = 0
		}
	}
	num := func(v *int, def int) {
		switch {
		case *v == 0:
			*v = def
		case *v < 0:
			*v = 0
		}
	}
	dur(&o.HandshakeTimeout, DefaultHandshakeTimeout)
	dur(&o.WriteTimeout, DefaultWriteTimeout)
	num(&o.MaxPending, DefaultMaxPending)
	num(&o.MaxPendingPerIP, DefaultMaxPendingPerIP)
	num(&o.MaxConns, DefaultMaxConns)
	num(&o.MaxFramesPerMessage, DefaultMaxFramesPerMessage)
	switch {
	case o.MaxFrameSize == 0:
		o.MaxFrameSize = DefaultMaxFrameSize
	case o.MaxFrameSize < 0:
		o.MaxFrameSize = 0
	}
	switch {
	case o.MaxMessageSize == 0:
		o.MaxMessageSize = max(DefaultMaxMessageSize, o.MaxFrameSize)
	case o.MaxMessageSize < 0:
		o.MaxMessageSize = 0
	}
	if o.MaxFrameSize > 0 && o.MaxMessageSize > 0 && o.MaxMessageSize < o.MaxFrameSize {
		return o, fmt.Errorf("guard: MaxMessageSize %d < MaxFrameSize %d", o.MaxMessageSize, o.MaxFrameSize)
	}
	if o.PeerSocketTypes == nil {
		o.PeerSocketTypes = []string{"DEALER", "REQ", "ROUTER"}
	}
	if o.DuplicateIdentity < DuplicateHandover || o.DuplicateIdentity > DuplicateDistinct {
		return o, fmt.Errorf("guard: invalid DuplicateIdentity %d", o.DuplicateIdentity)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o, nil
}

// Guard is a zmq4 transport (transport.Transport) with the protections
// described in the package documentation. It is safe for concurrent use. Its
// counters cover all listeners and dialed connections created through it.
type Guard struct {
	opts   Options
	stats  counters
	scheme string // set once by Register; guarded by mu

	mu        sync.Mutex
	listeners map[*listener]struct{}
	connSeq   atomic.Uint64 // DuplicateDistinct's connection numbers
}

// New returns a Guard with the given options (zero values = defaults).
func New(opts Options) (*Guard, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Guard{opts: o, listeners: make(map[*listener]struct{})}, nil
}

// Options returns the effective options (defaults applied; disabled limits
// are reported as 0).
func (g *Guard) Options() Options { return g.opts }

// Register registers g with zmq4 under scheme, so that sockets can Listen on
// and Dial "scheme://host:port". zmq4's registry is global and cannot
// unregister: each scheme can be registered once per process.
func (g *Guard) Register(scheme string) error {
	if err := zmq4.RegisterTransport(scheme, g); err != nil {
		return fmt.Errorf("guard: register scheme %q: %w", scheme, err)
	}
	g.mu.Lock()
	g.scheme = scheme
	g.mu.Unlock()
	return nil
}

// Scheme returns the scheme g was registered under ("" if none).
func (g *Guard) Scheme() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.scheme
}

// Endpoint returns the zmq4 endpoint "scheme://hostport" for g.
func (g *Guard) Endpoint(hostport string) string {
	return g.Scheme() + "://" + hostport
}

var (
	defaultOnce  sync.Once
	defaultGuard *Guard
	defaultErr   error
)

// Register registers a Guard with default Options under DefaultScheme
// ("gtcp"). It is idempotent: later calls return the first call's result.
func Register() error {
	defaultOnce.Do(func() {
		g, err := New(Options{})
		if err == nil {
			err = g.Register(DefaultScheme)
		}
		if err != nil {
			defaultErr = err
			return
		}
		defaultGuard = g
	})
	return defaultErr
}

// Default returns the Guard registered by Register, or nil before a
// successful Register.
func Default() *Guard {
	if Register() != nil {
		return nil
	}
	return defaultGuard
}

// Dial implements transport.Transport. It dials plain TCP and wraps the
// connection with the same receive limits and write deadline as accepted
// connections (no pre-handshake: zmq4 performs the client handshake).
func (g *Guard) Dial(ctx context.Context, dialer transport.Dialer, addr string) (net.Conn, error) {
	c, err := dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("guard: dial %s: %w", addr, err)
	}
	return newClientConn(g, c), nil
}

// Listen implements transport.Transport: it listens on TCP addr and returns
// a net.Listener whose Accept yields only connections that completed the
// pre-handshake. The listener closes when ctx is done.
func (g *Guard) Listen(ctx context.Context, addr string) (net.Listener, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("guard: listen %s: %w", addr, err)
	}
	l := newListener(g, ln)
	g.mu.Lock()
	g.listeners[l] = struct{}{}
	g.mu.Unlock()
	stop := context.AfterFunc(ctx, func() { _ = l.Close() })
	l.onClose = func() {
		stop()
		g.mu.Lock()
		delete(g.listeners, l)
		g.mu.Unlock()
	}
	l.start()
	return l, nil
}

// Addr implements transport.Transport with the same rules as zmq4's "tcp"
// ("*" host = all interfaces, "*" port = any port).
func (g *Guard) Addr(ep string) (string, error) {
	addr, err := transport.New("tcp").Addr(ep)
	if err != nil {
		return "", fmt.Errorf("guard: address %q: %w", ep, err)
	}
	return addr, nil
}

// Disconnect closes every established connection (on every listener of g)
// whose peer announced the routing identity id, and returns how many were
// closed. zmq4 notices the closed connection and drops the peer; use it for
// peers the broker considers dead or too slow.
func (g *Guard) Disconnect(id string) int {
	n := 0
	for _, l := range g.listenerList() {
		n += l.disconnect(id)
	}
	return n
}

// Peers returns the identities of the established connections of all
// listeners of g (one entry per connection; empty identities included).
func (g *Guard) Peers() []string {
	var ids []string
	for _, l := range g.listenerList() {
		ids = append(ids, l.peers()...)
	}
	return ids
}

func (g *Guard) listenerList() []*listener {
	g.mu.Lock()
	defer g.mu.Unlock()
	ls := make([]*listener, 0, len(g.listeners))
	for l := range g.listeners {
		ls = append(ls, l)
	}
	return ls
}

// Stats returns a snapshot of g's counters.
func (g *Guard) Stats() Stats { return g.stats.snapshot() }

var _ transport.Transport = (*Guard)(nil)

// Errors returned (wrapped in a *CutError) by reads and writes of a
// connection the guard cut. Test with errors.Is.
var (
	ErrFrameTooLarge   = errors.New("guard: frame exceeds MaxFrameSize")
	ErrMessageTooLarge = errors.New("guard: message exceeds MaxMessageSize or MaxFramesPerMessage")
	ErrCommandTooLarge = errors.New("guard: command exceeds MaxCommandSize")
	ErrProtocol        = errors.New("guard: ZMTP protocol violation")
	ErrWriteStalled    = errors.New("guard: peer stopped reading (write timeout)")
	ErrDisconnected    = errors.New("guard: disconnected by the guard")
	ErrHandedOver      = errors.New("guard: replaced by a newer connection with the same identity")
)

// CutError is the error of a read or write on a connection the guard closed.
// It implements net.Error with Timeout() == false, which is what makes zmq4
// mark its Conn closed and remove it from the socket (zmq4 keeps connections
// whose errors are timeouts).
type CutError struct {
	Reason error // one of the Err* sentinels above
	Err    error // underlying cause, may be nil
}

func (e *CutError) Error() string {
	if e.Err == nil {
		return e.Reason.Error()
	}
	return e.Reason.Error() + ": " + e.Err.Error()
}

// Unwrap returns the reason and the cause.
func (e *CutError) Unwrap() []error {
	if e.Err == nil {
		return []error{e.Reason}
	}
	return []error{e.Reason, e.Err}
}

// Timeout reports false on purpose (see CutError).
func (e *CutError) Timeout() bool { return false }

// Temporary reports false.
func (e *CutError) Temporary() bool { return false }

var _ net.Error = (*CutError)(nil)
