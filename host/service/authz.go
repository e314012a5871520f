package service

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"slices"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// Op names an operation of the runtime as the authorization and the audit
// log see it ("session.create", "signal.steer", …). Each front door maps
// its routes to ops and calls Authorize with them; OpRules is the table of
// the role each op needs (docs/DESIGN.md "Tokens, roles and the audit
// log").
type Op string

// The operations. Public ones need no token; the others need a token whose
// role is at least the op's (OpRules).
const (
	OpHealth  Op = "health"  // public
	OpReady   Op = "ready"   // public
	OpMetrics Op = "metrics" // public

	OpOpenAPI Op = "openapi.read"

	OpModuleUpload Op = "module.upload"
	OpModuleRead   Op = "module.read"

	OpPluginRegister Op = "plugin.register"
	OpPluginRead     Op = "plugin.read"

	OpAgentCreate Op = "agent.create"
	OpAgentUpdate Op = "agent.update"
	OpAgentRead   Op = "agent.read"

	OpSessionCreate  Op = "session.create"
	OpSessionRead    Op = "session.read"
	OpSessionDestroy Op = "session.destroy"

	// OpSignalSend is a message; the other signal kinds, and a message
	// that overrides mid_turn with steer or interrupt or that forces an
	// allocation, are the ops below it (SignalOp).
	OpSignalSend   Op = "signal.send"
	OpSignalSteer  Op = "signal.steer"
	OpSignalCancel Op = "signal.cancel"
	OpSignalWake   Op = "signal.wake"
	OpSignalForce  Op = "signal.force"

	OpEventRead    Op = "event.read"
	OpEventRedrive Op = "event.redrive"
	OpEventDiscard Op = "event.discard"
	OpEventCancel  Op = "event.cancel"

	OpStreamRead  Op = "stream.read"
	OpWaitRead    Op = "wait.read"
	OpWaitResolve Op = "wait.resolve"

	OpSecretRead   Op = "secret.read" // names only
	OpSecretPut    Op = "secret.put"
	OpSecretDelete Op = "secret.delete"

	OpTokenCreate Op = "token.create"
	OpTokenRead   Op = "token.read"
	OpTokenRevoke Op = "token.revoke"
	OpAuditRead   Op = "audit.read"

	// OpConsoleRead is a page of the web console.
	OpConsoleRead Op = "console.read"
)

// OpRule is one row of the operation table.
type OpRule struct {
	Op Op
	// Role is the lowest role that may call it; RoleNone: public, no
	// token needed.
	Role Role
	// Mutates: the op writes, so a front door appends an audit row for
	// each call that reached it.
	Mutates bool
	// Cluster: only a caller of every namespace (the bootstrap admin) may
	// call it, whatever the role of a namespace's token — registering a
	// plugin runs a binary of the host's machine with an environment the
	// caller chooses (LD_PRELOAD…), which is power over every namespace.
	Cluster bool
}

// opTable is the rule (read-only): who may call what. Reader reads;
// client also creates sessions and sends messages; operator also steers,
// cancels, wakes, destroys, redrives and discards, and resolves waits;
// admin also registers modules, plugins, agents and secrets, and manages
// tokens and reads the audit log.
var opTable = [...]OpRule{
	{OpHealth, RoleNone, false, false},
	{OpReady, RoleNone, false, false},
	{OpMetrics, RoleNone, false, false},
	{OpOpenAPI, RoleReader, false, false},
	{OpModuleRead, RoleReader, false, false},
	{OpPluginRead, RoleReader, false, false},
	{OpAgentRead, RoleReader, false, false},
	{OpSessionRead, RoleReader, false, false},
	{OpEventRead, RoleReader, false, false},
	{OpStreamRead, RoleReader, false, false},
	{OpWaitRead, RoleReader, false, false},
	{OpSecretRead, RoleReader, false, false},
	{OpConsoleRead, RoleReader, false, false},
	{OpSessionCreate, RoleClient, true, false},
	{OpSignalSend, RoleClient, true, false},
	{OpSignalSteer, RoleOperator, true, false},
	{OpSignalCancel, RoleOperator, true, false},
	{OpSignalWake, RoleOperator, true, false},
	{OpSignalForce, RoleOperator, true, false},
	{OpSessionDestroy, RoleOperator, true, false},
	{OpEventRedrive, RoleOperator, true, false},
	{OpEventDiscard, RoleOperator, true, false},
	{OpEventCancel, RoleOperator, true, false},
	{OpWaitResolve, RoleOperator, true, false},
	{OpModuleUpload, RoleAdmin, true, false},
	{OpPluginRegister, RoleAdmin, true, true},
	{OpAgentCreate, RoleAdmin, true, false},
	{OpAgentUpdate, RoleAdmin, true, false},
	{OpSecretPut, RoleAdmin, true, false},
	{OpSecretDelete, RoleAdmin, true, false},
	{OpTokenCreate, RoleAdmin, true, false},
	{OpTokenRevoke, RoleAdmin, true, false},
	{OpTokenRead, RoleAdmin, false, false},
	{OpAuditRead, RoleAdmin, false, false},
}

// OpRules returns the operation table (a copy).
func OpRules() []OpRule { return slices.Clone(opTable[:]) }

// Rule returns op's row of the table, and false for an op not in it.
func (op Op) Rule() (OpRule, bool) {
	for _, r := range opTable {
		if r.Op == op {
			return r, true
		}
	}
	return OpRule{}, false
}

// SignalOp is the op a signal needs: OpSignalSend for a message, the
// kind's op for a steer, cancel or wake; a message that overrides mid_turn
// with steer or interrupt (it steers or cancels a turn in flight) or that
// forces an allocation needs that op.
func SignalOp(p SignalParams) Op {
	switch p.Kind {
	case abi.EventSteer:
		return OpSignalSteer
	case SignalCancel:
		return OpSignalCancel
	case SignalWake:
		return OpSignalWake
	}
	switch {
	case p.MidTurn == "interrupt":
		return OpSignalCancel
	case p.MidTurn == "steer":
		return OpSignalSteer
	case p.ForceAllocation:
		return OpSignalForce
	}
	return OpSignalSend
}

// The reasons of a refusal (paddock_api_refused_total's label).
const (
	refusedUnauthenticated = "unauthenticated"
	refusedRole            = "role"
	refusedNamespace       = "namespace"
)

// refused counts a refusal.
func (s *Service) refused(reason string) {
	if m := s.h.Metrics(); m != nil && m.APIRefused != nil {
		m.APIRefused.WithLabelValues(reason).Inc()
	}
}

// Authorize refuses ctx's caller an op it may not call: a
// *ForbiddenError when the namespace ctx addresses (NamespaceOf) is not
// its token's, or when its role is below the op's (OpRules); counted in
// paddock_api_refused_total. A public op, and a context without a caller
// (the host itself), pass. An op missing from the table is refused (a
// defect of the front door, never a silent pass).
func (s *Service) Authorize(ctx context.Context, op Op) error {
	rule, ok := op.Rule()
	if !ok {
		return fmt.Errorf("authorize: op %q is not in the operation table", op)
	}
	if rule.Role == RoleNone {
		return nil
	}
	c, ok := CallerFrom(ctx)
	if !ok {
		return nil
	}
	if c.Role == RoleNone {
		s.refused(refusedUnauthenticated)
		return &UnauthenticatedError{Message: "no token"}
	}
	ns := NamespaceOf(ctx)
	if c.Namespace != "" && c.Namespace != ns {
		s.refused(refusedNamespace)
		return forbidden(c, op, rule.Role, ns)
	}
	if c.Role < rule.Role {
		s.refused(refusedRole)
		return forbidden(c, op, rule.Role, ns)
	}
	if rule.Cluster && c.Namespace != "" {
		s.refused(refusedRole)
		return &ForbiddenError{Need: rule.Role, Namespace: ns,
			Message: fmt.Sprintf("%s needs an admin of every namespace (the auth_token); a token of namespace %q may not", op, c.Namespace)}
	}
	return nil
}

// Bootstrap and anonymous callers' token ids.
const (
	// BootstrapTokenID is the caller of the config's auth_token.
	BootstrapTokenID = "bootstrap"
	// AnonymousTokenID is every caller of a host without an auth_token.
	AnonymousTokenID = "anonymous"
	// HostTokenID is the audit log's token id of a call made by the host
	// itself (a context without a caller).
	HostTokenID = "host"
)

// WithAuthToken sets the bootstrap token (the config's auth_token): it
// authenticates as an admin of every namespace. Without one ("") the host
// is open: Authenticate answers every request, with or without a token,
// as the anonymous admin, and stored tokens are not checked until an
// auth_token is set (docs/DESIGN.md "Tokens, roles and the audit log").
// Call it before serving.
func (s *Service) WithAuthToken(token string) *Service {
	s.bootstrap = nil
	if token != "" {
		h := sha256.Sum256([]byte(token))
		s.bootstrap = h[:]
	}
	return s
}

// Open reports whether the host is open (no auth_token).
func (s *Service) Open() bool { return s.bootstrap == nil }

// Authenticate returns the caller a bearer token stands for: the
// bootstrap admin for the auth_token, a stored token's caller for a valid
// (not revoked) one "pdk_<id>_<secret>", and on an open host the anonymous
// admin whatever was sent. Otherwise an *UnauthenticatedError (counted);
// a store failure is returned as it is. Comparisons are constant-time;
// neither the token nor its hash appears in an error.
func (s *Service) Authenticate(ctx context.Context, bearer string) (Caller, error) {
	if s.Open() {
		return Caller{TokenID: AnonymousTokenID, Role: RoleAdmin}, nil
	}
	if bearer == "" {
		s.refused(refusedUnauthenticated)
		return Caller{}, &UnauthenticatedError{Message: "missing bearer token (Authorization: Bearer <token>)"}
	}
	// Hashes of equal length: the comparison tells nothing of the
	// token's length either.
	h := sha256.Sum256([]byte(bearer))
	if subtle.ConstantTimeCompare(h[:], s.bootstrap) == 1 {
		return Caller{TokenID: BootstrapTokenID, Role: RoleAdmin}, nil
	}
	unknown := &UnauthenticatedError{Message: "unknown, revoked or malformed bearer token"}
	id, secret, ok := parseToken(bearer)
	if !ok {
		s.refused(refusedUnauthenticated)
		return Caller{}, unknown
	}
	t, err := s.st.GetToken(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		s.refused(refusedUnauthenticated)
		return Caller{}, unknown
	}
	if err != nil {
		return Caller{}, wrap("authenticate", err)
	}
	sum := sha256.Sum256(secret)
	role, rerr := ParseRole(t.Role)
	if subtle.ConstantTimeCompare(sum[:], t.Hash) != 1 || t.RevokedAt != nil || rerr != nil {
		s.refused(refusedUnauthenticated)
		return Caller{}, unknown
	}
	return Caller{TokenID: t.ID, Role: role, Namespace: t.Namespace}, nil
}

// CheckCaller re-checks a caller authenticated earlier (a console
// session's): a stored token that was revoked or deleted since, or any
// caller but the anonymous one once the host is open no more, is refused
// with an *UnauthenticatedError.
func (s *Service) CheckCaller(ctx context.Context, c Caller) error {
	switch c.TokenID {
	case AnonymousTokenID:
		if s.Open() {
			return nil
		}
	case BootstrapTokenID:
		if !s.Open() {
			return nil
		}
	default:
		t, err := s.st.GetToken(ctx, c.TokenID)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return wrap("check caller", err)
		}
		if err == nil && t.RevokedAt == nil {
			return nil
		}
	}
	return &UnauthenticatedError{Message: "the token of this session was revoked; log in again"}
}

// callerOf returns ctx's caller, or the host itself (an admin of every
// namespace) when none was set.
func callerOf(ctx context.Context) Caller {
	if c, ok := CallerFrom(ctx); ok {
		return c
	}
	return Caller{TokenID: HostTokenID, Role: RoleAdmin}
}

// scope is the namespace a listing of tokens or audit rows covers, and
// the one a revoked token must belong to: the namespace the request acts
// in (NamespaceOf), like every other operation — the bootstrap admin reads
// another namespace's with ?namespace= (docs/DESIGN.md "Namespaces").
func scope(ctx context.Context) string { return NamespaceOf(ctx) }
