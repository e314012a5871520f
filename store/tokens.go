package store

import (
	"fmt"
	"time"
)

// Token is a stored API token (docs/DESIGN.md "Tokens, roles and the audit
// log"): its id, namespace, role and name, never its value. The store keeps
// only Hash, the sha256 of the token's secret part.
type Token struct {
	// ID is the token's public id (TokenIDLen lowercase hex characters);
	// it is part of the token's value and names it in lists and the audit
	// log.
	ID string `json:"id"`
	// Namespace is the one namespace the token acts in.
	Namespace string `json:"namespace"`
	// Role is reader, client, operator or admin.
	Role string `json:"role"`
	// Name is a free description (at most MaxTokenNameLen bytes).
	Name      string    `json:"name,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	// CreatedBy is the token id of the caller that created it.
	CreatedBy string `json:"created_by"`
	// RevokedAt is when it was revoked (nil: it is valid).
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
	// Hash is sha256 of the token's secret part (TokenHashLen bytes).
	Hash []byte `json:"-"`
}

// Token limits.
const (
	// TokenIDLen is the length of a token id: 16 lowercase hex characters.
	TokenIDLen = 16
	// TokenHashLen is the length of a token's hash (sha256).
	TokenHashLen = 32
	// MaxTokenNameLen bounds a token's name, in bytes.
	MaxTokenNameLen = 200
	// MaxNamespaceLen bounds the namespace of a token or an audit row.
	MaxNamespaceLen = 63
	// DefaultAuditLimit and MaxAuditLimit bound a page of the audit log.
	DefaultAuditLimit, MaxAuditLimit = 100, 1000
)

// TokenRoles are the roles a token may have, lowest first.
var TokenRoles = []string{"reader", "client", "operator", "admin"}

// CreateTokenParams are CreateToken's inputs (CheckToken).
type CreateTokenParams struct {
	ID, Namespace, Role, Name, CreatedBy string
	Hash                                 []byte
}

// CheckTokenID validates a token id: TokenIDLen characters of [0-9a-f].
// The error names it and wraps ErrInvalid.
func CheckTokenID(id string) error {
	if len(id) != TokenIDLen {
		return fmt.Errorf("token id %q: want %d lowercase hex characters: %w", id, TokenIDLen, ErrInvalid)
	}
	for _, r := range id {
		if !(r >= '0' && r <= '9' || r >= 'a' && r <= 'f') {
			return fmt.Errorf("token id %q: want %d lowercase hex characters: %w", id, TokenIDLen, ErrInvalid)
		}
	}
	return nil
}

// CheckToken validates CreateToken's inputs: the id (CheckTokenID), a
// namespace of 1 to MaxNamespaceLen bytes, one of TokenRoles, a name of at
// most MaxTokenNameLen bytes, a creator, and a hash of TokenHashLen bytes.
// Errors wrap ErrInvalid.
func CheckToken(p CreateTokenParams) error {
	if err := CheckTokenID(p.ID); err != nil {
		return err
	}
	if p.Namespace == "" || len(p.Namespace) > MaxNamespaceLen {
		return fmt.Errorf("token %s: namespace %q: want 1 to %d bytes: %w", p.ID, p.Namespace, MaxNamespaceLen, ErrInvalid)
	}
	known := false
	for _, r := range TokenRoles {
		known = known || r == p.Role
	}
	if !known {
		return fmt.Errorf("token %s: role %q is not one of %v: %w", p.ID, p.Role, TokenRoles, ErrInvalid)
	}
	if len(p.Name) > MaxTokenNameLen {
		return fmt.Errorf("token %s: name of %d bytes: at most %d: %w", p.ID, len(p.Name), MaxTokenNameLen, ErrInvalid)
	}
	if p.CreatedBy == "" {
		return fmt.Errorf("token %s: no creator: %w", p.ID, ErrInvalid)
	}
	if len(p.Hash) != TokenHashLen {
		return fmt.Errorf("token %s: hash of %d bytes, want %d: %w", p.ID, len(p.Hash), TokenHashLen, ErrInvalid)
	}
	return nil
}

// AuditEntry is one row of the audit log: who (a token id) did what
// (Action, an operation's name such as "session.destroy") to which object
// (the addressed resource's path), when (the database clock), and how it
// ended.
type AuditEntry struct {
	// ID orders the log: larger is later.
	ID        int64     `json:"id"`
	At        time.Time `json:"at"`
	TokenID   string    `json:"token_id"`
	Namespace string    `json:"namespace"`
	Action    string    `json:"action"`
	Object    string    `json:"object"`
	// Result is "ok" or the error code the call was answered with.
	Result string `json:"result"`
	// Status is the HTTP status of the answer (0 for a front door
	// without one).
	Status int `json:"status"`
}

// AppendAuditParams are AppendAudit's inputs (CheckAudit).
type AppendAuditParams struct {
	TokenID, Namespace, Action, Object, Result string
	Status                                     int
}

// MaxAuditField bounds each text field of an audit row, in bytes.
const MaxAuditField = 1024

// MaxAuditStatus bounds an audit row's status (an HTTP status code, 0
// for none).
const MaxAuditStatus = 999

// CheckAudit validates AppendAudit's inputs: token id, action and result
// are set; no text is longer than 1024 bytes; the status is within 0 to
// MaxAuditStatus. Errors wrap ErrInvalid.
func CheckAudit(p AppendAuditParams) error {
	if p.TokenID == "" || p.Action == "" || p.Result == "" {
		return fmt.Errorf("audit row without a token id, action or result (%q, %q, %q): %w", p.TokenID, p.Action, p.Result, ErrInvalid)
	}
	if p.Status < 0 || p.Status > MaxAuditStatus {
		return fmt.Errorf("audit row status %d: want 0 to %d: %w", p.Status, MaxAuditStatus, ErrInvalid)
	}
	for _, f := range []string{p.TokenID, p.Namespace, p.Action, p.Object, p.Result} {
		if len(f) > MaxAuditField {
			return fmt.Errorf("audit row field of %d bytes: at most %d: %w", len(f), MaxAuditField, ErrInvalid)
		}
	}
	return nil
}

// ListAuditParams select a page of the audit log, newest first.
type ListAuditParams struct {
	// Namespace filters the rows ("" = every namespace).
	Namespace string
	// Before is the cursor: only rows with a smaller id (0 = from the
	// newest).
	Before int64
	// Limit is the page size: 0 means DefaultAuditLimit, at most
	// MaxAuditLimit.
	Limit int
}

// CheckListAudit validates p and fills the default limit. Errors wrap
// ErrInvalid.
func CheckListAudit(p ListAuditParams) (ListAuditParams, error) {
	if p.Before < 0 {
		return p, fmt.Errorf("audit cursor before=%d is negative: %w", p.Before, ErrInvalid)
	}
	if p.Limit == 0 {
		p.Limit = DefaultAuditLimit
	}
	if p.Limit < 1 || p.Limit > MaxAuditLimit {
		return p, fmt.Errorf("audit limit %d: want 1 to %d: %w", p.Limit, MaxAuditLimit, ErrInvalid)
	}
	return p, nil
}
