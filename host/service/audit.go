package service

import (
	"context"
	"regexp"
	"strings"
	"sync/atomic"
	"unicode/utf8"

	"github.com/paddock-dev/paddock/store"
)

// Audit appends one row to the audit log: ctx's caller's token id (the
// host's own, HostTokenID, without a caller), the namespace ctx addresses,
// op, the object (the addressed resource's path), result ("ok" or the
// error code answered) and the front door's status (0 when it has none).
// Front doors call it for every call of a mutating op (OpRule.Mutates)
// that passed Authorize; refused calls write nothing, not even this row.
func (s *Service) Audit(ctx context.Context, op Op, object, result string, status int) error {
	// A path may be as long as a request line: the row keeps its head,
	// marked cut, so that every call is recorded (a row refused for its
	// length would hide the call from the log).
	_, err := s.st.AppendAudit(ctx, auditRow(ctx, op, object, result, status))
	return wrap("audit", err)
}

// auditRow is Audit's row.
func auditRow(ctx context.Context, op Op, object, result string, status int) store.AppendAuditParams {
	return store.AppendAuditParams{
		TokenID: callerOf(ctx).TokenID, Namespace: cutAuditField(auditText(NamespaceOf(ctx))), Action: string(op),
		Object: cutAuditField(auditText(redactTokens(object))), Result: cutAuditField(auditText(result)), Status: status,
	}
}

// CallAudit is the audit row of one front-door call, which the call's
// store write may carry in its own transaction instead of a commit of its
// own after it (store.AppendEventParams.Audit): a message signal writes it
// with the event it appends. A front door puts it in the call's context
// (WithCallAudit) before its handler runs; the handler sets Status when
// its answer on success is known in advance. Written then reports whether
// the row went out with the write (result "ok", that Status), and the
// front door writes none; otherwise it writes the row of its answer, as
// for any call. It is safe for concurrent use.
type CallAudit struct {
	// Op and Object are the row's action and object (as Audit's).
	Op     Op
	Object string
	// Status is the status the call answers when its write succeeds; 0:
	// the write carries no row.
	Status  int
	written atomic.Bool
}

// Written reports whether the call's row was written with its store
// write.
func (c *CallAudit) Written() bool { return c != nil && c.written.Load() }

type callAuditKey struct{}

// WithCallAudit returns ctx carrying the call's audit row c.
func WithCallAudit(ctx context.Context, c *CallAudit) context.Context {
	return context.WithValue(ctx, callAuditKey{}, c)
}

// carriedAudit returns the row the store write of ctx's call carries (nil:
// none) and the CallAudit to mark once it was written.
func carriedAudit(ctx context.Context) (*store.AppendAuditParams, *CallAudit) {
	c, _ := ctx.Value(callAuditKey{}).(*CallAudit)
	if c == nil || c.Status == 0 || c.Op == "" {
		return nil, nil
	}
	row := auditRow(ctx, c.Op, c.Object, "ok", c.Status)
	return &row, c
}

// AuditPage selects a page of the audit log, newest first.
type AuditPage struct {
	// Before is the id of the previous page's last row (0: the newest).
	Before int64
	// Limit is the page size: 0 means store.DefaultAuditLimit, at most
	// store.MaxAuditLimit.
	Limit int
}

// ListAudit returns a page of the audit log (OpAuditRead: admins): the
// rows of the namespace the request acts in (NamespaceOf: a caller of
// every namespace names another with ?namespace=).
// Refusals: *InvalidError (before, limit). next is the cursor of the
// following page (0: this was the last).
func (s *Service) ListAudit(ctx context.Context, p AuditPage) (rows []store.AuditEntry, next int64, err error) {
	if err := s.Authorize(ctx, OpAuditRead); err != nil {
		return nil, 0, err
	}
	if p.Before < 0 {
		return nil, 0, invalid("before", "before=%d must not be negative", p.Before)
	}
	if p.Limit, err = pageSize(p.Limit, store.DefaultAuditLimit, store.MaxAuditLimit); err != nil {
		return nil, 0, err
	}
	rows, err = s.st.ListAudit(ctx, store.ListAuditParams{Namespace: scope(ctx), Before: p.Before, Limit: p.Limit})
	if err != nil {
		return nil, 0, wrap("list audit", err)
	}
	if len(rows) == p.Limit {
		next = rows[len(rows)-1].ID
	}
	return rows, next, nil
}

// tokenInPath matches a bearer token's value pasted into a path (a revoke
// given the value instead of the id).
var tokenInPath = regexp.MustCompile(TokenPrefix + `[^/]*`)

// redactTokens replaces every token value in path by "pdk_…": the audit
// log records paths, and a token's secret never reaches a row.
func redactTokens(path string) string {
	return tokenInPath.ReplaceAllString(path, TokenPrefix+"…")
}

// auditText is s as a text column stores it on every driver: invalid UTF-8
// and NUL bytes (a percent-escaped path may hold both; PostgreSQL refuses
// them, which would lose the call's row) become U+FFFD.
func auditText(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// cutAuditField cuts s to store.MaxAuditField bytes (on a UTF-8
// boundary), ending it with "…" when cut.
func cutAuditField(s string) string {
	if len(s) <= store.MaxAuditField {
		return s
	}
	const mark = "…"
	n := store.MaxAuditField - len(mark)
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + mark
}
