package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paddock-dev/paddock/store"
)

// tokenCols are the columns scanToken reads (hash appended when asked).
const tokenCols = `id, namespace, role, name, created_at, created_by, revoked_at`

func scanToken(sc interface{ Scan(...any) error }, withHash bool) (store.Token, error) {
	var t store.Token
	var revoked *time.Time
	dest := []any{&t.ID, &t.Namespace, &t.Role, &t.Name, &t.CreatedAt, &t.CreatedBy, &revoked}
	if withHash {
		dest = append(dest, &t.Hash)
	}
	if err := sc.Scan(dest...); err != nil {
		return store.Token{}, err
	}
	t.CreatedAt, t.RevokedAt = utc(t.CreatedAt), utcPtr(revoked)
	return t, nil
}

// CreateToken stores a token; see store.Store.
func (s *Store) CreateToken(ctx context.Context, p store.CreateTokenParams) (store.Token, error) {
	if err := store.CheckToken(p); err != nil {
		return store.Token{}, fmt.Errorf("store/postgres: create token: %w", err)
	}
	var t store.Token
	err := s.call(ctx, "create token", func(ctx context.Context) error {
		var err error
		t, err = scanToken(s.pool.QueryRow(ctx, `
			INSERT INTO api_tokens (id, namespace, role, name, hash, created_by)
			VALUES ($1, $2, $3, $4, $5, $6) RETURNING `+tokenCols,
			p.ID, p.Namespace, p.Role, p.Name, p.Hash, p.CreatedBy), false)
		if pgCode(err) == codeUniqueViolation {
			return fmt.Errorf("token %s exists: %w", p.ID, store.ErrConflict)
		}
		return err
	})
	return t, err
}

// GetToken returns a token with its hash, or store.ErrNotFound.
func (s *Store) GetToken(ctx context.Context, id string) (store.Token, error) {
	if err := store.CheckTokenID(id); err != nil {
		return store.Token{}, fmt.Errorf("store/postgres: get token: %w", err)
	}
	var t store.Token
	err := s.call(ctx, "get token", func(ctx context.Context) error {
		var err error
		t, err = scanToken(s.pool.QueryRow(ctx, `SELECT `+tokenCols+`, hash FROM api_tokens WHERE id = $1`, id), true)
		if err != nil {
			return fmt.Errorf("token %s: %w", id, notFound(err))
		}
		return nil
	})
	return t, err
}

// ListTokens returns the tokens of a namespace ("" = all), oldest first.
func (s *Store) ListTokens(ctx context.Context, namespace string) ([]store.Token, error) {
	var out []store.Token
	err := s.call(ctx, "list tokens", func(ctx context.Context) error {
		rows, err := s.pool.Query(ctx, `SELECT `+tokenCols+` FROM api_tokens
			WHERE $1 = '' OR namespace = $1 ORDER BY created_at, id`, namespace)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Token, error) { return scanToken(r, false) })
		return err
	})
	return out, err
}

// RevokeToken revokes a token (idempotent: the first revoked_at stays).
func (s *Store) RevokeToken(ctx context.Context, id string) (store.Token, error) {
	if err := store.CheckTokenID(id); err != nil {
		return store.Token{}, fmt.Errorf("store/postgres: revoke token: %w", err)
	}
	var t store.Token
	err := s.call(ctx, "revoke token", func(ctx context.Context) error {
		var err error
		t, err = scanToken(s.pool.QueryRow(ctx, `
			UPDATE api_tokens SET revoked_at = coalesce(revoked_at, clock_timestamp())
			WHERE id = $1 RETURNING `+tokenCols, id), false)
		if err != nil {
			return fmt.Errorf("token %s: %w", id, notFound(err))
		}
		return nil
	})
	return t, err
}

// auditCols are the columns scanAudit reads.
const auditCols = `id, at, token_id, namespace, action, object, result, status`

func scanAudit(sc interface{ Scan(...any) error }) (store.AuditEntry, error) {
	var e store.AuditEntry
	err := sc.Scan(&e.ID, &e.At, &e.TokenID, &e.Namespace, &e.Action, &e.Object, &e.Result, &e.Status)
	e.At = utc(e.At)
	return e, err
}

// insertAuditSQL inserts one audit row (auditArgs) and returns it.
const insertAuditSQL = `INSERT INTO audit_log (token_id, namespace, action, object, result, status)
	VALUES ($1, $2, $3, $4, $5, $6) RETURNING ` + auditCols

// auditArgs are insertAuditSQL's arguments.
func auditArgs(p store.AppendAuditParams) []any {
	return []any{p.TokenID, p.Namespace, p.Action, p.Object, p.Result, p.Status}
}

// AppendAudit appends a row to the audit log; see store.Store. Concurrent
// calls share batches and commits with each other and with appends
// (the group commit), each returning once its row is committed.
func (s *Store) AppendAudit(ctx context.Context, p store.AppendAuditParams) (store.AuditEntry, error) {
	if err := store.CheckAudit(p); err != nil {
		return store.AuditEntry{}, fmt.Errorf("store/postgres: append audit: %w", err)
	}
	if s.groupCommit {
		r := s.appends.do(ctx, appendIn{audit: &p})
		if !r.solo {
			return r.row, wrap("append audit", r.err)
		}
	}
	var e store.AuditEntry
	err := s.call(ctx, "append audit", func(ctx context.Context) error {
		var err error
		e, err = scanAudit(s.pool.QueryRow(ctx, insertAuditSQL, auditArgs(p)...))
		return err
	})
	return e, err
}

// ListAudit returns a page of the audit log, newest first.
func (s *Store) ListAudit(ctx context.Context, p store.ListAuditParams) ([]store.AuditEntry, error) {
	p, err := store.CheckListAudit(p)
	if err != nil {
		return nil, fmt.Errorf("store/postgres: list audit: %w", err)
	}
	out := []store.AuditEntry{}
	err = s.call(ctx, "list audit", func(ctx context.Context) error {
		rows, err := s.pool.Query(ctx, `SELECT `+auditCols+` FROM audit_log
			WHERE ($1 = '' OR namespace = $1) AND ($2 = 0 OR id < $2)
			ORDER BY id DESC LIMIT $3`, p.Namespace, p.Before, p.Limit)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.AuditEntry, error) { return scanAudit(r) })
		return err
	})
	return out, err
}
