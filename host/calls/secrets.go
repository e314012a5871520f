package calls

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// ErrSecretNotFound is returned (wrapped) by Secrets.Resolve for a name
// that is neither declared in the config nor set through the API. A
// SealedSource may return it (wrapped) for a name it does not hold.
var ErrSecretNotFound = errors.New("secret not found")

// ErrNoKey: Seal was called on a host without secrets_key (or
// secrets_key_file), so a secret cannot be sealed for the store.
var ErrNoKey = errors.New("no secrets key configured (secrets_key or secrets_key_file)")

// maxSecretBytes bounds a secret read from a file or the store.
const maxSecretBytes = 64 << 10

// SecretSource is where a config-declared secret's value comes from:
// exactly one of Env (a host environment variable) and File (a file read
// at each use, one trailing newline removed).
type SecretSource struct {
	Env  string
	File string
}

// SealedSource gives the sealed value (Secrets.Seal's output) of a secret
// set through the API. store.Store satisfies it. For a name it does not
// hold it returns an error for which errors.Is(err, ErrSecretNotFound) or
// SecretsConfig.NotFound (e.g. errors.Is(err, store.ErrNotFound)) holds,
// or a nil slice with a nil error.
type SealedSource interface {
	// SealedSecret returns the sealed value of the secret name of
	// namespace ns.
	SealedSecret(ctx context.Context, ns, name string) ([]byte, error)
}

// defaultNamespace is store.DefaultNamespace (this package does not
// import the store).
const defaultNamespace = "default"

// Qualified is how a secret of namespace ns is named where secrets of
// every namespace share one space (store.QualifiedName): the config's
// secrets: keys and the additional data a value is sealed with. A secret
// of the default namespace keeps its plain name, so values sealed before
// namespaces still open; one of namespace "team-a" is "team-a/NAME"
// (names hold no '/').
func Qualified(ns, name string) string {
	if ns == "" || ns == defaultNamespace {
		return name
	}
	return ns + "/" + name
}

// Secrets resolves secret names of a namespace to values (docs/DESIGN.md
// "Namespaces": an agent's placeholders resolve in its own namespace,
// never another's). Config-declared secrets
// (SecretSource) win over API-set ones of the same name: the operator's
// file is the source of truth, and an API caller cannot shadow a secret
// the operator declared. API-set secrets are sealed with AES-256-GCM under
// the host's secrets key, the name bound as additional data (a sealed
// value copied to another name does not open).
//
// Secrets never logs a value and no error it returns holds one.
type Secrets struct {
	declared map[string]SecretSource
	aead     cipher.AEAD // nil without a key
	sealed   SealedSource
	getenv   func(string) (string, bool)
	// notFound recognises the store's not-found error.
	notFound func(error) bool
}

// SecretsConfig configures NewSecrets.
type SecretsConfig struct {
	// Declared are the config's secrets (secrets: in the config file), by
	// qualified name (Qualified: "NAME" in the default namespace,
	// "team-a/NAME" in namespace team-a).
	Declared map[string]SecretSource
	// Key is the 32-byte AES-256 key sealing API-set secrets; nil means
	// API-set secrets cannot be sealed or opened.
	Key []byte
	// Sealed gives API-set secrets; nil means there are none.
	Sealed SealedSource
	// NotFound, when set, recognises the SealedSource's not-found error
	// (e.g. errors.Is(err, store.ErrNotFound)).
	NotFound func(error) bool
	// LookupEnv reads the environment; nil means os.LookupEnv.
	LookupEnv func(string) (string, bool)
}

// NewSecrets returns a resolver. The key, when given, must be 32 bytes.
func NewSecrets(cfg SecretsConfig) (*Secrets, error) {
	s := &Secrets{declared: cfg.Declared, sealed: cfg.Sealed, getenv: cfg.LookupEnv, notFound: cfg.NotFound}
	if s.getenv == nil {
		s.getenv = os.LookupEnv
	}
	for name, src := range cfg.Declared {
		if (src.Env == "") == (src.File == "") {
			return nil, fmt.Errorf("secret %q: give exactly one of env and file", name)
		}
	}
	if cfg.Key != nil {
		if len(cfg.Key) != 32 {
			return nil, fmt.Errorf("secrets key: %d bytes, want 32 (AES-256)", len(cfg.Key))
		}
		block, err := aes.NewCipher(cfg.Key)
		if err != nil {
			return nil, fmt.Errorf("secrets key: %w", err)
		}
		s.aead, err = cipher.NewGCM(block)
		if err != nil {
			return nil, fmt.Errorf("secrets key: %w", err)
		}
	}
	return s, nil
}

// sealVersion is the first byte of a sealed value: version 1 is
// AES-256-GCM, then the 12-byte nonce, then the ciphertext and tag.
const sealVersion = 1

func additionalData(name string) []byte { return []byte("paddock-secret-v1\x00" + name) }

// Seal encrypts value for storage under name (AES-256-GCM, random nonce,
// the name as additional data). It fails without a secrets key.
func (s *Secrets) Seal(name string, value []byte) ([]byte, error) {
	if s.aead == nil {
		return nil, fmt.Errorf("seal secret: %w", ErrNoKey)
	}
	nonce := make([]byte, s.aead.NonceSize())
	if _, err := io.ReadFull(rand.Reader, nonce); err != nil {
		return nil, fmt.Errorf("seal secret %q: nonce: %w", name, err)
	}
	out := append([]byte{sealVersion}, nonce...)
	return s.aead.Seal(out, nonce, value, additionalData(name)), nil
}

// Open decrypts a value Seal made for the same name. A value sealed under
// another name or key, or altered, is an error (which holds no part of
// the value).
func (s *Secrets) Open(name string, sealed []byte) ([]byte, error) {
	if s.aead == nil {
		return nil, errors.New("open secret: no secrets key configured (secrets_key or secrets_key_file)")
	}
	ns := s.aead.NonceSize()
	if len(sealed) < 1+ns+s.aead.Overhead() || sealed[0] != sealVersion {
		return nil, fmt.Errorf("open secret %q: not a sealed value of version %d", name, sealVersion)
	}
	v, err := s.aead.Open(nil, sealed[1:1+ns], sealed[1+ns:], additionalData(name))
	if err != nil {
		return nil, fmt.Errorf("open secret %q: wrong key, wrong name or altered (%w)", name, err)
	}
	return v, nil
}

// Declared reports whether the secret of qualified name (Qualified) is
// declared in the config.
func (s *Secrets) Declared(name string) bool {
	_, ok := s.declared[name]
	return ok
}

// Resolve returns the value of the named secret of the default namespace
// (ResolveIn).
func (s *Secrets) Resolve(ctx context.Context, name string) (string, error) {
	return s.ResolveIn(ctx, defaultNamespace, name)
}

// ResolveIn returns the value of the secret name of namespace ns: a
// config-declared one (env read now, file read now and trimmed of one
// trailing newline) or, failing that, an API-set one of ns opened with the
// secrets key. An unknown name is ErrSecretNotFound (wrapped); a declared
// secret whose variable is unset or whose file cannot be read is an error
// too. A secret of another namespace is never read.
func (s *Secrets) ResolveIn(ctx context.Context, ns, name string) (string, error) {
	if s == nil {
		return "", fmt.Errorf("secret %q: %w (no secrets configured)", name, ErrSecretNotFound)
	}
	// Names hold no '/': "b/X" asked in namespace a must not find b's X.
	if strings.Contains(name, "/") {
		return "", fmt.Errorf("secret %q: %w", name, ErrSecretNotFound)
	}
	if ns == "" {
		ns = defaultNamespace
	}
	q := Qualified(ns, name)
	if src, ok := s.declared[q]; ok {
		if src.Env != "" {
			v, ok := s.getenv(src.Env)
			if !ok {
				return "", fmt.Errorf("secret %q: environment variable %s is not set", name, src.Env)
			}
			return v, nil
		}
		b, err := readSecretFile(src.File)
		if err != nil {
			return "", fmt.Errorf("secret %q: file: %w", name, err)
		}
		return strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r"), nil
	}
	if s.sealed == nil {
		return "", fmt.Errorf("secret %q: %w", name, ErrSecretNotFound)
	}
	sealed, err := s.sealed.SealedSecret(ctx, ns, name)
	if err != nil {
		if errors.Is(err, ErrSecretNotFound) || (s.notFound != nil && s.notFound(err)) {
			return "", fmt.Errorf("secret %q: %w", name, ErrSecretNotFound)
		}
		return "", fmt.Errorf("secret %q: read sealed value: %w", name, err)
	}
	if sealed == nil {
		return "", fmt.Errorf("secret %q: %w", name, ErrSecretNotFound)
	}
	v, err := s.Open(q, sealed)
	if err != nil {
		return "", err
	}
	return string(v), nil
}

// readSecretFile reads a regular file of at most maxSecretBytes. The
// error names the path, never the content.
func readSecretFile(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSecretBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(b) > maxSecretBytes {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, maxSecretBytes)
	}
	return b, nil
}
