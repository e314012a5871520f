package service

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// ResourceToken is a stored API token.
const ResourceToken Resource = "token"

// TokenPrefix starts every stored token's value: "pdk_<id>_<secret>", the
// id store.TokenIDLen hex characters, the secret base64url (no padding)
// of 32 random bytes (256 bits).
const TokenPrefix = "pdk_"

// tokenSecretBytes is the size of a token's random secret.
const tokenSecretBytes = 32

// parseToken splits a stored token's value into its id and its secret's
// bytes; ok is false when v does not have the shape.
func parseToken(v string) (id string, secret []byte, ok bool) {
	rest, found := strings.CutPrefix(v, TokenPrefix)
	if !found || len(rest) < store.TokenIDLen+1 || rest[store.TokenIDLen] != '_' {
		return "", nil, false
	}
	id = rest[:store.TokenIDLen]
	if store.CheckTokenID(id) != nil {
		return "", nil, false
	}
	secret, err := base64.RawURLEncoding.DecodeString(rest[store.TokenIDLen+1:])
	if err != nil || len(secret) != tokenSecretBytes {
		return "", nil, false
	}
	return id, secret, true
}

// CreateTokenParams are CreateToken's inputs.
type CreateTokenParams struct {
	// Namespace is the token's namespace ("": the one the request
	// addresses, NamespaceOf).
	Namespace string
	// Role is reader, client, operator or admin.
	Role string
	// Name describes the token (at most store.MaxTokenNameLen bytes).
	Name string
}

// NewToken is a created token and its value, which is shown this once:
// the store keeps only its hash.
type NewToken struct {
	store.Token
	// Value is the bearer token, "pdk_<id>_<secret>".
	Value string
}

// CreateToken creates a token of p.Role in p.Namespace, made by ctx's
// caller (OpTokenCreate: admins). A caller of one namespace creates tokens
// of that namespace only (*ForbiddenError), and never of a role above its
// own. Refusals: *InvalidError (role, name), *NotFoundError for an
// undeclared namespace (CheckNamespace), a *ConflictError ConflictHostOpen
// on a host without an auth_token (it checks no token).
func (s *Service) CreateToken(ctx context.Context, p CreateTokenParams) (NewToken, error) {
	if err := s.Authorize(ctx, OpTokenCreate); err != nil {
		return NewToken{}, err
	}
	if s.Open() {
		// Anyone who reaches an open host could mint an admin token that
		// would hold once an auth_token is set.
		return NewToken{}, &ConflictError{Reason: ConflictHostOpen, Field: "",
			Message: "this host has no auth_token, so it checks no token and makes none: set auth_token (PADDOCK_AUTH_TOKEN) and create tokens with it"}
	}
	c := callerOf(ctx)
	ns := p.Namespace
	if named, _ := ctx.Value(namespaceKey{}).(string); named != "" && ns != "" && named != ns {
		// Two namespaces named (?namespace= and the body's): which one the
		// caller meant is not for the host to guess.
		return NewToken{}, invalid("namespace", "the request names namespace %q and the token namespace %q: name one, or the same in both", named, ns)
	}
	if ns == "" {
		ns = NamespaceOf(ctx)
	}
	if c.Namespace != "" && c.Namespace != ns {
		s.refused(refusedNamespace)
		return NewToken{}, forbidden(c, OpTokenCreate, RoleAdmin, ns)
	}
	if p.Role == "" {
		return NewToken{}, missing("role", "a token needs a role: reader, client, operator or admin")
	}
	role, err := ParseRole(p.Role)
	if err != nil {
		return NewToken{}, err
	}
	if role > c.Role {
		s.refused(refusedRole)
		return NewToken{}, &ForbiddenError{Need: role, Namespace: ns,
			Message: fmt.Sprintf("a token of role %s cannot create one of role %s", c.Role, role)}
	}
	if len(p.Name) > store.MaxTokenNameLen {
		return NewToken{}, invalid("name", "name of %d bytes: at most %d", len(p.Name), store.MaxTokenNameLen)
	}
	if err := abi.ValidText(p.Name); err != nil {
		return NewToken{}, invalid("name", "name %v", err)
	}
	if err := s.CheckNamespace(ns); err != nil {
		return NewToken{}, err
	}
	var idb [store.TokenIDLen / 2]byte
	var secret [tokenSecretBytes]byte
	_, _ = rand.Read(idb[:]) // never fails (crypto/rand)
	_, _ = rand.Read(secret[:])
	sum := sha256.Sum256(secret[:])
	t, err := s.st.CreateToken(ctx, store.CreateTokenParams{
		ID: hex.EncodeToString(idb[:]), Namespace: ns, Role: role.String(), Name: p.Name, CreatedBy: c.TokenID, Hash: sum[:],
	})
	if err != nil {
		return NewToken{}, wrap("create token", err)
	}
	return NewToken{Token: t, Value: TokenPrefix + t.ID + "_" + base64.RawURLEncoding.EncodeToString(secret[:])}, nil
}

// ListTokens lists tokens without their values or hashes (OpTokenRead:
// admins) of the namespace the request acts in (NamespaceOf: a caller of
// every namespace names another with ?namespace=).
func (s *Service) ListTokens(ctx context.Context) ([]store.Token, error) {
	if err := s.Authorize(ctx, OpTokenRead); err != nil {
		return nil, err
	}
	ts, err := s.st.ListTokens(ctx, scope(ctx))
	if err != nil {
		return nil, wrap("list tokens", err)
	}
	for i := range ts {
		ts[i].Hash = nil
	}
	return ts, nil
}

// RevokeToken revokes a token by id (OpTokenRevoke: admins); it stops
// authenticating at once, on every host (each request reads its row).
// Revoking a revoked token changes nothing and answers it again. A token
// of another namespace than a namespace caller's is not found
// (*NotFoundError), as is an unknown id; the bootstrap token is not a
// stored one (change auth_token to replace it).
func (s *Service) RevokeToken(ctx context.Context, id string) (store.Token, error) {
	if err := s.Authorize(ctx, OpTokenRevoke); err != nil {
		return store.Token{}, err
	}
	if strings.HasPrefix(id, TokenPrefix) {
		// A token's value given for its id: never echoed (it holds the
		// secret).
		return store.Token{}, invalid("id", "that is a token's value, not its id: revoke by the id (the %d hex characters after %q)", store.TokenIDLen, TokenPrefix)
	}
	if store.CheckTokenID(id) != nil {
		return store.Token{}, invalid("id", "a token id is %d lowercase hex characters", store.TokenIDLen)
	}
	notFound := &NotFoundError{Resource: ResourceToken, Field: "id", Message: fmt.Sprintf("no token %q", id)}
	t, err := s.st.GetToken(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return store.Token{}, notFound
	}
	if err != nil {
		return store.Token{}, wrap("revoke token", err)
	}
	if ns := scope(ctx); ns != "" && ns != t.Namespace {
		// Another namespace's token, also for the bootstrap admin acting
		// in a named namespace: found as missing (docs/DESIGN.md
		// "Namespaces").
		return store.Token{}, notFound
	}
	t, err = s.st.RevokeToken(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return store.Token{}, notFound
	}
	if err != nil {
		return store.Token{}, wrap("revoke token", err)
	}
	return t, nil
}
