package config

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/host/calls"
)

const hostCallsYAML = `
models:
  openai-main:
    provider: openai
    base_url: https://api.openai.com/v1
    models: [gpt-4o-mini, gpt-4o]
    secret: openai_key
    max_tokens: 512
    timeout: 30s
  local:
    provider: anthropic
    base_url: http://127.0.0.1:9999
    models: [claude-x]
secrets:
  openai_key:
    env: OPENAI_API_KEY
  github_token:
    file: /run/secrets/github
host_calls:
  timeout: 20s
  max_response_bytes: 1048576
capabilities:
  models: [local]
agents:
  - name: researcher
    capabilities:
      http:
        - scheme: https
          host: "*.github.com"
          methods: [GET, POST]
          secrets: [github_token]
        - scheme: http
          host: 127.0.0.1
          port: 8081
        - scheme: https
          host: internal.example
          allow_private: true
      models: [openai-main]
      secrets: [github_token]
      limits:
        calls_per_turn: 10
        response_bytes_per_turn: 100000
        tokens_per_turn: 5000
        tokens_per_day: 100000
  - name: plain
`

func TestHostCallKeysLoadAndConvert(t *testing.T) {
	key := base64.StdEncoding.EncodeToString(make([]byte, 32))
	cfg, err := Load(Sources{File: writeFile(t, hostCallsYAML+"secrets_key: "+key+"\n")})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.HostCalls.Timeout != 20*time.Second || cfg.HostCalls.MaxResponseBytes != 1<<20 {
		t.Errorf("host_calls = %+v", cfg.HostCalls)
	}
	eps := cfg.ModelEndpoints()
	if ep := eps["openai-main"]; ep.Provider != "openai" || ep.Secret != "openai_key" || ep.MaxTokens != 512 || ep.Timeout != 30*time.Second || len(ep.Models) != 2 {
		t.Errorf("endpoint = %+v", ep)
	}
	if s := cfg.SecretSources(); s["openai_key"].Env != "OPENAI_API_KEY" || s["github_token"].File != "/run/secrets/github" {
		t.Errorf("secrets = %+v", s)
	}
	if k, err := cfg.SecretsKeyBytes(); err != nil || len(k) != 32 {
		t.Errorf("key = %d bytes, %v", len(k), err)
	}
	r := cfg.AgentCapabilities("researcher")
	if len(r.HTTP) != 3 || r.HTTP[0].Host != "*.github.com" || len(r.HTTP[0].Secrets) != 1 || r.HTTP[1].Port != 8081 || !r.HTTP[2].AllowPrivate ||
		r.Models[0] != "openai-main" || r.Secrets[0] != "github_token" ||
		r.Limits != (calls.Limits{CallsPerTurn: 10, ResponseBytesPerTurn: 100000, TokensPerTurn: 5000, TokensPerDay: 100000}) {
		t.Errorf("researcher = %+v", r)
	}
	if err := r.CheckHTTP("POST", "https://api.github.com/x"); err != nil {
		t.Errorf("converted rule does not allow its destination: %v", err)
	}
	// An agent without capabilities: the default block.
	if p := cfg.AgentCapabilities("plain"); len(p.HTTP) != 0 || len(p.Models) != 1 || p.Models[0] != "local" {
		t.Errorf("plain = %+v", p)
	}
	// Nothing configured: deny all.
	def, err := Load(Sources{})
	if err != nil {
		t.Fatal(err)
	}
	z := def.AgentCapabilities("any")
	if err := z.CheckHTTP("GET", "https://example.com/"); err == nil || z.CheckEndpoint("x") == nil || z.CheckSecret("x") == nil {
		t.Error("default capabilities allow something")
	}
	if def.HostCalls.Timeout != calls.DefaultTimeout || def.HostCalls.MaxResponseBytes != calls.DefaultMaxResponseBytes {
		t.Errorf("default host_calls = %+v", def.HostCalls)
	}
}

func TestHostCallKeysAreStrict(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(keyFile, []byte("c2hvcnQ=\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct{ name, yaml, want string }{
		{"unknown provider", "models:\n  m:\n    provider: gemini\n    base_url: https://x\n    models: [a]\n", "models.m.provider"},
		{"bad base url", "models:\n  m:\n    provider: openai\n    base_url: ftp://x\n    models: [a]\n", "models.m.base_url"},
		{"no models", "models:\n  m:\n    provider: openai\n    base_url: https://x\n", "models.m.models"},
		{"comma in a model name", "models:\n  m:\n    provider: openai\n    base_url: https://x\n    models: [\"a,b\"]\n", "models.m.models[0]"},
		{"unknown key in endpoint", "models:\n  m:\n    provider: openai\n    base_url: https://x\n    models: [a]\n    api_key: x\n", "api_key"},
		{"env and file", "secrets:\n  s:\n    env: A\n    file: /b\n", "secrets.s"},
		{"neither env nor file", "secrets:\n  s: {}\n", "secrets.s"},
		{"both keys", "secrets_key: AAAA\nsecrets_key_file: /k\n", "secrets_key"},
		{"short key", "secrets_key: c2hvcnQ=\n", "secrets_key"},
		{"short key file", "secrets_key_file: " + keyFile + "\n", "secrets_key_file"},
		{"timeout", "host_calls:\n  timeout: 0s\n", "host_calls.timeout"},
		{"max bytes", "host_calls:\n  max_response_bytes: 10\n", "host_calls.max_response_bytes"},
		{"max bytes over the result cap", "host_calls:\n  max_response_bytes: 8388608\n", "host_calls.max_response_bytes"},
		{"unknown host_calls key", "host_calls:\n  retries: 3\n", "host_calls.retries"},
		{"unknown endpoint", "capabilities:\n  models: [nope]\n", "capabilities.models[0]"},
		{"bad scheme", "capabilities:\n  http:\n    - scheme: ftp\n      host: a.com\n", "capabilities.http[0]"},
		{"bad wildcard", "capabilities:\n  http:\n    - scheme: https\n      host: a.*.com\n", "capabilities.http[0]"},
		{"private wildcard", "capabilities:\n  http:\n    - scheme: https\n      host: '*.a.com'\n      allow_private: true\n", "capabilities.http[0]"},
		{"bad method", "capabilities:\n  http:\n    - scheme: https\n      host: a.com\n      methods: [get]\n", "capabilities.http[0]"},
		{"bad port", "capabilities:\n  http:\n    - scheme: https\n      host: a.com\n      port: 70000\n", "capabilities.http[0]"},
		{"unknown rule key", "capabilities:\n  http:\n    - scheme: https\n      host: a.com\n      path: /x\n", "path"},
		{"negative limit", "capabilities:\n  limits:\n    calls_per_turn: -1\n", "capabilities.limits"},
		{"bad secret name", "capabilities:\n  secrets: ['a b']\n", "capabilities.secrets[0]"},
		{"rule secret not granted", "capabilities:\n  secrets: [a]\n  http:\n    - scheme: https\n      host: a.com\n      secrets: [b]\n", "capabilities.http[0].secrets[0]"},
		{"agent unknown endpoint", "agents:\n  - name: a\n    capabilities:\n      models: [nope]\n", "agents[0].capabilities.models[0]"},
		{"agent unknown capability key", "agents:\n  - name: a\n    capabilities:\n      tools: [x]\n", "tools"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Load(Sources{File: writeFile(t, c.yaml)})
			if err == nil {
				t.Fatalf("accepted:\n%s", c.yaml)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error does not name %q: %v", c.want, err)
			}
		})
	}
}

func TestHostCallRestartOnlyKeys(t *testing.T) {
	a, err := Load(Sources{File: writeFile(t, hostCallsYAML)})
	if err != nil {
		t.Fatal(err)
	}
	b := a
	b.HostCalls.Timeout = time.Second
	b.Capabilities = Capabilities{}
	got := a.RestartOnlyChanges(b)
	if len(got) != 1 || got[0] != "host_calls" {
		t.Errorf("restart-only changes = %v, want [host_calls] (capabilities reload)", got)
	}
}

func TestOwnAPIAddrs(t *testing.T) {
	for listen, want := range map[string]string{
		"127.0.0.1:8080": "[127.0.0.1:8080]",
		"localhost:9000": "[127.0.0.1:9000 [::1]:9000]",
		":7000":          "[0.0.0.0:7000]",
		"[::1]:80":       "[[::1]:80]",
	} {
		c := Config{Listen: listen}
		if got := fmt.Sprint(c.OwnAPIAddrs()); got != want {
			t.Errorf("%s: %s, want %s", listen, got, want)
		}
	}
}

func TestApprovalRulesLoadIntoCapabilitiesAndBadOnesNameTheKey(t *testing.T) {
	cfg, err := Load(Sources{File: writeFile(t, `
models:
  main:
    provider: openai
    base_url: https://api.openai.com/v1
    models: [m]
agents:
  - name: payer
    capabilities:
      http:
        - scheme: https
          host: pay.example.com
          methods: [GET, POST]
      models: [main]
      approval:
        http:
          - host: pay.example.com
            methods: [POST]
            path_prefix: /v1/charges
        models: [main]
        timeout: 1h
`)})
	if err != nil {
		t.Fatal(err)
	}
	a := cfg.AgentCapabilities("payer").Approval
	if len(a.HTTP) != 1 || a.HTTP[0].Host != "pay.example.com" || a.HTTP[0].PathPrefix != "/v1/charges" ||
		strings.Join(a.HTTP[0].Methods, ",") != "POST" || strings.Join(a.Models, ",") != "main" || a.Timeout != time.Hour {
		t.Errorf("approval rules = %+v", a)
	}
	for body, key := range map[string]string{
		"capabilities:\n  approval:\n    http:\n      - host: \"\"\n":                         "capabilities.approval.http[0]",
		"capabilities:\n  approval:\n    http:\n      - host: a.b\n        methods: [post]\n": "capabilities.approval.http[0]",
		"capabilities:\n  approval:\n    http:\n      - host: a.b\n        path_prefix: v1\n": "capabilities.approval.http[0]",
		"capabilities:\n  approval:\n    models: [nope]\n":                                    "capabilities.approval.models[0]",
		"capabilities:\n  approval:\n    timeout: -1s\n":                                      "capabilities.approval.timeout",
		"capabilities:\n  approval:\n    hosts: []\n":                                         "capabilities.approval.hosts",
	} {
		_, err := Load(Sources{File: writeFile(t, body)})
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("%q: error %v, want one naming %s", body, err, key)
		}
	}
}
