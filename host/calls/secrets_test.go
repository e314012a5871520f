package calls

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/abi"
)

// sealedTable is a SealedSource over a map (the store's role in tests).
type sealedTable map[string][]byte

var errTableNotFound = errors.New("table: not found")

func (s sealedTable) SealedSecret(_ context.Context, _, name string) ([]byte, error) {
	v, ok := s[name]
	if !ok {
		return nil, fmt.Errorf("secret %s: %w", name, errTableNotFound)
	}
	return v, nil
}

func TestSecretsSealOpenAndPrecedence(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	dir := t.TempDir()
	file := filepath.Join(dir, "gh")
	if err := os.WriteFile(file, []byte("file-value\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	table := sealedTable{}
	s, err := NewSecrets(SecretsConfig{
		Declared:  map[string]SecretSource{"shared": {Env: "SHARED"}, "gh": {File: file}, "gone": {File: filepath.Join(dir, "none")}},
		Key:       key,
		Sealed:    table,
		NotFound:  func(err error) bool { return errors.Is(err, errTableNotFound) },
		LookupEnv: env{"SHARED": "from-config"}.lookup,
	})
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := s.Seal("api", []byte("api-value"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, []byte("api-value")) {
		t.Fatal("sealed value holds the plaintext")
	}
	if v, err := s.Open("api", sealed); err != nil || string(v) != "api-value" {
		t.Fatalf("Open = %q, %v", v, err)
	}
	if _, err := s.Open("other", sealed); err == nil {
		t.Error("a value sealed for one name opened under another")
	}
	tampered := bytes.Clone(sealed)
	tampered[len(tampered)-1] ^= 1
	if _, err := s.Open("api", tampered); err == nil || strings.Contains(err.Error(), "api-value") {
		t.Errorf("tampered: %v", err)
	}
	other, _ := NewSecrets(SecretsConfig{Key: bytes.Repeat([]byte{8}, 32)})
	if _, err := other.Open("api", sealed); err == nil {
		t.Error("opened with another key")
	}
	if _, err := NewSecrets(SecretsConfig{Key: []byte("short")}); err == nil {
		t.Error("a short key was accepted")
	}
	if _, err := NewSecrets(SecretsConfig{Declared: map[string]SecretSource{"x": {Env: "A", File: "/b"}}}); err == nil {
		t.Error("env and file together were accepted")
	}

	table["api"] = sealed
	sharedSealed, _ := s.Seal("shared", []byte("from-api"))
	table["shared"] = sharedSealed
	ctx := context.Background()
	for name, want := range map[string]string{"api": "api-value", "shared": "from-config", "gh": "file-value"} {
		if v, err := s.Resolve(ctx, name); err != nil || v != want {
			t.Errorf("Resolve(%s) = %q, %v; want %q", name, v, err, want)
		}
	}
	if _, err := s.Resolve(ctx, "missing"); !errors.Is(err, ErrSecretNotFound) {
		t.Errorf("missing: %v", err)
	}
	if _, err := s.Resolve(ctx, "gone"); err == nil || errors.Is(err, ErrSecretNotFound) {
		t.Errorf("declared, file missing: %v", err)
	}
	// The file is read at each use.
	if err := os.WriteFile(file, []byte("rotated\n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if v, _ := s.Resolve(ctx, "gh"); v != "rotated\n" {
		t.Errorf("after rotation: %q (one trailing newline trimmed)", v)
	}
	noKey, _ := NewSecrets(SecretsConfig{})
	if _, err := noKey.Seal("a", []byte("b")); err == nil {
		t.Error("sealed without a key")
	}
	var nilSecrets *Secrets
	if _, err := nilSecrets.Resolve(ctx, "a"); !errors.Is(err, ErrSecretNotFound) {
		t.Errorf("nil resolver: %v", err)
	}
}

// An API-set secret fills a header like a declared one.
func TestSealedSecretFillsHeader(t *testing.T) {
	d := newDest(t)
	key := bytes.Repeat([]byte{1}, 32)
	table := sealedTable{}
	s, err := NewSecrets(SecretsConfig{Key: key, Sealed: table, NotFound: func(err error) bool { return errors.Is(err, errTableNotFound) }})
	if err != nil {
		t.Fatal(err)
	}
	table["hook"], _ = s.Seal("hook", []byte("sealed-hook-value"))
	x, logs := testExec(t, Config{Secrets: s}, env{})
	caps := Capabilities{HTTP: []HTTPRule{loopbackRule(t, d)}, Secrets: []string{"hook", "nope"}}
	out := x.Do(context.Background(), "a", caps, httpReq("GET", d.URL+"/echo", map[string]string{"X-Api-Key": "{{secret:hook}}"}), CallOptions{})
	wantOK(t, out)
	if got := d.requests()[0].Header.Get("X-Api-Key"); got != "sealed-hook-value" {
		t.Errorf("header = %q", got)
	}
	wantErr(t, x.Do(context.Background(), "a", caps, httpReq("GET", d.URL+"/echo", map[string]string{"X-Api-Key": "{{secret:nope}}"}), CallOptions{}), abi.CallNotConfigured, "")
	if strings.Contains(logs.String(), "sealed-hook-value") || strings.Contains(string(out.Result.HTTP.Body), "sealed-hook-value") {
		t.Error("the sealed secret leaked")
	}
}

// "localhost" through the system resolver is loopback.
func TestLocalhostThroughSystemResolver(t *testing.T) {
	d := newDest(t)
	port := serverPort(t, d.URL)
	x, _ := testExec(t, Config{}, env{})
	u := fmt.Sprintf("http://localhost:%d/ok", port)
	wantErr(t, x.Do(context.Background(), "a", Capabilities{HTTP: []HTTPRule{{Scheme: "http", Host: "localhost", Port: port}}}, httpReq("GET", u, nil), CallOptions{}), abi.CallDenied, ReasonPrivateAddress)
	wantOK(t, x.Do(context.Background(), "a", Capabilities{HTTP: []HTTPRule{{Scheme: "http", Host: "localhost", Port: port, AllowPrivate: true}}}, httpReq("GET", u, nil), CallOptions{}))
}
