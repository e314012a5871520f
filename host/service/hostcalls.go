package service

import (
	"context"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/paddock-dev/paddock/host/calls"
	"github.com/paddock-dev/paddock/store"
)

// ResourceSecret is a secret set through the API.
const ResourceSecret Resource = "secret"

// MaxSecretBytes bounds a secret's value, in bytes.
const MaxSecretBytes = 64 << 10

// ErrSecretsDisabled: the host has no secrets_key, so it cannot seal a
// secret set through the API (docs/DESIGN.md "Host calls and the journal").
var ErrSecretsDisabled = errors.New("this host has no secrets_key: secrets can only be declared in its config (secrets: NAME: {env|file})")

// Sealer encrypts a secret's value for the store (calls.Secrets).
type Sealer interface {
	// Seal encrypts value bound to name. It fails when the host has no
	// key (calls.ErrNoKey or similar).
	Seal(name string, value []byte) ([]byte, error)
	// Declared reports whether name is declared in the config, where it
	// wins over a secret set through the API.
	Declared(name string) bool
}

// WithSecrets makes s seal secrets set through PutSecret with sealer (nil:
// PutSecret returns ErrSecretsDisabled). It returns s.
func (s *Service) WithSecrets(sealer Sealer) *Service {
	s.sealer = sealer
	return s
}

// PutSecret seals value and stores it as the secret name of the namespace
// of ctx, creating or
// replacing it; the value is never returned or logged (docs/DESIGN.md
// invariant 13). Errors: *InvalidError ("name": 1–128 of [A-Za-z0-9_.-];
// "value": empty, not UTF-8, or holding a control character other than
// tab — a secret fills HTTP header values, which cannot carry one, so
// such a value could never be used; the error names the byte offset,
// never the value), *TooLargeError ("value", over MaxSecretBytes),
// *ConflictError (the config declares that name, and the config wins),
// ErrSecretsDisabled.
func (s *Service) PutSecret(ctx context.Context, name string, value []byte) (store.Secret, bool, error) {
	if err := store.CheckSecretName(name); err != nil {
		return store.Secret{}, false, invalid("name", "secret name %q: 1 to %d characters of A-Z, a-z, 0-9, '_', '.', '-'", name, store.MaxSecretNameLen)
	}
	if len(value) == 0 {
		return store.Secret{}, false, missing("value", "the secret's value is empty")
	}
	if len(value) > MaxSecretBytes {
		return store.Secret{}, false, &TooLargeError{Field: "value", Size: len(value), Limit: MaxSecretBytes,
			Message: fmt.Sprintf("the secret's value is %d bytes, more than the limit of %d", len(value), MaxSecretBytes)}
	}
	if err := checkSecretValue(value); err != nil {
		return store.Secret{}, false, err
	}
	ns, err := s.namespace(ctx)
	if err != nil {
		return store.Secret{}, false, err
	}
	if s.sealer == nil {
		return store.Secret{}, false, ErrSecretsDisabled
	}
	// Sealed and declared under the qualified name: the namespace is bound
	// into the sealed value (a value copied to another namespace does not
	// open), and the default namespace's keep their plain names.
	q := calls.Qualified(ns, name)
	if s.sealer.Declared(q) {
		return store.Secret{}, false, &ConflictError{Reason: ConflictSecretDeclared, Field: "name", Message: fmt.Sprintf("secret %q is declared in the host's config, which wins over the API: change it there", name)}
	}
	sealed, err := s.sealer.Seal(q, value)
	if err != nil {
		if errors.Is(err, calls.ErrNoKey) {
			return store.Secret{}, false, ErrSecretsDisabled
		}
		return store.Secret{}, false, fmt.Errorf("seal secret %q: %w", name, err)
	}
	sec, created, err := s.st.PutSecret(ctx, ns, name, sealed)
	if err != nil {
		return store.Secret{}, false, wrap("put secret", err)
	}
	return sec, created, nil
}

// ListSecrets returns the secrets of the namespace of ctx set through the
// API, by name, without values.
func (s *Service) ListSecrets(ctx context.Context) ([]store.Secret, error) {
	ns, err := s.namespace(ctx)
	if err != nil {
		return nil, err
	}
	out, err := s.st.ListSecrets(ctx, ns)
	if err != nil {
		return nil, wrap("list secrets", err)
	}
	return out, nil
}

// DeleteSecret deletes a secret of the namespace of ctx set through the
// API. Unknown (or of another namespace): a
// *NotFoundError for "name".
func (s *Service) DeleteSecret(ctx context.Context, name string) error {
	if err := store.CheckSecretName(name); err != nil {
		return invalid("name", "secret name %q: 1 to %d characters of A-Z, a-z, 0-9, '_', '.', '-'", name, store.MaxSecretNameLen)
	}
	ns, err := s.namespace(ctx)
	if err != nil {
		return err
	}
	err = s.st.DeleteSecret(ctx, ns, name)
	if errors.Is(err, store.ErrNotFound) {
		return &NotFoundError{Resource: ResourceSecret, Field: "name", Message: fmt.Sprintf("no secret %q was set through the API", name)}
	}
	if err != nil {
		return wrap("delete secret", err)
	}
	return nil
}

// EventCalls returns the journal of event id of session x: its host calls
// by seq, set-aside rows included (docs/DESIGN.md invariant 12). Unknown
// event: a *NotFoundError.
func (s *Service) EventCalls(ctx context.Context, x store.Session, id int64) ([]store.HostCall, error) {
	if _, err := s.event(ctx, x, id); err != nil {
		return nil, err
	}
	out, err := s.st.HostCalls(ctx, x.ActorKey, id)
	if err != nil {
		return nil, wrap("event journal", err)
	}
	return out, nil
}

// Capabilities returns agent a's host-call grants as this host's config
// sets them now (secret names only, never values).
func (s *Service) Capabilities(a store.Agent) calls.Capabilities {
	return s.h.Policy().ForAgent(a).Capabilities
}

// checkSecretValue refuses a value that cannot fill an HTTP header value
// (RFC 9110 5.5: no control character but tab), naming the offending
// byte's offset and never the value.
func checkSecretValue(value []byte) error {
	if at := InvalidUTF8At(value); at < len(value) {
		return invalid("value", "the secret's value is not UTF-8 (at byte %d)", at)
	}
	for i, c := range value {
		if (c < 0x20 && c != '\t') || c == 0x7f {
			return invalid("value", "the secret's value holds a control character (0x%02x at byte %d): a secret fills HTTP header values, which cannot carry one", c, i)
		}
	}
	return nil
}

// InvalidUTF8At is the offset of b's first byte that does not begin a
// valid UTF-8 sequence, len(b) when b is valid UTF-8: where a front door's
// refusal of text that is not UTF-8 points, without quoting it.
func InvalidUTF8At(b []byte) int {
	if utf8.Valid(b) {
		return len(b) // every API body: the fast check first
	}
	at := 0
	for at < len(b) {
		r, n := utf8.DecodeRune(b[at:])
		if r == utf8.RuneError && n <= 1 {
			return at
		}
		at += n
	}
	return at
}
