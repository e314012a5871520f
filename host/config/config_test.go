package config

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "paddock.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDefaultsAreValid(t *testing.T) {
	cfg, err := Load(Sources{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "127.0.0.1:8080" || cfg.Store.Driver != "sqlite" || cfg.Policy.BackoffMin != 5*time.Second || cfg.Policy.BackoffMax != 120*time.Second || cfg.Pools["default"].Capacity < 1 ||
		cfg.Runtime.PromoteAfter != 50*time.Millisecond {
		t.Errorf("unexpected defaults: %+v", cfg)
	}
}

func TestLayersApplyInOrderDefaultsFileEnvFlags(t *testing.T) {
	file := writeFile(t, `
listen: 127.0.0.1:9000
data_dir: /tmp/from-file
store:
  driver: postgres
  dsn: postgres://file
policy:
  idle_timeout: 45s
pools:
  gpu:
    capacity: 2
agents:
  - name: notes
    module_file: notes.wasm
    policy:
      max_attempts: 2
      pool: gpu
  - name: api-registered
    policy:
      dead_letter: block
`)
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	fs.String("data-dir", "", "")
	fs.String("listen", "", "")
	if err := fs.Parse([]string{"--data-dir", "/tmp/from-flag"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(Sources{
		File:     file,
		Environ:  []string{"PADDOCK_STORE__DSN=postgres://env", "PADDOCK_DATA_DIR=/tmp/from-env", "PADDOCK_POLICY__MAX_ATTEMPTS=7", "HOME=/root", "PADDOCK_SERVER=http://elsewhere", "PADDOCK_TOKEN=t", "PADDOCK_NAMESPACE=team-a"},
		Flags:    fs,
		FlagKeys: map[string]string{"data-dir": "data_dir", "listen": "listen"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "127.0.0.1:9000" {
		t.Errorf("listen = %q: an unset flag must not override the file", cfg.Listen)
	}
	if cfg.Store.DSN != "postgres://env" || cfg.Policy.MaxAttempts != 7 {
		t.Errorf("env did not override the file: dsn %q attempts %d", cfg.Store.DSN, cfg.Policy.MaxAttempts)
	}
	if cfg.DataDir != "/tmp/from-flag" {
		t.Errorf("data_dir = %q, want the flag's value", cfg.DataDir)
	}
	if cfg.Policy.IdleTimeout != 45*time.Second || cfg.Runtime.LeaseTTL != 8*time.Second {
		t.Errorf("policy %+v runtime %+v: file value or default lost", cfg.Policy, cfg.Runtime)
	}
	if cfg.Pools["gpu"].Capacity != 2 || cfg.Pools["default"].Capacity != 64 {
		t.Errorf("pools = %+v: the file's pool or the default pool is missing", cfg.Pools)
	}
	notes := cfg.AgentPolicy("notes")
	if notes.MaxAttempts != 2 || notes.Pool != "gpu" || notes.IdleTimeout != 45*time.Second || notes.BackoffMax != 120*time.Second {
		t.Errorf("notes policy = %+v: override not merged over the defaults", notes)
	}
	if p := cfg.AgentPolicy("api-registered"); p.DeadLetter != "block" || p.MaxAttempts != 7 {
		t.Errorf("api-registered policy = %+v", p)
	}
	if p := cfg.AgentPolicy("other"); p != cfg.Policy {
		t.Errorf("an agent without override gets %+v, want the default", p)
	}
}

func TestBadConfigIsRefusedNamingKeyValueAndReason(t *testing.T) {
	cases := []struct {
		name, file string
		environ    []string
		want       []string
	}{
		{"unknown key", "lisen: 127.0.0.1:1\n", nil, []string{"lisen", "unknown key"}},
		{"unknown nested key", "policy:\n  idle_timout: 3s\n", nil, []string{"policy.idle_timout", "unknown key"}},
		{"unknown key in a list entry", "agents:\n  - name: a\n    module_file: a.wasm\n    modul: x\n", nil, []string{"modul"}},
		{"unknown key in a pool", "pools:\n  default:\n    capacty: 3\n", nil, []string{"capacty"}},
		{"bad duration", "runtime:\n  lease_ttl: soon\n", nil, []string{"lease_ttl", "soon"}},
		{"negative promote_after", "runtime:\n  promote_after: -1ms\n", nil, []string{"runtime.promote_after", "-1ms", "between 0 (off) and 10s"}},
		{"promote_after past the lease", "runtime:\n  lease_ttl: 2s\n  promote_after: 3s\n", nil, []string{"runtime.promote_after", "3s", "less than runtime.lease_ttl"}},
		{"bad driver", "store:\n  driver: mysql\n", nil, []string{"store.driver", "mysql", "sqlite or postgres"}},
		{"postgres without dsn", "store:\n  driver: postgres\n", nil, []string{"store.dsn", "required"}},
		{"backoff bounds reversed", "policy:\n  backoff_min: 10s\n  backoff_max: 1s\n", nil, []string{"policy.backoff_max", "1s"}},
		{"crash policy", "policy:\n  crash_policy: reboot\n", nil, []string{"policy.crash_policy", "reboot"}},
		{"agent override", "agents:\n  - name: a\n    policy:\n      dead_letter: maybe\n", nil, []string{"agents[0].policy.dead_letter", "maybe"}},
		{"unknown pool", "policy:\n  pool: gpu\n", nil, []string{"policy.pool", "gpu", "not a configured pool"}},
		{"agent transcript tail", "agents:\n  - name: a\n    policy:\n      transcript_tail: -1\n", nil, []string{"agents[0].policy.transcript_tail", "-1", "between 0 and 1000"}},
		{"mid_turn", "policy:\n  mid_turn: later\n", nil, []string{"policy.mid_turn", "later", "queue, steer, interrupt or reject"}},
		{"agent mid_turn", "agents:\n  - name: a\n    policy:\n      mid_turn: drop\n", nil, []string{"agents[0].policy.mid_turn", "drop"}},
		{"zero capacity", "pools:\n  default:\n    capacity: 0\n", nil, []string{"pools.default.capacity", "0"}},
		{"remote pool without fabric", "pools:\n  gpu:\n    capacity: 2\n    remote: true\n", nil, []string{"fabric.listen", "remote"}},
		{"fabric without workers", "fabric:\n  listen: tcp://127.0.0.1:7700\n", nil, []string{"fabric.workers"}},
		{"bad worker key", "fabric:\n  listen: tcp://127.0.0.1:7700\n  workers:\n    - id: w1\n      key: c2hvcnQ=\n", nil, []string{"fabric.workers[0].key", "32 bytes"}},
		{"heartbeat timeout too short", "fabric:\n  heartbeat_interval: 2s\n  heartbeat_timeout: 3s\n", nil, []string{"fabric.heartbeat_timeout", "twice"}},
		{"public listen without token", "listen: 0.0.0.0:8080\n", nil, []string{"auth_token", "required"}},
		{"bad env value", "", []string{"PADDOCK_POLICY__MAX_ATTEMPTS=lots"}, []string{"max_attempts", "lots"}},
		// Found in review: YAML numbers were turned into other values.
		{"duration without a unit", "policy:\n  turn_timeout: 30\n", nil, []string{"policy.turn_timeout", "30 is a bare number", "needs its unit"}},
		{"agent duration without a unit", "agents:\n  - name: a\n    policy:\n      backoff_min: 5\n", nil, []string{"agents[0].policy.backoff_min", "bare number"}},
		{"integer with a fraction", "policy:\n  max_attempts: 2.5\n", nil, []string{"policy.max_attempts", "2.5 is not a whole number"}},
		{"integer out of its range", "wasm:\n  memory_limit_pages: 4294968320\n", nil, []string{"wasm.memory_limit_pages", "out of range"}},
		{"negative for an unsigned", "wasm:\n  memory_limit_pages: -1\n", nil, []string{"wasm.memory_limit_pages", "-1 is out of range"}},
		{"unknown env key", "", []string{"PADDOCK_NOPE=1"}, []string{"nope", "unknown key"}},
		{"a section left empty", "policy:\nlisten: 127.0.0.1:1\n", nil, []string{"policy = null", "a section with no keys"}},
		{"a map entry's value of the wrong type", "pools:\n  default:\n    capacity: abc\n", nil, []string{"pools[default].capacity = abc"}},
		{"auth_token with a newline", "", []string{"PADDOCK_AUTH_TOKEN=abc\ndef"}, []string{"auth_token", "control character"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := Sources{Environ: c.environ}
			if c.file != "" {
				src.File = writeFile(t, c.file)
			}
			_, err := Load(src)
			if err == nil {
				t.Fatal("config accepted")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestMissingConfigFileIsAnError(t *testing.T) {
	_, err := Load(Sources{File: filepath.Join(t.TempDir(), "nope.yaml")})
	if err == nil || !strings.Contains(err.Error(), "nope.yaml") {
		t.Fatalf("err = %v, want it to name the missing file", err)
	}
}

// TestAgentTranscriptTailOverridesTheRuntimes: an agent's transcript_tail,
// even 0, replaces runtime.transcript_tail for that agent only.
func TestAgentTranscriptTailOverridesTheRuntimes(t *testing.T) {
	cfg, err := Load(Sources{File: writeFile(t, "runtime:\n  transcript_tail: 7\nagents:\n  - name: quiet\n    policy:\n      transcript_tail: 0\n  - name: chatty\n")})
	if err != nil {
		t.Fatal(err)
	}
	if p := cfg.AgentPolicy("quiet"); p.TranscriptTail == nil || *p.TranscriptTail != 0 {
		t.Fatalf("quiet: transcript_tail %v, want 0", p.TranscriptTail)
	}
	if p := cfg.AgentPolicy("chatty"); p.TranscriptTail != nil || cfg.Runtime.TranscriptTail != 7 {
		t.Fatalf("chatty: transcript_tail %v (runtime %d), want unset and the runtime's 7", p.TranscriptTail, cfg.Runtime.TranscriptTail)
	}
}

// TestEveryUnknownKeyIsReported: one load names all of them, not the first.
func TestEveryUnknownKeyIsReported(t *testing.T) {
	_, err := Load(Sources{File: writeFile(t, "lisen: 127.0.0.1:1\npolicy:\n  idle_timout: 3s\nzzz: 1\n"), Environ: []string{"PADDOCK_NOPE=1"}})
	if err == nil {
		t.Fatal("config accepted")
	}
	for _, k := range []string{"lisen", "policy.idle_timout", "zzz", "nope"} {
		if !strings.Contains(err.Error(), "config: "+k+" = ") {
			t.Errorf("error %q does not name unknown key %q", err, k)
		}
	}
	var ke *KeyError
	if !errors.As(err, &ke) || ke.Reason == "" {
		t.Errorf("error %v holds no *KeyError", err)
	}
}

// TestErrorsNeverShowASecret: an unknown key (a secret in the environment
// that only looks like configuration), a short secrets_key, a DSN or auth
// token of the wrong type, and a plugin's env are refused without their
// value in the error (docs/DESIGN.md invariant 13).
func TestErrorsNeverShowASecret(t *testing.T) {
	const planted = "sk-PLANTED-7f3a"
	cases := []struct {
		name string
		src  Sources
	}{
		{"unknown key from the environment", Sources{Environ: []string{"PADDOCK_OPENAI_KEY=" + planted}}},
		{"short secrets_key", Sources{Environ: []string{"PADDOCK_SECRETS_KEY=" + planted}}},
		{"auth_token of the wrong type", Sources{File: writeFile(t, "auth_token: {x: "+planted+"}\n")}},
		{"dsn of the wrong type", Sources{File: writeFile(t, "store:\n  dsn: [\""+planted+"\"]\n")}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Load(c.src)
			if err == nil {
				t.Fatal("Load accepted it")
			}
			if strings.Contains(err.Error(), planted) {
				t.Fatalf("the error shows the value: %v", err)
			}
		})
	}
}

// TestAPolicyOnlyAgentEntryReloadsWithoutARestartWarning: adding or
// removing an agents[] entry that sets only policy or capabilities is not
// a restart-only change; changing a registration (module_file, plugin) is.
func TestAPolicyOnlyAgentEntryReloadsWithoutARestartWarning(t *testing.T) {
	base := Default()
	base.Agents = []AgentSpec{{Name: "notes", ModuleFile: "notes.wasm"}}
	next := base
	next.Agents = append([]AgentSpec{{Name: "mychat", Capabilities: &Capabilities{}}}, base.Agents...)
	if got := base.RestartOnlyChanges(next); len(got) != 0 {
		t.Errorf("a capabilities-only entry added: restart-only changes %v, want none", got)
	}
	if got := next.RestartOnlyChanges(base); len(got) != 0 {
		t.Errorf("a capabilities-only entry removed: restart-only changes %v, want none", got)
	}
	moved := base
	moved.Agents = []AgentSpec{{Name: "notes", ModuleFile: "other.wasm"}}
	if got := base.RestartOnlyChanges(moved); !slices.Contains(got, "agents[].module_file|plugin") {
		t.Errorf("a module_file changed: restart-only changes %v, want agents[].module_file|plugin", got)
	}
}

// TestMidTurnDefaultsToQueueAndAnAgentOverridesIt: policy.mid_turn is queue
// by default, agents[].policy.mid_turn overrides it for that agent only,
// and a change of it reloads (it is not a restart-only key).
func TestMidTurnDefaultsToQueueAndAnAgentOverridesIt(t *testing.T) {
	cfg, err := Load(Sources{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Policy.MidTurn != "queue" {
		t.Fatalf("default mid_turn %q, want queue", cfg.Policy.MidTurn)
	}
	cfg, err = Load(Sources{File: writeFile(t, "policy:\n  mid_turn: steer\nagents:\n  - name: strict\n    policy:\n      mid_turn: reject\n  - name: other\n"),
		Environ: []string{"PADDOCK_POLICY__MID_TURN=interrupt"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.AgentPolicy("strict").MidTurn; got != "reject" {
		t.Errorf("strict: mid_turn %q, want reject", got)
	}
	if got := cfg.AgentPolicy("other").MidTurn; got != "interrupt" {
		t.Errorf("other: mid_turn %q, want the environment's interrupt over the file's steer", got)
	}
	next := cfg
	next.Policy.MidTurn = "queue"
	next.Agents = []AgentSpec{{Name: "strict", Policy: Policy{MidTurn: "steer"}}}
	if got := cfg.RestartOnlyChanges(next); len(got) != 0 {
		t.Errorf("a mid_turn change: restart-only changes %v, want none (it reloads)", got)
	}
}

func TestStreamDefaultsAndLimits(t *testing.T) {
	cfg, err := Load(Sources{})
	if err != nil {
		t.Fatal(err)
	}
	if s := cfg.Stream; s.FlushInterval != 100*time.Millisecond || s.Retention != 24*time.Hour || s.MaxBytesPerTurn != 8<<20 {
		t.Errorf("stream defaults %+v, want 100ms, 24h, 8 MiB", s)
	}
	cfg, err = Load(Sources{File: writeFile(t, "stream:\n  flush_interval: 20ms\n  retention: 2h\n  max_bytes_per_turn: 1048576\n")})
	if err != nil {
		t.Fatal(err)
	}
	if s := cfg.Stream; s.FlushInterval != 20*time.Millisecond || s.Retention != 2*time.Hour || s.MaxBytesPerTurn != 1<<20 {
		t.Errorf("stream from the file: %+v", s)
	}
	for body, key := range map[string]string{
		"stream:\n  flush_interval: 0s\n":      "stream.flush_interval",
		"stream:\n  flush_interval: 1m\n":      "stream.flush_interval",
		"stream:\n  retention: 30s\n":          "stream.retention",
		"stream:\n  poll_interval: 1ms\n":      "stream.poll_interval",
		"stream:\n  max_bytes_per_turn: 100\n": "stream.max_bytes_per_turn",
		"stream:\n  max_bytes_per_turn: -1\n":  "stream.max_bytes_per_turn",
		"stream:\n  flush_interval: soon\n":    "stream.flush_interval",
		"stream:\n  max_bytes_per_turn_x: 1\n": "stream.max_bytes_per_turn_x",
	} {
		_, err := Load(Sources{File: writeFile(t, body)})
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("%q: error %v, want one naming %s", body, err, key)
		}
	}
}

// TestTracingIsOffByDefaultAndChecked: no endpoint by default (tracing
// off), ratio 1; a file sets endpoint, headers and ratio; a bad endpoint
// or ratio is refused naming the key; a header's value never shows in an
// error.
func TestTracingIsOffByDefaultAndChecked(t *testing.T) {
	cfg, err := Load(Sources{})
	if err != nil {
		t.Fatal(err)
	}
	if tr := cfg.Tracing; tr.Endpoint != "" || tr.SampleRatio != 1 || tr.ServiceName != "paddock" || len(tr.Headers) != 0 {
		t.Errorf("tracing defaults %+v, want off, ratio 1, service paddock", tr)
	}
	cfg, err = Load(Sources{File: writeFile(t, "tracing:\n  endpoint: http://localhost:4318/v1/traces\n  sample_ratio: 0.25\n  headers:\n    Authorization: Bearer x\n")})
	if err != nil {
		t.Fatal(err)
	}
	if tr := cfg.Tracing; tr.Endpoint != "http://localhost:4318/v1/traces" || tr.SampleRatio != 0.25 || tr.Headers["Authorization"] != "Bearer x" {
		t.Errorf("tracing from the file: %+v", tr)
	}
	for body, key := range map[string]string{
		"tracing:\n  endpoint: localhost:4318\n": "tracing.endpoint",
		"tracing:\n  endpoint: grpc://x:4317\n":  "tracing.endpoint",
		"tracing:\n  sample_ratio: 1.5\n":        "tracing.sample_ratio",
		"tracing:\n  sample_ratio: -1\n":         "tracing.sample_ratio",
		"tracing:\n  sampling: 1\n":              "tracing.sampling",
	} {
		_, err := Load(Sources{File: writeFile(t, body)})
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("%q: error %v, want one naming %s", body, err, key)
		}
	}
	const planted = "sk-PLANTED-trace"
	_, err = Load(Sources{File: writeFile(t, "tracing:\n  headers:\n    Authorization: ["+planted+"]\n")})
	if err == nil || strings.Contains(err.Error(), planted) {
		t.Errorf("a header of the wrong type: error %v, want one that does not show the value", err)
	}
}

// TestAZeroDurationNeedsNoUnit: a bare 0 is a duration (promote_after's
// "off", an approval that waits for ever), while other bare numbers are
// refused (TestBadConfigIsRefusedNamingKeyValueAndReason).
func TestAZeroDurationNeedsNoUnit(t *testing.T) {
	cfg, err := Load(Sources{File: writeFile(t, "runtime:\n  promote_after: 0\ncapabilities:\n  approval:\n    timeout: 0\n")})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Runtime.PromoteAfter != 0 {
		t.Errorf("promote_after: %s, want 0", cfg.Runtime.PromoteAfter)
	}
}
