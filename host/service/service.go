// Package service is the one way into Paddock's runtime for every front
// door (the HTTP API today; a second API or a web console tomorrow). Each
// operation holds its rules: input validation, size limits, defaults,
// idempotency, and waking the runtime (Host.Ensure, Host.Force) after the
// store write that gives a session work (docs/DESIGN.md "The flow of one signal").
//
// Front doors translate their requests into these operations and map the
// errors back: *InvalidError (an input is refused; Field names it),
// *TooLargeError, *NotFoundError (errors.Is store.ErrNotFound),
// *ConflictError (errors.Is store.ErrConflict), *RejectedError (the module
// inspector or plugin checker refused it), ErrPluginsDisabled, and
// store.ErrSessionDestroyed (wrapped). Anything else is an internal error
// (or the context's error).
//
// Lookups come first and return what later operations take: GetAgent
// returns the store.Agent that the session operations are called with,
// GetSession the store.Session that the event operations are called with.
// So a front door resolves the addressed resource before it reads the rest
// of a request, and no operation reads a row twice. The hot signal path
// reads none: SignalAgent resolves an agent's identity (ResolveAgent) from
// a cache.
package service

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/stream"
	"github.com/paddock-dev/paddock/store"
)

// Modules validates uploaded wasm modules. Errors it returns for a bad
// module must name what is wrong; they reach the caller as a
// *RejectedError.
type Modules interface {
	// Inspect checks that b is a wasm module exporting Paddock's guest ABI
	// and returns its digest ("sha256:<hex>") and ABI version.
	Inspect(ctx context.Context, b []byte) (digest string, abiVersion int, err error)
}

// Plugins checks plugin worker registrations. Errors it returns name what
// is wrong (missing or non-executable binary, wrong checksum, a handshake
// or ABI version mismatch); they reach the caller as a *RejectedError.
type Plugins interface {
	// CheckPlugin verifies w on this host: the binary exists, is
	// executable, matches w.SHA256, and starts and speaks our protocol.
	CheckPlugin(ctx context.Context, w store.PluginWorker) error
}

// MaxEventPayloadBytes bounds a signal's encoded message and data
// (abi.Marshal of {"message","data"}), whatever a front door's body limit
// allows: a quarter of abi.MaxRequestBytes, so that the event, a steer or
// two, the session state and a trimmed transcript tail still fit in one
// TurnRequest.
const MaxEventPayloadBytes = abi.MaxRequestBytes / 4

// Page sizes: a limit of 0 means the default; above the maximum is refused.
const (
	// DefaultSessionLimit and MaxSessionLimit bound a page of sessions.
	DefaultSessionLimit, MaxSessionLimit = 50, 500
	// DefaultPageLimit and MaxPageLimit bound a page of events, dead
	// letters or transcript turns.
	DefaultPageLimit, MaxPageLimit = 100, 1000
)

// Service runs the front-door operations against one host and its store.
// Its only state of its own is the web console's logins (ConsoleLogin),
// the signals_per_minute buckets of this host (quota.go) and a cache of
// agent identities (ResolveAgent); it is safe for concurrent use.
type Service struct {
	signals *signalBuckets
	agents  *agentIDs
	h       *host.Host
	st      store.Store
	modules Modules
	plugins Plugins
	sealer  Sealer
	hub     *stream.Hub
	workers func() []RemoteWorker
	// bootstrap is sha256 of the config's auth_token (nil: an open host).
	bootstrap []byte
	logins    *consoleLogins
}

// New returns the service of h. modules inspects uploaded modules; plugins
// checks plugin registrations (nil: this host runs no plugin workers, and
// RegisterPlugin returns ErrPluginsDisabled).
func New(h *host.Host, modules Modules, plugins Plugins) *Service {
	return &Service{h: h, st: h.Store(), modules: modules, plugins: plugins, logins: newConsoleLogins(), signals: &signalBuckets{},
		agents: &agentIDs{}}
}

// Health is what a health check reports.
type Health struct {
	// Store is the store driver: "sqlite" or "postgres".
	Store string
	// HostID is this host's id.
	HostID string
}

// Health reports the store driver and the host id.
func (s *Service) Health() Health {
	return Health{Store: s.st.Driver(), HostID: s.h.ID()}
}

// ReadyTimeout bounds Ready's read of the store.
const ReadyTimeout = 2 * time.Second

// Ready reports whether the store answers a cheap read within
// ReadyTimeout: nil, or the store's error (store.ErrUnavailable when it
// cannot be reached, context.DeadlineExceeded when it did not answer).
func (s *Service) Ready(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, ReadyTimeout)
	defer cancel()
	// A lookup by primary key of a name no agent can have (names are
	// lowercase): one index probe, answered ErrNotFound.
	_, err := s.st.GetAgent(ctx, DefaultNamespace, "READY-PROBE")
	if err == nil || errors.Is(err, store.ErrNotFound) {
		return nil
	}
	return wrap("ready", err)
}

// nameRE bounds agent and plugin worker names.
var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// keyRE bounds session keys and idempotency keys: printable, 1–200 bytes.
var keyRE = regexp.MustCompile(`^[\x21-\x7e]{1,200}$`)

// checkName refuses a name that does not match nameRE.
func checkName(name string) error {
	if !nameRE.MatchString(name) {
		return invalid("name", "name %q must match %s", name, nameRE)
	}
	return nil
}

// policy returns the crash policy in, or def when in is empty.
func policy(in string, def store.CrashPolicy) (store.CrashPolicy, error) {
	if in == "" {
		return def, nil
	}
	p := store.CrashPolicy(in)
	if !p.Valid() {
		return "", invalid("crash_policy", "crash_policy %q must be restart, sleep or destroy", in)
	}
	return p, nil
}

// pageSize applies a page size's default and bound.
func pageSize(n, def, max int) (int, error) {
	switch {
	case n == 0:
		return def, nil
	case n < 1 || n > max:
		return 0, invalid("limit", "limit=%d must be an integer between 1 and %d", n, max)
	}
	return n, nil
}

// Page selects a page of events, dead letters or transcript turns.
type Page struct {
	// After is the last id (event id, or turn number for a transcript)
	// of the previous page; 0 starts at the beginning.
	After int64
	// Limit is the page size: 0 means DefaultPageLimit, at most
	// MaxPageLimit.
	Limit int
}

func (p Page) check() (Page, error) {
	if p.After < 0 {
		return p, invalid("after", "after=%d must not be negative", p.After)
	}
	n, err := pageSize(p.Limit, DefaultPageLimit, MaxPageLimit)
	p.Limit = n
	return p, err
}

// wrap adds the operation's name to an unexpected error.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", op, err)
}
