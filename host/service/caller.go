package service

import (
	"context"
	"fmt"
)

// Role is what a token may do (docs/DESIGN.md "Namespaces, tokens and
// roles"). Roles are ordered: each one may do everything the ones below it
// may.
type Role int

// The roles, lowest first.
const (
	// RoleNone may do nothing (no token, or an unknown one).
	RoleNone Role = iota
	// RoleReader reads: agents, sessions, events, transcripts, streams,
	// waits, modules, plugins, secret names.
	RoleReader
	// RoleClient also creates sessions and sends signals (messages).
	RoleClient
	// RoleOperator also steers, cancels, wakes, destroys, redrives and
	// discards, and resolves waits.
	RoleOperator
	// RoleAdmin also registers agents, modules, plugins and secrets, and
	// creates and revokes tokens; it reads the audit log.
	RoleAdmin
)

// String returns the role's name: reader, client, operator or admin ("none"
// for RoleNone).
func (r Role) String() string {
	switch r {
	case RoleReader:
		return "reader"
	case RoleClient:
		return "client"
	case RoleOperator:
		return "operator"
	case RoleAdmin:
		return "admin"
	}
	return "none"
}

// ParseRole returns the role named s (reader, client, operator, admin), or an
// *InvalidError (field "role").
func ParseRole(s string) (Role, error) {
	for r := RoleReader; r <= RoleAdmin; r++ {
		if r.String() == s {
			return r, nil
		}
	}
	return RoleNone, invalid("role", "role %q must be reader, client, operator or admin", s)
}

// Caller is who makes a request, as a front door authenticated it.
type Caller struct {
	// TokenID identifies the token (never its value): a stored token's id,
	// "bootstrap" for the config's auth_token, "anonymous" when the host
	// requires no token.
	TokenID string
	// Role is what the token may do.
	Role Role
	// Namespace is the token's namespace; "" means every namespace (the
	// bootstrap admin, and the anonymous caller of a host without a
	// token).
	Namespace string
}

// callerKey and namespaceKey are the context keys of WithCaller and
// WithNamespace.
type (
	callerKey    struct{}
	namespaceKey struct{}
)

// WithCaller returns ctx carrying c: the service's operations act for c.
// A context without a caller is an in-process caller of the host itself
// (config seeding, the bench), which acts as an admin of every namespace;
// every front door sets one.
func WithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerFrom returns ctx's caller, and false when none was set.
func CallerFrom(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok
}

// WithNamespace returns ctx naming the namespace a request addresses (the
// API's ?namespace=, the CLI's --namespace). Empty: none named.
func WithNamespace(ctx context.Context, ns string) context.Context {
	return context.WithValue(ctx, namespaceKey{}, ns)
}

// NamespaceOf returns the namespace the operations of ctx act in: the one a
// request named (WithNamespace), else its caller's token's namespace, else
// DefaultNamespace. It does not check that the caller may act there
// (Authorize does).
func NamespaceOf(ctx context.Context) string {
	if ns, _ := ctx.Value(namespaceKey{}).(string); ns != "" {
		return ns
	}
	if c, ok := CallerFrom(ctx); ok && c.Namespace != "" {
		return c.Namespace
	}
	return DefaultNamespace
}

// ForbiddenError refuses a caller that is authenticated but may not do
// what it asked: its role is below the operation's (Need), or the
// namespace it addressed is not its token's. Front doors answer 403.
type ForbiddenError struct {
	// Need is the role the operation needs (RoleNone for a namespace
	// refusal).
	Need Role
	// Namespace is the namespace addressed.
	Namespace string
	Message   string
}

// Error returns the message.
func (e *ForbiddenError) Error() string { return e.Message }

// UnauthenticatedError refuses a request without a known token. Front doors
// answer 401.
type UnauthenticatedError struct{ Message string }

// Error returns the message.
func (e *UnauthenticatedError) Error() string { return e.Message }

// QuotaError refuses work over a namespace's quota. Front doors answer 429
// with Retry-After (RetryAfter, rounded up to whole seconds).
type QuotaError struct {
	Namespace string
	// Quota names the quota: live_sessions, signals_per_minute,
	// model_tokens_per_day.
	Quota      string
	RetryAfter int64 // seconds
	Message    string
}

// Error returns the message.
func (e *QuotaError) Error() string { return e.Message }

// forbidden builds the refusal of caller c for op, which needs role need,
// in namespace ns. The message names the op: a request may need more than
// its route suggests (a message sent with mid_turn "steer" is
// signal.steer: SignalOp).
func forbidden(c Caller, op Op, need Role, ns string) *ForbiddenError {
	if c.Namespace != "" && c.Namespace != ns {
		return &ForbiddenError{Namespace: ns, Message: fmt.Sprintf("this token belongs to namespace %q, not %q", c.Namespace, ns)}
	}
	return &ForbiddenError{Need: need, Namespace: ns, Message: fmt.Sprintf("%s needs role %s; the token's role is %s", op, need, c.Role)}
}
