package main

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/host/calls"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/sqlite"
)

// TestStartWarnsOfSecretsAnotherKeySealed: a host started with another
// secrets_key than the one that sealed the API-set secrets says so at
// start, naming them (never a value), instead of failing at the first
// call; with the right key it says nothing.
func TestStartWarnsOfSecretsAnotherKeySealed(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "paddock.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	keyA, keyB := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	a, err := calls.NewSecrets(calls.SecretsConfig{Key: keyA})
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := a.Seal("api_key", []byte("sk-PLANTED-check"))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.PutSecret(ctx, store.DefaultNamespace, "api_key", sealed); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		key  []byte
		warn bool
	}{{"the sealing key", keyA, false}, {"another key", keyB, true}, {"no key", nil, true}} {
		t.Run(c.name, func(t *testing.T) {
			s, err := calls.NewSecrets(calls.SecretsConfig{Key: c.key, Sealed: st})
			if err != nil {
				t.Fatal(err)
			}
			var logs bytes.Buffer
			checkSealedSecrets(ctx, st, s, c.key != nil, slog.New(slog.NewTextHandler(&logs, nil)))
			if got := strings.Contains(logs.String(), "level=WARN"); got != c.warn {
				t.Errorf("warned = %v, want %v: %s", got, c.warn, logs.String())
			}
			if strings.Contains(logs.String(), "PLANTED") {
				t.Errorf("the log shows the value: %s", logs.String())
			}
			if c.key != nil && c.warn && !strings.Contains(logs.String(), "api_key") {
				t.Errorf("the warning does not name the secret: %s", logs.String())
			}
		})
	}
}
