// Package config loads and validates Paddock's configuration with koanf:
// defaults → YAML file → PADDOCK_ environment → command-line flags, later
// layers winning (docs/DESIGN.md "Configuration").
//
// Loading is strict: an unknown key, a value of the wrong type or a value
// out of range is refused, naming the key, the value and why.
package config

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/knadh/koanf/providers/file"
	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/host/calls"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/tracing"
)

// EnvPrefix is the prefix of environment variables read as configuration.
// Nesting uses a double underscore: PADDOCK_STORE__DSN sets store.dsn.
const EnvPrefix = "PADDOCK_"

// Config is the whole configuration of one host.
type Config struct {
	// Listen is the API's TCP address, host:port. Default 127.0.0.1:8080.
	Listen string `koanf:"listen"`
	// AuthToken is the bearer token the API requires. Required when Listen
	// is not a loopback address.
	AuthToken string `koanf:"auth_token"`
	// DataDir holds the SQLite database and the wasm compilation cache.
	DataDir string  `koanf:"data_dir"`
	Log     Log     `koanf:"log"`
	Store   Store   `koanf:"store"`
	Wasm    Wasm    `koanf:"wasm"`
	Runtime Runtime `koanf:"runtime"`
	API     API     `koanf:"api"`
	// Stream configures the session streams chat clients follow
	// (docs/DESIGN.md "The session stream"; restart to change).
	Stream Stream `koanf:"stream"`
	// Policy is the default policy of every agent (docs/DESIGN.md "Failure, retry
	// and crash policy"); agents[].policy overrides it per agent. Policies
	// are reloaded from the config file without a restart.
	Policy Policy `koanf:"policy"`
	// Pools maps a pool name to its capacity on this host.
	Pools map[string]Pool `koanf:"pools"`
	// Fabric configures remote workers over ZeroMQ (RuntimeFabric).
	Fabric Fabric `koanf:"fabric"`
	// Plugins are plugin workers registered (or updated) at start.
	Plugins []PluginSpec `koanf:"plugins"`
	// Agents are registered (or updated) at start from module files or
	// plugin workers, and/or given per-agent policy overrides. A name of
	// the default namespace is plain ("chat"); one of a declared namespace
	// is "namespace/name" ("team-a/chat"), and its plugin names a plugin
	// worker of that namespace.
	Agents []AgentSpec `koanf:"agents"`
	// Namespaces declares the namespaces besides "default" by name, with
	// their quotas (docs/DESIGN.md "Namespaces"); reloaded without a
	// restart.
	Namespaces map[string]Namespace `koanf:"namespaces"`
	// Models are the named model endpoints host calls may reach (restart
	// to change).
	Models map[string]ModelEndpoint `koanf:"models"`
	// Secrets are config-declared secrets, by name (restart to change);
	// they win over API-set secrets of the same name. A plain name is a
	// secret of the default namespace; "namespace/NAME" one of a declared
	// namespace (only that namespace's agents can use it).
	Secrets map[string]SecretSpec `koanf:"secrets"`
	// SecretsKey is the base64 of the 32-byte AES-256 key that seals
	// API-set secrets; SecretsKeyFile names a file holding it. At most one;
	// without either, secrets cannot be set through the API.
	SecretsKey     string `koanf:"secrets_key"`
	SecretsKeyFile string `koanf:"secrets_key_file"`
	// HostCalls are the host-wide limits of host calls.
	HostCalls HostCalls `koanf:"host_calls"`
	// Capabilities are the default capabilities of every agent; an agent's
	// agents[].capabilities replace them as a whole. The zero value (the
	// default) denies every host call (docs/DESIGN.md "Next: the agent
	// layer"). Reloaded from the config file like policies.
	Capabilities Capabilities `koanf:"capabilities"`
	// Tracing exports OpenTelemetry traces over OTLP/HTTP (docs/DESIGN.md
	// "Tracing"); off by default (restart to change).
	Tracing Tracing `koanf:"tracing"`
}

// Tracing configures OpenTelemetry traces (README "Tracing").
type Tracing struct {
	// Endpoint is the OTLP/HTTP traces URL, e.g.
	// http://localhost:4318/v1/traces. Empty (the default): no spans are
	// exported; a signal's traceparent is still stored with its event.
	Endpoint string `koanf:"endpoint"`
	// Headers are sent with every export, e.g. an Authorization header.
	// Their values are treated as secrets (never shown in errors).
	Headers map[string]string `koanf:"headers"`
	// SampleRatio is the share of new traces recorded, 0 to 1 (default
	// 1). A trace begun by a caller's sampled (or unsampled) traceparent
	// is recorded (or not) whatever the ratio.
	SampleRatio float64 `koanf:"sample_ratio"`
	// ServiceName is the service.name of the spans (default "paddock").
	ServiceName string `koanf:"service_name"`
}

// ModelEndpoint is a named model endpoint (models.NAME).
type ModelEndpoint struct {
	// Provider is openai (OpenAI-compatible chat completions: OpenAI,
	// Ollama, vLLM, llama.cpp server, OpenRouter) or anthropic (Messages
	// API).
	Provider string `koanf:"provider"`
	// BaseURL is the API root: for openai with its version path
	// (https://api.openai.com/v1, http://127.0.0.1:11434/v1), for
	// anthropic without (https://api.anthropic.com).
	BaseURL string `koanf:"base_url"`
	// Models are the model names agents may ask for; the first is the
	// default.
	Models []string `koanf:"models"`
	// Secret names the secret holding the API key (declared under
	// secrets: or set through the API); empty sends no key.
	Secret string `koanf:"secret"`
	// MaxTokens is the reply cap when a call gives none (0: 4096).
	MaxTokens int `koanf:"max_tokens"`
	// Timeout bounds one call to the endpoint (0: host_calls.timeout).
	Timeout time.Duration `koanf:"timeout"`
}

// SecretSpec says where a config-declared secret's value is read, at
// each use: exactly one of Env (a host environment variable) and File (a
// file, one trailing newline removed).
type SecretSpec struct {
	Env  string `koanf:"env"`
	File string `koanf:"file"`
}

// HostCalls are the host-wide settings of host calls.
type HostCalls struct {
	// Timeout bounds one host call (the turn's deadline applies when
	// earlier). Default 60s.
	Timeout time.Duration `koanf:"timeout"`
	// MaxResponseBytes caps one call's response body or model stream.
	// Default 4 MiB, at most calls.MaxResponseBytesCeiling (~5.75 MiB:
	// base64 in a call result must fit abi.MaxCallResultBytes).
	MaxResponseBytes int64 `koanf:"max_response_bytes"`
}

// Capabilities grant host calls (capabilities:, agents[].capabilities).
// Nothing is granted by default.
type Capabilities struct {
	// HTTP are the destinations http calls may reach.
	HTTP []HTTPRule `koanf:"http"`
	// Models are names of model endpoints (models:) the agent may call.
	Models []string `koanf:"models"`
	// Secrets are names of secrets the agent's http calls may use in
	// header values ("{{secret:NAME}}").
	Secrets []string `koanf:"secrets"`
	// Limits bound calls per turn and tokens per day; 0 sets no limit of
	// its own (the host-wide caps hold).
	Limits Limits `koanf:"limits"`
	// Approval names granted calls that also need an approver's decision
	// before they go out (docs/DESIGN.md "Waits and approvals"): the turn
	// is held, a wait of kind approval shows the request, and the call is
	// sent once approved or answered denied (reason approval) when
	// rejected or expired.
	Approval Approval `koanf:"approval"`
}

// Approval lists the calls that need approval (capabilities.approval).
type Approval struct {
	// HTTP: http calls matching any rule need approval.
	HTTP []ApprovalHTTPRule `koanf:"http"`
	// Models: model calls to these endpoints (names under models:) need
	// approval.
	Models []string `koanf:"models"`
	// Timeout, when set, expires an undecided approval after this long
	// (the call is then refused); 0 waits for ever.
	Timeout time.Duration `koanf:"timeout"`
}

// ApprovalHTTPRule matches http calls (calls.ApprovalHTTPRule).
type ApprovalHTTPRule struct {
	// Host is an exact name, an IP literal or "*.example.com".
	Host string `koanf:"host"`
	// Methods are upper-case methods; empty matches every method.
	Methods []string `koanf:"methods"`
	// PathPrefix, when set, matches only paths starting with it.
	PathPrefix string `koanf:"path_prefix"`
}

// HTTPRule allows one destination (calls.HTTPRule documents the
// private-address rule).
type HTTPRule struct {
	// Scheme is http or https.
	Scheme string `koanf:"scheme"`
	// Host is an exact name, an IP literal or "*.example.com".
	Host string `koanf:"host"`
	// Port is 0 for the scheme's default.
	Port int `koanf:"port"`
	// Methods are upper-case methods; empty means GET and HEAD.
	Methods []string `koanf:"methods"`
	// AllowPrivate lets an exact name resolve to a private address.
	AllowPrivate bool `koanf:"allow_private"`
	// Secrets, when set, are the only secrets filled into requests to
	// this destination; each must be listed in the block's secrets.
	Secrets []string `koanf:"secrets"`
}

// Limits are per-turn and per-day limits of host calls.
type Limits struct {
	CallsPerTurn         int   `koanf:"calls_per_turn"`
	ResponseBytesPerTurn int64 `koanf:"response_bytes_per_turn"`
	TokensPerTurn        int64 `koanf:"tokens_per_turn"`
	TokensPerDay         int64 `koanf:"tokens_per_day"`
}

// Log configures log/slog output.
type Log struct {
	// Level is debug, info, warn or error.
	Level string `koanf:"level"`
	// Format is text or json.
	Format string `koanf:"format"`
}

// Store selects the store driver.
type Store struct {
	// Driver is sqlite (embedded default) or postgres.
	Driver string `koanf:"driver"`
	// DSN is the connection string. For sqlite, empty means
	// <data_dir>/paddock.db; for postgres it is required.
	DSN string `koanf:"dsn"`
}

// Wasm configures the wazero runtime.
type Wasm struct {
	// MemoryLimitPages caps a guest's linear memory, in 64 KiB pages.
	MemoryLimitPages uint32 `koanf:"memory_limit_pages"`
	// MaxResultBytes caps an encoded TurnResult: default
	// abi.DefaultResultBytes (a maximal state, base64, plus headroom), at
	// most abi.MaxResultBytes.
	MaxResultBytes int `koanf:"max_result_bytes"`
	// CompilationCache keeps compiled modules on disk, so a restart loads
	// them in ~0.1 s instead of compiling for ~1 s each.
	CompilationCache bool `koanf:"compilation_cache"`
	// CacheDir is where; empty means <data_dir>/wasm-cache.
	CacheDir string `koanf:"cache_dir"`
}

// Runtime configures this host's leases and loops (restart to change).
type Runtime struct {
	// LeaseTTL is an activation lease's length; renewed by each commit of
	// its turns, and every LeaseTTL/3 when none renewed it since.
	// A dead host's sessions move to live hosts within LeaseTTL plus one
	// ScanInterval.
	LeaseTTL time.Duration `koanf:"lease_ttl"`
	// ScanInterval is how often the host runs the lease watchdog, fires due
	// alarms and looks for runnable sessions (the safety net behind
	// in-process and NOTIFY wake-ups).
	ScanInterval time.Duration `koanf:"scan_interval"`
	// TranscriptTail is how many recent messages a TurnRequest carries.
	TranscriptTail int `koanf:"transcript_tail"`
	// ShutdownTimeout bounds how long in-flight turns may finish at stop.
	ShutdownTimeout time.Duration `koanf:"shutdown_timeout"`
	// PromoteAfter: a turn of a wasm agent run by this host is dispatched
	// deferred (read, not written) and written whole by its commit, unless
	// it makes a host call, streams, waits or fails first, or runs this
	// long (docs/DESIGN.md "Deferred dispatch"). Default 50ms; 0 writes
	// every dispatch at once; at most 10s and less than lease_ttl.
	PromoteAfter time.Duration `koanf:"promote_after"`
}

// Stream configures the session streams: how emitted chunks are batched,
// how long frames are kept, how much one turn may emit.
type Stream struct {
	// FlushInterval: a running turn's emitted chunks are written as one
	// frame at most this long after the previous write (sooner once 32 KiB
	// are buffered, and always before the turn commits). Default 50ms;
	// 1ms to 10s. Shorter: lower latency, more database writes.
	FlushInterval time.Duration `koanf:"flush_interval"`
	// Retention: frames older than this are deleted (except those of an
	// event still open) by a pass every minute; a client resuming from
	// before them is told to reload the transcript. Default 24h; at least
	// 1m.
	Retention time.Duration `koanf:"retention"`
	// MaxBytesPerTurn caps the chunk text and data one attempt of a turn
	// may emit, in bytes (a chunk counts at least 64 bytes, so that empty
	// chunks are capped too); later emits answer too_large. Default 8388608
	// (8 MiB); 65536 to 1073741824.
	MaxBytesPerTurn int64 `koanf:"max_bytes_per_turn"`
	// PollInterval is how often a host's stream hub looks for frames
	// other hosts wrote to the sessions its clients watch (one
	// StreamHeads statement for all of them); this host's own writes wake
	// it at once. Default 100ms; 10ms to 10s.
	PollInterval time.Duration `koanf:"poll_interval"`
}

// Policy is an agent policy. In agents[].policy, zero values inherit the
// default policy.
type Policy struct {
	// CrashPolicy (restart, sleep or destroy) is stored on each session at
	// creation when the request names none; responses echo it.
	CrashPolicy string `koanf:"crash_policy"`
	// MaxAttempts is the dead-letter threshold (attempts a worker accepted).
	MaxAttempts int `koanf:"max_attempts"`
	// BackoffMin and BackoffMax bound the exponential retry backoff
	// (5 s … 120 s by default), jittered.
	BackoffMin time.Duration `koanf:"backoff_min"`
	BackoffMax time.Duration `koanf:"backoff_max"`
	// DeadLetter says whether a session's later events continue past a
	// dead-lettered one ("continue", default) or wait until it is redriven
	// or discarded ("block").
	DeadLetter string `koanf:"dead_letter"`
	// IdleTimeout stops an activation with no due event after this long;
	// the session then holds no goroutine and no instance.
	IdleTimeout time.Duration `koanf:"idle_timeout"`
	// TurnTimeout is the wall-time cap of one turn.
	TurnTimeout time.Duration `koanf:"turn_timeout"`
	// RestartPendingTimeout: a restart-policy session that waits this long
	// for capacity goes to sleep instead (Rivet's pending timeout).
	RestartPendingTimeout time.Duration `koanf:"restart_pending_timeout"`
	// Pool is the capacity pool the agent's activations use.
	Pool string `koanf:"pool"`
	// TranscriptTail overrides runtime.transcript_tail for the agent: how
	// many recent transcript messages its TurnRequests carry (0..1000; 0
	// for an agent that keeps what it needs in its state — decoding the
	// tail is most of a small Go guest's turn). Unset: the runtime's.
	TranscriptTail *int `koanf:"transcript_tail"`
	// InstanceReuse is who may see a wasm instance's globals after whom:
	// "session" (default; an instance serves one activation of one session,
	// abi/README.md) or "agent" (warm instances are kept per agent and lent
	// to any of its sessions' turns: no instantiation on a wake, and memory
	// bounded by the turns running at once — for agents that keep
	// everything in the session state).
	InstanceReuse string `koanf:"instance_reuse"`
	// MidTurn is what a message signal does when it arrives while the
	// session has a turn in flight (docs/DESIGN.md "Messages that arrive
	// mid-turn"): "queue" (default; runs after the turn), "steer"
	// (delivered to the running turn), "interrupt" (the turn is
	// cancelled, then the message queued) or "reject" (409
	// turn_in_flight, nothing written). A signal's mid_turn overrides it.
	MidTurn string `koanf:"mid_turn"`
}

// Pool is one capacity pool.
type Pool struct {
	// Capacity is the number of concurrent activations on this host.
	Capacity int `koanf:"capacity"`
	// Remote: the pool's turns run on remote workers (`paddock worker
	// --pool NAME`) connected through the fabric, not on this host.
	Remote bool `koanf:"remote"`
}

// Fabric configures the host's end of the RuntimeFabric: the ROUTER
// socket remote workers connect to, who may connect, and the timing that
// decides when a worker is lost (abi/FABRIC.md).
type Fabric struct {
	// Listen is the ZeroMQ endpoint to bind, e.g. tcp://0.0.0.0:7700;
	// empty disables remote workers.
	Listen string `koanf:"listen"`
	// Workers may connect: each has an id and a 32-byte key (base64, as
	// printed by `paddock worker keygen`) given inline or in a file.
	Workers []FabricWorker `koanf:"workers"`
	// HeartbeatInterval is how often workers and host exchange
	// heartbeats; a worker silent for HeartbeatTimeout is lost and its
	// in-flight turns fail.
	HeartbeatInterval time.Duration `koanf:"heartbeat_interval"`
	HeartbeatTimeout  time.Duration `koanf:"heartbeat_timeout"`
	// AcceptTimeout bounds the wait for a worker's accepted receipt; a
	// turn not accepted in time is retried elsewhere without consuming an
	// attempt.
	AcceptTimeout time.Duration `koanf:"accept_timeout"`
	// SendTimeout bounds one blocked send to a worker that stopped reading.
	SendTimeout time.Duration `koanf:"send_timeout"`
	// MaxMessageBytes refuses larger frames.
	MaxMessageBytes int `koanf:"max_message_bytes"`
}

// FabricWorker is one remote worker allowed to connect.
type FabricWorker struct {
	ID string `koanf:"id"`
	// Key is the base64 32-byte key; KeyFile names a file holding it.
	Key     string `koanf:"key"`
	KeyFile string `koanf:"key_file"`
}

// WorkerKey returns the decoded key of w.
func (w FabricWorker) WorkerKey() ([]byte, error) {
	k := w.Key
	if k == "" {
		b, err := readSmallFile(w.KeyFile, 4<<10)
		if err != nil {
			return nil, fmt.Errorf("fabric worker %s: key_file: %w", w.ID, err)
		}
		k = strings.TrimSpace(string(b))
	}
	key, err := base64.StdEncoding.DecodeString(k)
	if err != nil || len(key) != 32 {
		return nil, fmt.Errorf("fabric worker %s: the key must be 32 bytes in base64 (paddock worker keygen)", w.ID)
	}
	return key, nil
}

// API configures the HTTP API's limits.
type API struct {
	// MaxBodyBytes caps a JSON request body.
	MaxBodyBytes int64 `koanf:"max_body_bytes"`
	// MaxModuleBytes caps an uploaded wasm module.
	MaxModuleBytes int64 `koanf:"max_module_bytes"`
}

// AgentSpec registers an agent at start from a module file, and/or
// overrides its policy.
type AgentSpec struct {
	Name string `koanf:"name"`
	// ModuleFile is a path to a .wasm file, relative to the working
	// directory: the agent is a wasm agent.
	ModuleFile string `koanf:"module_file"`
	// Plugin names a plugin worker (plugins[]): the agent is a plugin agent.
	// With neither ModuleFile nor Plugin, only the policy override applies
	// (for an agent registered through the API).
	Plugin string `koanf:"plugin"`
	// Policy overrides the default policy for this agent.
	Policy Policy `koanf:"policy"`
	// Capabilities, when set, replace the default capabilities for this
	// agent as a whole (grants are not merged).
	Capabilities *Capabilities `koanf:"capabilities"`
}

// PluginSpec registers a plugin worker at start (docs/DESIGN.md "Workers").
type PluginSpec struct {
	Name string `koanf:"name"`
	// Path is the plugin binary.
	Path string `koanf:"path"`
	// SHA256 is the binary's lowercase hex sha256, checked at every start.
	SHA256 string `koanf:"sha256"`
	// SHA256File names a file whose first word is the sha256 (the output
	// of `sha256sum`), for builds that write one; used when SHA256 is empty.
	SHA256File string `koanf:"sha256_file"`
	// Env is the plugin's whole environment: it inherits nothing else.
	Env map[string]string `koanf:"env"`
	// Processes is how many plugin processes serve its sessions (default 1).
	Processes int `koanf:"processes"`
}

// Default returns the built-in defaults.
func Default() Config {
	return Config{
		Listen:  "127.0.0.1:8080",
		DataDir: "./data",
		Log:     Log{Level: "info", Format: "text"},
		Store:   Store{Driver: "sqlite"},
		Wasm:    Wasm{MemoryLimitPages: 1024 /* 64 MiB */, MaxResultBytes: abi.DefaultResultBytes, CompilationCache: true},
		Runtime: Runtime{
			LeaseTTL:        8 * time.Second,
			ScanInterval:    time.Second,
			TranscriptTail:  20,
			ShutdownTimeout: 10 * time.Second,
			PromoteAfter:    50 * time.Millisecond,
		},
		API:    API{MaxBodyBytes: 1 << 20, MaxModuleBytes: 64 << 20},
		Stream: Stream{FlushInterval: 100 * time.Millisecond, Retention: 24 * time.Hour, MaxBytesPerTurn: 8 << 20, PollInterval: 100 * time.Millisecond},
		Policy: Policy{
			CrashPolicy: "restart", MaxAttempts: 5, BackoffMin: 5 * time.Second, BackoffMax: 120 * time.Second,
			DeadLetter: "continue", IdleTimeout: 30 * time.Second, TurnTimeout: 30 * time.Second,
			RestartPendingTimeout: 60 * time.Second, Pool: "default", InstanceReuse: "session",
			MidTurn: "queue",
		},
		// 64 activations × the 64 MiB memory cap bounds guest memory near
		// 4 GiB per host; raise it with the machine.
		Pools: map[string]Pool{"default": {Capacity: 64}},
		Fabric: Fabric{
			HeartbeatInterval: time.Second, HeartbeatTimeout: 5 * time.Second,
			AcceptTimeout: 5 * time.Second, SendTimeout: 2 * time.Second, MaxMessageBytes: 8 << 20,
		},
		HostCalls: HostCalls{Timeout: calls.DefaultTimeout, MaxResponseBytes: calls.DefaultMaxResponseBytes},
		Tracing:   Tracing{SampleRatio: 1, ServiceName: "paddock"},
	}
}

// AgentPolicy returns the effective policy of the named agent: its
// override in agents[] merged over the default policy.
func (c Config) AgentPolicy(name string) Policy {
	p := c.Policy
	for _, a := range c.Agents {
		if a.Name == name {
			p = a.Policy.over(p)
		}
	}
	return p
}

// over returns o with p's non-zero fields applied.
func (p Policy) over(o Policy) Policy {
	if p.CrashPolicy != "" {
		o.CrashPolicy = p.CrashPolicy
	}
	if p.MaxAttempts != 0 {
		o.MaxAttempts = p.MaxAttempts
	}
	if p.BackoffMin != 0 {
		o.BackoffMin = p.BackoffMin
	}
	if p.BackoffMax != 0 {
		o.BackoffMax = p.BackoffMax
	}
	if p.DeadLetter != "" {
		o.DeadLetter = p.DeadLetter
	}
	if p.IdleTimeout != 0 {
		o.IdleTimeout = p.IdleTimeout
	}
	if p.TurnTimeout != 0 {
		o.TurnTimeout = p.TurnTimeout
	}
	if p.RestartPendingTimeout != 0 {
		o.RestartPendingTimeout = p.RestartPendingTimeout
	}
	if p.Pool != "" {
		o.Pool = p.Pool
	}
	if p.TranscriptTail != nil {
		o.TranscriptTail = p.TranscriptTail
	}
	if p.InstanceReuse != "" {
		o.InstanceReuse = p.InstanceReuse
	}
	if p.MidTurn != "" {
		o.MidTurn = p.MidTurn
	}
	return o
}

// RestartOnly lists the keys whose change needs a restart; the others
// (policy, pools, agents' policies) are reloaded from the file.
func (c Config) RestartOnlyChanges(next Config) []string {
	var out []string
	diff := func(key string, a, b any) {
		if !reflect.DeepEqual(a, b) {
			out = append(out, key)
		}
	}
	diff("listen", c.Listen, next.Listen)
	diff("auth_token", c.AuthToken, next.AuthToken)
	diff("data_dir", c.DataDir, next.DataDir)
	diff("log", c.Log, next.Log)
	diff("store", c.Store, next.Store)
	diff("wasm", c.Wasm, next.Wasm)
	diff("runtime", c.Runtime, next.Runtime)
	diff("api", c.API, next.API)
	diff("stream", c.Stream, next.Stream)
	diff("fabric", c.Fabric, next.Fabric)
	// Registrations (module_file, plugin) apply at start; an entry that
	// only sets policy or capabilities reloads, added or removed.
	regs := func(as []AgentSpec) map[string]string {
		out := map[string]string{}
		for _, a := range as {
			if a.ModuleFile != "" || a.Plugin != "" {
				out[a.Name] = a.ModuleFile + "|" + a.Plugin
			}
		}
		return out
	}
	diff("agents[].module_file|plugin", regs(c.Agents), regs(next.Agents))
	diff("plugins", c.Plugins, next.Plugins)
	diff("models", c.Models, next.Models)
	diff("secrets", c.Secrets, next.Secrets)
	diff("secrets_key", c.SecretsKey, next.SecretsKey)
	diff("secrets_key_file", c.SecretsKeyFile, next.SecretsKeyFile)
	diff("host_calls", c.HostCalls, next.HostCalls)
	diff("tracing", c.Tracing, next.Tracing)
	return out
}

// Validate checks ranges and cross-field rules.
func (c Config) Validate() error {
	var errs []error
	bad := func(key string, val any, why string) {
		errs = append(errs, &KeyError{Key: key, Value: val, Reason: why})
	}
	host, _, err := net.SplitHostPort(c.Listen)
	if err != nil {
		bad("listen", c.Listen, "must be host:port ("+err.Error()+")")
	} else if !isLoopback(host) && c.AuthToken == "" {
		bad("auth_token", `""`, "required when listen ("+c.Listen+") is not a loopback address")
	}
	if c.AuthToken != strings.TrimSpace(c.AuthToken) {
		// HTTP trims a header's value: such a token could never match.
		bad("auth_token", "(not shown)", "begins or ends with white space, which an Authorization header cannot carry")
	} else if strings.ContainsFunc(c.AuthToken, func(r rune) bool { return (r < 0x20 && r != '\t') || r == 0x7f }) {
		// Found in review: a token with a newline was taken, and no
		// request could carry it — the admin locked out.
		bad("auth_token", "(not shown)", "holds a control character other than tab, which an Authorization header cannot carry")
	}
	if c.DataDir == "" {
		bad("data_dir", `""`, "must not be empty")
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		bad("log.level", c.Log.Level, "must be debug, info, warn or error")
	}
	switch c.Log.Format {
	case "text", "json":
	default:
		bad("log.format", c.Log.Format, "must be text or json")
	}
	switch c.Store.Driver {
	case "sqlite":
	case "postgres":
		if c.Store.DSN == "" {
			bad("store.dsn", `""`, "required when store.driver is postgres")
		}
	default:
		bad("store.driver", c.Store.Driver, "must be sqlite or postgres")
	}
	if c.Wasm.MemoryLimitPages < 64 || c.Wasm.MemoryLimitPages > 65536 {
		bad("wasm.memory_limit_pages", c.Wasm.MemoryLimitPages, "must be between 64 (4 MiB; a Go guest needs ~40 pages) and 65536 (4 GiB)")
	}
	if c.Wasm.MaxResultBytes < abi.DefaultResultBytes || c.Wasm.MaxResultBytes > abi.MaxResultBytes {
		bad("wasm.max_result_bytes", c.Wasm.MaxResultBytes, fmt.Sprintf("must be between %d (a maximal state, base64, plus %d bytes for messages) and %d", abi.DefaultResultBytes, abi.ResultHeadroomBytes, abi.MaxResultBytes))
	}
	if c.Runtime.LeaseTTL < 100*time.Millisecond {
		bad("runtime.lease_ttl", c.Runtime.LeaseTTL, "must be at least 100ms")
	}
	if c.Runtime.ScanInterval <= 0 {
		bad("runtime.scan_interval", c.Runtime.ScanInterval, "must be positive")
	}
	if c.Runtime.PromoteAfter < 0 || c.Runtime.PromoteAfter > 10*time.Second || (c.Runtime.PromoteAfter > 0 && c.Runtime.PromoteAfter >= c.Runtime.LeaseTTL) {
		bad("runtime.promote_after", c.Runtime.PromoteAfter, "must be between 0 (off) and 10s, and less than runtime.lease_ttl")
	}
	if c.Runtime.TranscriptTail < 0 || c.Runtime.TranscriptTail > 1000 {
		bad("runtime.transcript_tail", c.Runtime.TranscriptTail, "must be between 0 and 1000")
	}
	if c.Runtime.ShutdownTimeout < 0 {
		bad("runtime.shutdown_timeout", c.Runtime.ShutdownTimeout, "must not be negative")
	}
	errs = append(errs, c.Policy.validate("policy", c.Pools, true)...)
	if len(c.Pools) == 0 {
		bad("pools", "{}", "at least one pool is required")
	}
	for name, p := range c.Pools {
		if name == "" {
			bad("pools", `""`, "a pool needs a name")
		}
		if p.Capacity < 1 {
			bad("pools."+name+".capacity", p.Capacity, "must be at least 1")
		}
	}
	if c.Tracing.Endpoint != "" {
		if err := tracing.CheckEndpoint(c.Tracing.Endpoint); err != nil {
			bad("tracing.endpoint", c.Tracing.Endpoint, err.Error())
		}
	}
	if c.Tracing.SampleRatio < 0 || c.Tracing.SampleRatio > 1 {
		bad("tracing.sample_ratio", c.Tracing.SampleRatio, "must be between 0 and 1")
	}
	if c.Stream.FlushInterval < time.Millisecond || c.Stream.FlushInterval > 10*time.Second {
		bad("stream.flush_interval", c.Stream.FlushInterval, "must be between 1ms and 10s")
	}
	if c.Stream.PollInterval < 10*time.Millisecond || c.Stream.PollInterval > 10*time.Second {
		bad("stream.poll_interval", c.Stream.PollInterval, "must be between 10ms and 10s")
	}
	if c.Stream.Retention < time.Minute {
		bad("stream.retention", c.Stream.Retention, "must be at least 1m")
	}
	if c.Stream.MaxBytesPerTurn < abi.MaxChunkBytes || c.Stream.MaxBytesPerTurn > 1<<30 {
		bad("stream.max_bytes_per_turn", c.Stream.MaxBytesPerTurn, fmt.Sprintf("must be between %d (one chunk) and %d bytes", abi.MaxChunkBytes, 1<<30))
	}
	if c.API.MaxBodyBytes < 1024 {
		bad("api.max_body_bytes", c.API.MaxBodyBytes, "must be at least 1024")
	}
	if c.API.MaxModuleBytes < 1024 {
		bad("api.max_module_bytes", c.API.MaxModuleBytes, "must be at least 1024")
	}
	seen := map[string]bool{}
	for i, a := range c.Agents {
		key := fmt.Sprintf("agents[%d]", i)
		if r := c.checkQualified(a.Name, agentNameRE.MatchString, agentNameRE.String()); r != "" {
			bad(key+".name", a.Name, r+" (as the API requires)")
		}
		if seen[a.Name] {
			bad(key+".name", a.Name, "names an agent listed twice")
		}
		seen[a.Name] = true
		if a.ModuleFile != "" && a.Plugin != "" {
			bad(key+".plugin", a.Plugin, "an agent runs either a module_file or a plugin, not both")
		}
		ns, _ := store.SplitQualified(a.Name)
		if p := store.QualifiedName(ns, a.Plugin); a.Plugin != "" && !slices.ContainsFunc(c.Plugins, func(s PluginSpec) bool { return s.Name == p }) {
			bad(key+".plugin", a.Plugin, fmt.Sprintf("is not listed under plugins (as %q: an agent's plugin worker is of its namespace)", p))
		}
		errs = append(errs, a.Policy.validate(key+".policy", c.Pools, false)...)
		if eff := c.AgentPolicy(a.Name); eff.BackoffMax < eff.BackoffMin {
			bad(key+".policy.backoff_max", eff.BackoffMax, "must not be below backoff_min ("+eff.BackoffMin.String()+")")
		}
	}
	if c.Fabric.Listen != "" {
		if !strings.Contains(c.Fabric.Listen, "://") {
			bad("fabric.listen", c.Fabric.Listen, "must be a ZeroMQ endpoint such as tcp://0.0.0.0:7700")
		}
		if len(c.Fabric.Workers) == 0 {
			bad("fabric.workers", "[]", "list the workers allowed to connect (id and key)")
		}
	}
	if c.Fabric.HeartbeatInterval <= 0 || c.Fabric.HeartbeatTimeout < 2*c.Fabric.HeartbeatInterval {
		bad("fabric.heartbeat_timeout", c.Fabric.HeartbeatTimeout, "must be at least twice fabric.heartbeat_interval ("+c.Fabric.HeartbeatInterval.String()+")")
	}
	if c.Fabric.AcceptTimeout <= 0 || c.Fabric.SendTimeout <= 0 {
		bad("fabric.accept_timeout", c.Fabric.AcceptTimeout, "accept_timeout and send_timeout must be positive")
	}
	if c.Fabric.MaxMessageBytes < 64<<10 {
		bad("fabric.max_message_bytes", c.Fabric.MaxMessageBytes, "must be at least 65536")
	}
	seenWorkers := map[string]bool{}
	for i, w := range c.Fabric.Workers {
		key := fmt.Sprintf("fabric.workers[%d]", i)
		if !agentNameRE.MatchString(w.ID) || seenWorkers[w.ID] {
			bad(key+".id", w.ID, "must be a unique name matching "+agentNameRE.String())
		}
		seenWorkers[w.ID] = true
		if (w.Key == "") == (w.KeyFile == "") {
			bad(key+".key", "…", "give exactly one of key and key_file")
		} else if _, err := w.WorkerKey(); err != nil {
			bad(key+".key", "…", err.Error())
		}
	}
	remote := false
	for _, p := range c.Pools {
		remote = remote || p.Remote
	}
	if remote && c.Fabric.Listen == "" {
		bad("fabric.listen", `""`, "a pool is remote: set fabric.listen so that workers can connect")
	}
	errs = append(errs, c.validateHostCalls()...)
	c.validateNamespaces(bad)
	seenPlugins := map[string]bool{}
	for i, p := range c.Plugins {
		key := fmt.Sprintf("plugins[%d]", i)
		if r := c.checkQualified(p.Name, agentNameRE.MatchString, agentNameRE.String()); r != "" {
			bad(key+".name", p.Name, r)
		}
		if seenPlugins[p.Name] {
			bad(key+".name", p.Name, "names a plugin listed twice")
		}
		seenPlugins[p.Name] = true
		if p.Path == "" {
			bad(key+".path", `""`, "must not be empty")
		}
		if (p.SHA256 == "") == (p.SHA256File == "") {
			bad(key+".sha256", p.SHA256, "give exactly one of sha256 and sha256_file")
		}
		if p.SHA256 != "" && !sha256RE.MatchString(p.SHA256) {
			bad(key+".sha256", p.SHA256, "must be 64 lowercase hex digits")
		}
		if p.Processes < 0 || p.Processes > 64 {
			bad(key+".processes", p.Processes, "must be between 1 and 64 (0: 1)")
		}
	}
	return errors.Join(errs...)
}

// readSmallFile reads a file the configuration names (a key, a checksum),
// refusing what is not a regular file or is larger than limit bytes: a
// key_file of /dev/zero would otherwise be read until memory runs out, and
// a FIFO or /dev/stdin would block the start (or a reload) forever.
func readSmallFile(path string, limit int64) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (%s)", path, fi.Mode().Type())
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, limit)
	}
	return b, nil
}

// sha256RE matches a lowercase hex sha256.
var sha256RE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// PluginSHA256 returns the plugin's checksum, reading SHA256File if needed.
func (p PluginSpec) PluginSHA256() (string, error) {
	if p.SHA256 != "" {
		return p.SHA256, nil
	}
	b, err := readSmallFile(p.SHA256File, 64<<10)
	if err != nil {
		return "", fmt.Errorf("plugin %s: sha256_file: %w", p.Name, err)
	}
	sum, _, _ := strings.Cut(strings.TrimSpace(string(b)), " ")
	if !sha256RE.MatchString(sum) {
		return "", fmt.Errorf("plugin %s: sha256_file %s does not start with a hex sha256", p.Name, p.SHA256File)
	}
	return sum, nil
}

// agentNameRE is the API's rule for agent names.
var agentNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// ValidMidTurn says whether m is a mid_turn policy: queue, steer,
// interrupt or reject.
func ValidMidTurn(m string) bool {
	return m == "queue" || m == "steer" || m == "interrupt" || m == "reject"
}

func validPolicy(p string) bool { return p == "restart" || p == "sleep" || p == "destroy" }

// validate checks a policy; with full, every field must be set (the
// default policy), else zero means "inherit".
func (p Policy) validate(prefix string, pools map[string]Pool, full bool) []error {
	var errs []error
	bad := func(key string, val any, why string) {
		errs = append(errs, &KeyError{Key: prefix + "." + key, Value: val, Reason: why})
	}
	if (full || p.CrashPolicy != "") && !validPolicy(p.CrashPolicy) {
		bad("crash_policy", p.CrashPolicy, "must be restart, sleep or destroy")
	}
	if (full || p.MaxAttempts != 0) && p.MaxAttempts < 1 {
		bad("max_attempts", p.MaxAttempts, "must be at least 1")
	}
	if (full || p.BackoffMin != 0) && p.BackoffMin <= 0 {
		bad("backoff_min", p.BackoffMin, "must be positive")
	}
	if full && p.BackoffMax < p.BackoffMin {
		bad("backoff_max", p.BackoffMax, "must not be below backoff_min ("+p.BackoffMin.String()+")")
	}
	if (full || p.DeadLetter != "") && p.DeadLetter != "continue" && p.DeadLetter != "block" {
		bad("dead_letter", p.DeadLetter, "must be continue or block")
	}
	if (full || p.IdleTimeout != 0) && p.IdleTimeout <= 0 {
		bad("idle_timeout", p.IdleTimeout, "must be positive")
	}
	if (full || p.TurnTimeout != 0) && p.TurnTimeout <= 0 {
		bad("turn_timeout", p.TurnTimeout, "must be positive")
	}
	if (full || p.RestartPendingTimeout != 0) && p.RestartPendingTimeout <= 0 {
		bad("restart_pending_timeout", p.RestartPendingTimeout, "must be positive")
	}
	if (full || p.InstanceReuse != "") && p.InstanceReuse != "session" && p.InstanceReuse != "agent" {
		bad("instance_reuse", p.InstanceReuse, "must be session or agent")
	}
	if (full || p.MidTurn != "") && !ValidMidTurn(p.MidTurn) {
		bad("mid_turn", p.MidTurn, "must be queue, steer, interrupt or reject")
	}
	if p.TranscriptTail != nil && (*p.TranscriptTail < 0 || *p.TranscriptTail > 1000) {
		bad("transcript_tail", *p.TranscriptTail, "must be between 0 and 1000")
	}
	if full || p.Pool != "" {
		if _, ok := pools[p.Pool]; !ok {
			names := make([]string, 0, len(pools))
			for n := range pools {
				names = append(names, n)
			}
			sort.Strings(names)
			bad("pool", p.Pool, "is not a configured pool (pools: "+strings.Join(names, ", ")+")")
		}
	}
	return errs
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Watch calls onChange after each change of the file at path, until stop
// is called. It uses koanf's file provider (fsnotify on the parent
// directory, following symlink swaps); the provider's watcher ends on any
// error or when the file is removed, so Watch re-arms it (polling for the
// file to come back).
func Watch(path string, onChange func()) (stop func(), err error) {
	done := make(chan struct{})
	var once sync.Once
	stop = func() { once.Do(func() { close(done) }) }
	arm := func() (*file.File, chan struct{}, error) {
		f := file.Provider(path)
		ended := make(chan struct{})
		var endOnce sync.Once
		err := f.Watch(func(_ any, err error) {
			if err != nil {
				endOnce.Do(func() { close(ended) })
				return
			}
			onChange()
		})
		return f, ended, err
	}
	f, ended, err := arm()
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			select {
			case <-done:
				_ = f.Unwatch()
				return
			case <-ended:
			}
			_ = f.Unwatch()
			for {
				select {
				case <-done:
					return
				case <-time.After(500 * time.Millisecond):
				}
				if nf, nended, err := arm(); err == nil {
					f, ended = nf, nended
					onChange() // the file came back, possibly changed
					break
				}
			}
		}
	}()
	return stop, nil
}
