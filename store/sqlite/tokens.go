package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/paddock-dev/paddock/store"
)

// tokenCols are the columns scanTokenRow reads, hash last.
const tokenCols = `id, namespace, role, name, created_at, created_by, revoked_at`

// scanToken reads a token row of tokenCols (and hash when withHash).
func scanToken(sc interface{ Scan(...any) error }, withHash bool) (store.Token, error) {
	var t store.Token
	var created int64
	var revoked sql.NullInt64
	dest := []any{&t.ID, &t.Namespace, &t.Role, &t.Name, &created, &t.CreatedBy, &revoked}
	if withHash {
		dest = append(dest, &t.Hash)
	}
	if err := sc.Scan(dest...); err != nil {
		return store.Token{}, err
	}
	t.CreatedAt, t.RevokedAt = msTime(created), msPtr(revoked)
	return t, nil
}

// CreateToken stores a token; see store.Store.
func (s *Store) CreateToken(ctx context.Context, p store.CreateTokenParams) (store.Token, error) {
	if err := store.CheckToken(p); err != nil {
		return store.Token{}, fmt.Errorf("store/sqlite: create token: %w", err)
	}
	var t store.Token
	err := s.write(ctx, "create token", func(tx *txn) error {
		var err error
		t, err = scanToken(tx.queryRow(`
			INSERT INTO api_tokens (id, namespace, role, name, hash, created_at, created_by)
			VALUES (?1, ?2, ?3, ?4, ?5, `+nowMS+`, ?6)
			RETURNING `+tokenCols, p.ID, p.Namespace, p.Role, p.Name, p.Hash, p.CreatedBy), false)
		if isConstraint(err) {
			return fmt.Errorf("token %s exists: %w", p.ID, store.ErrConflict)
		}
		return err
	})
	return t, err
}

// GetToken returns a token with its hash, or store.ErrNotFound.
func (s *Store) GetToken(ctx context.Context, id string) (store.Token, error) {
	if err := store.CheckTokenID(id); err != nil {
		return store.Token{}, fmt.Errorf("store/sqlite: get token: %w", err)
	}
	var t store.Token
	err := s.read(ctx, "get token", func(tx *txn) error {
		var err error
		t, err = scanToken(tx.queryRow(`SELECT `+tokenCols+`, hash FROM api_tokens WHERE id = ?`, id), true)
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
	err := s.read(ctx, "list tokens", func(tx *txn) error {
		rows, err := tx.query(`SELECT `+tokenCols+` FROM api_tokens
			WHERE ?1 = '' OR namespace = ?1 ORDER BY created_at, id`, namespace)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			t, err := scanToken(rows, false)
			if err != nil {
				return err
			}
			out = append(out, t)
		}
		return rows.Err()
	})
	return out, err
}

// RevokeToken revokes a token (idempotent: the first revoked_at stays).
func (s *Store) RevokeToken(ctx context.Context, id string) (store.Token, error) {
	if err := store.CheckTokenID(id); err != nil {
		return store.Token{}, fmt.Errorf("store/sqlite: revoke token: %w", err)
	}
	var t store.Token
	err := s.write(ctx, "revoke token", func(tx *txn) error {
		var err error
		t, err = scanToken(tx.queryRow(`
			UPDATE api_tokens SET revoked_at = coalesce(revoked_at, `+nowMS+`)
			WHERE id = ? RETURNING `+tokenCols, id), false)
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
	var at int64
	err := sc.Scan(&e.ID, &at, &e.TokenID, &e.Namespace, &e.Action, &e.Object, &e.Result, &e.Status)
	e.At = msTime(at)
	return e, err
}

// AppendAudit appends a row to the audit log; see store.Store.
func (s *Store) AppendAudit(ctx context.Context, p store.AppendAuditParams) (store.AuditEntry, error) {
	if err := store.CheckAudit(p); err != nil {
		return store.AuditEntry{}, fmt.Errorf("store/sqlite: append audit: %w", err)
	}
	var e store.AuditEntry
	err := s.write(ctx, "append audit", func(tx *txn) error {
		var err error
		e, err = insertAudit(tx, p)
		return err
	})
	return e, err
}

// insertAudit inserts one audit row (checked by store.CheckAudit) in tx.
func insertAudit(tx *txn, p store.AppendAuditParams) (store.AuditEntry, error) {
	return scanAudit(tx.queryRow(`
		INSERT INTO audit_log (at, token_id, namespace, action, object, result, status)
		VALUES (`+nowMS+`, ?, ?, ?, ?, ?, ?) RETURNING `+auditCols,
		p.TokenID, p.Namespace, p.Action, p.Object, p.Result, p.Status))
}

// ListAudit returns a page of the audit log, newest first.
func (s *Store) ListAudit(ctx context.Context, p store.ListAuditParams) ([]store.AuditEntry, error) {
	p, err := store.CheckListAudit(p)
	if err != nil {
		return nil, fmt.Errorf("store/sqlite: list audit: %w", err)
	}
	out := []store.AuditEntry{}
	err = s.read(ctx, "list audit", func(tx *txn) error {
		rows, err := tx.query(`SELECT `+auditCols+` FROM audit_log
			WHERE (?1 = '' OR namespace = ?1) AND (?2 = 0 OR id < ?2)
			ORDER BY id DESC LIMIT ?3`, p.Namespace, p.Before, p.Limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			e, err := scanAudit(rows)
			if err != nil {
				return err
			}
			out = append(out, e)
		}
		return rows.Err()
	})
	return out, err
}
