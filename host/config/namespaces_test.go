package config

import (
	"strings"
	"testing"
)

// TestNamespacesAndTheirSpellings: namespaces: declares namespaces with
// quotas; agents, plugins and secrets of a declared namespace are spelled
// "namespace/name", an agent's plugin is of its namespace; an undeclared
// namespace, a malformed name, a negative quota or an unknown key is
// refused naming the key.
func TestNamespacesAndTheirSpellings(t *testing.T) {
	cfg, err := Load(Sources{File: writeFile(t, `
namespaces:
  team-a:
    quotas: {live_sessions: 10, signals_per_minute: 60, model_tokens_per_day: 1000}
  team-b: {}
plugins:
  - {name: team-a/tool, path: /bin/true, sha256: "`+strings.Repeat("0", 64)+`"}
agents:
  - name: chat
  - name: team-a/chat
    plugin: tool
secrets:
  TOKEN: {env: X}
  team-a/TOKEN: {env: Y}
`)})
	if err != nil {
		t.Fatal(err)
	}
	if q := cfg.Namespaces["team-a"].Quotas; q.LiveSessions != 10 || q.SignalsPerMinute != 60 || q.ModelTokensPerDay != 1000 {
		t.Fatalf("team-a quotas = %+v", q)
	}
	if !cfg.HasNamespace("default") || !cfg.HasNamespace("team-b") || cfg.HasNamespace("team-c") {
		t.Fatal("HasNamespace: default and the declared ones exist, nothing else")
	}
	if _, ok := cfg.SecretSources()["team-a/TOKEN"]; !ok {
		t.Fatal("team-a/TOKEN is not among the secret sources")
	}

	for _, c := range []struct{ file, key string }{
		{"agents:\n  - name: team-x/chat\n", "agents[0].name"},
		{"agents:\n  - name: a/b/c\n", "agents[0].name"},
		{"namespaces:\n  Team: {}\n", "namespaces.Team"},
		{"namespaces:\n  t: {quotas: {live_sessions: -1}}\n", "namespaces.t.quotas.live_sessions"},
		{"namespaces:\n  t: {quotas: {live_session: 1}}\n", "live_session"},
		{"secrets:\n  team-x/K: {env: X}\n", "secrets.team-x/K"},
		{"agents:\n  - name: default/notes\n", `write "notes"`},
		{"secrets:\n  default/K: {env: X}\n", `write "K"`},
		{"namespaces:\n  t: {}\nplugins:\n  - {name: tool, path: /bin/true, sha256: \"" + strings.Repeat("0", 64) + "\"}\nagents:\n  - {name: t/chat, plugin: tool}\n", "agents[0].plugin"},
	} {
		_, err := Load(Sources{File: writeFile(t, c.file)})
		if err == nil || !strings.Contains(err.Error(), c.key) {
			t.Errorf("%q: err = %v, want one naming %s", c.file, err, c.key)
		}
	}
}
