// Package config loads and validates Paddock's configuration with koanf:
// defaults → YAML file → PADDOCK_ environment → command-line flags, later
// layers winning (DESIGN "Configuration").
//
// Loading is strict: an unknown key, a value of the wrong type or a value
// out of range is refused, naming the key, the value and why.
package config

import (
	"errors"
	"fmt"
	"net"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/confmap"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/providers/posflag"
	"github.com/knadh/koanf/v2"
	"github.com/spf13/pflag"
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
	Retry   Retry   `koanf:"retry"`
	API     API     `koanf:"api"`
	// CrashPolicy is THE default crash policy (restart, sleep or destroy)
	// for agents registered without one (DESIGN "Crash policy").
	CrashPolicy string `koanf:"crash_policy"`
	// Agents are registered (or updated) at start from module files.
	Agents []AgentSpec `koanf:"agents"`
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
	// TurnTimeout is the wall-time cap of one turn.
	TurnTimeout time.Duration `koanf:"turn_timeout"`
	// MaxResultBytes caps an encoded TurnResult.
	MaxResultBytes int `koanf:"max_result_bytes"`
	// CompilationCache keeps compiled modules under <data_dir>/wasm-cache.
	CompilationCache bool `koanf:"compilation_cache"`
}

// Runtime configures activations and controllers.
type Runtime struct {
	// LeaseTTL is an activation lease's length; renewed every LeaseTTL/3.
	LeaseTTL time.Duration `koanf:"lease_ttl"`
	// IdleTimeout stops an activation with no due event after this long.
	IdleTimeout time.Duration `koanf:"idle_timeout"`
	// ScanInterval is how often the host looks for runnable sessions and
	// expired leases (the safety net behind in-process and NOTIFY wake-ups).
	ScanInterval time.Duration `koanf:"scan_interval"`
	// TranscriptTail is how many recent messages a TurnRequest carries.
	TranscriptTail int `koanf:"transcript_tail"`
	// ShutdownTimeout bounds how long in-flight turns may finish at stop.
	ShutdownTimeout time.Duration `koanf:"shutdown_timeout"`
}

// Retry configures failed attempts (DESIGN "Failure, retry and crash policy").
type Retry struct {
	// MaxAttempts is the dead-letter threshold (attempts a worker accepted).
	MaxAttempts int `koanf:"max_attempts"`
	// BackoffMin and BackoffMax bound the exponential backoff (5 s … 120 s
	// by default), jittered.
	BackoffMin time.Duration `koanf:"backoff_min"`
	BackoffMax time.Duration `koanf:"backoff_max"`
}

// API configures the HTTP API's limits.
type API struct {
	// MaxBodyBytes caps a JSON request body.
	MaxBodyBytes int64 `koanf:"max_body_bytes"`
	// MaxModuleBytes caps an uploaded wasm module.
	MaxModuleBytes int64 `koanf:"max_module_bytes"`
}

// AgentSpec registers an agent at start from a module file.
type AgentSpec struct {
	Name string `koanf:"name"`
	// ModuleFile is a path to a .wasm file, relative to the working directory.
	ModuleFile  string `koanf:"module_file"`
	CrashPolicy string `koanf:"crash_policy"`
}

// Default returns the built-in defaults.
func Default() Config {
	return Config{
		Listen:  "127.0.0.1:8080",
		DataDir: "./data",
		Log:     Log{Level: "info", Format: "text"},
		Store:   Store{Driver: "sqlite"},
		Wasm: Wasm{
			MemoryLimitPages: 1024, // 64 MiB
			TurnTimeout:      30 * time.Second,
			MaxResultBytes:   1 << 20,
			CompilationCache: true,
		},
		Runtime: Runtime{
			LeaseTTL:        15 * time.Second,
			IdleTimeout:     30 * time.Second,
			ScanInterval:    time.Second,
			TranscriptTail:  20,
			ShutdownTimeout: 10 * time.Second,
		},
		Retry:       Retry{MaxAttempts: 5, BackoffMin: 5 * time.Second, BackoffMax: 120 * time.Second},
		API:         API{MaxBodyBytes: 1 << 20, MaxModuleBytes: 64 << 20},
		CrashPolicy: "restart",
	}
}

// Sources says where configuration comes from. Zero values skip a layer.
type Sources struct {
	// File is a YAML file path ("" = none).
	File string
	// Environ is the environment as KEY=VALUE pairs (nil = none).
	Environ []string
	// Flags are applied when set on the command line; FlagKeys maps a flag
	// name to its config key (e.g. "data-dir" → "data_dir").
	Flags    *pflag.FlagSet
	FlagKeys map[string]string
}

// Load builds the configuration from defaults and sources, strictly, and
// validates it. Errors name the key, the value and the reason.
func Load(src Sources) (Config, error) {
	k := koanf.New(".")
	if err := k.Load(confmap.Provider(toMap(Default()), "."), nil); err != nil {
		return Config{}, fmt.Errorf("config: defaults: %w", err)
	}
	if src.File != "" {
		if _, err := os.Stat(src.File); err != nil {
			return Config{}, fmt.Errorf("config: file %s: %w", src.File, err)
		}
		if err := k.Load(file.Provider(src.File), yaml.Parser()); err != nil {
			return Config{}, fmt.Errorf("config: file %s: %w", src.File, err)
		}
	}
	if src.Environ != nil {
		environ := src.Environ
		err := k.Load(env.Provider(".", env.Opt{
			Prefix:        EnvPrefix,
			EnvironFunc:   func() []string { return environ },
			TransformFunc: envKey,
		}), nil)
		if err != nil {
			return Config{}, fmt.Errorf("config: environment: %w", err)
		}
	}
	if src.Flags != nil {
		err := k.Load(posflag.ProviderWithFlag(src.Flags, ".", k, func(f *pflag.Flag) (string, any) {
			key, ok := src.FlagKeys[f.Name]
			if !ok || !f.Changed {
				return "", nil
			}
			return key, posflag.FlagVal(src.Flags, f)
		}), nil)
		if err != nil {
			return Config{}, fmt.Errorf("config: flags: %w", err)
		}
	}
	if err := checkKeys(k); err != nil {
		return Config{}, err
	}
	var cfg Config
	err := k.UnmarshalWithConf("", &cfg, koanf.UnmarshalConf{
		Tag: "koanf",
		DecoderConfig: &mapstructure.DecoderConfig{
			DecodeHook: mapstructure.ComposeDecodeHookFunc(
				mapstructure.StringToTimeDurationHookFunc(),
				mapstructure.TextUnmarshallerHookFunc(),
			),
			ErrorUnused:      true,
			WeaklyTypedInput: true, // env and flag values arrive as strings
			Result:           &cfg,
			TagName:          "koanf",
		},
	})
	if err != nil {
		return Config{}, decodeErrors(k, err)
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// decodeErrors turns mapstructure's errors into KeyErrors that also show
// the offending value.
func decodeErrors(k *koanf.Koanf, err error) error {
	var out []error
	var walk func(error)
	walk = func(e error) {
		var de *mapstructure.DecodeError
		if errors.As(e, &de) {
			reason := de.Unwrap().Error()
			out = append(out, &KeyError{Key: de.Name(), Value: k.Get(de.Name()), Reason: reason})
			return
		}
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, x := range j.Unwrap() {
				walk(x)
			}
			return
		}
		out = append(out, fmt.Errorf("config: %w", e))
	}
	walk(err)
	return errors.Join(out...)
}

// envKey maps PADDOCK_STORE__DSN to store.dsn; single underscores stay.
func envKey(k, v string) (string, any) {
	k = strings.ToLower(strings.TrimPrefix(k, EnvPrefix))
	return strings.ReplaceAll(k, "__", "."), v
}

// KeyError is a configuration error about one key.
type KeyError struct {
	Key    string
	Value  any
	Reason string
}

func (e *KeyError) Error() string {
	return fmt.Sprintf("config: %s = %v: %s", e.Key, e.Value, e.Reason)
}

// checkKeys refuses keys the Config struct does not have, with the list of
// known keys of the same section.
func checkKeys(k *koanf.Koanf) error {
	known := knownKeys(reflect.TypeOf(Config{}), "")
	var unknown []string
	for _, key := range k.Keys() {
		if !slices.Contains(known, key) && !underList(key, known) {
			unknown = append(unknown, key)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	sort.Strings(unknown)
	return &KeyError{Key: unknown[0], Value: k.Get(unknown[0]), Reason: "unknown key (known keys: " + strings.Join(known, ", ") + ")"}
}

// underList reports whether key is inside a list-valued key (agents), whose
// elements mapstructure checks.
func underList(key string, known []string) bool {
	for _, kk := range known {
		if strings.HasPrefix(key, kk+".") {
			return true
		}
	}
	return false
}

func knownKeys(t reflect.Type, prefix string) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("koanf")
		if tag == "" {
			continue
		}
		if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeOf(time.Duration(0)) {
			out = append(out, knownKeys(f.Type, prefix+tag+".")...)
			continue
		}
		out = append(out, prefix+tag)
	}
	return out
}

// toMap flattens a Config into koanf's key → value map via its tags.
func toMap(c Config) map[string]any {
	out := map[string]any{}
	var walk func(v reflect.Value, prefix string)
	walk = func(v reflect.Value, prefix string) {
		t := v.Type()
		for i := range t.NumField() {
			tag := t.Field(i).Tag.Get("koanf")
			fv := v.Field(i)
			if fv.Kind() == reflect.Struct {
				walk(fv, prefix+tag+".")
				continue
			}
			if fv.Kind() == reflect.Slice && fv.Len() == 0 {
				continue
			}
			out[prefix+tag] = fv.Interface()
		}
	}
	walk(reflect.ValueOf(c), "")
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
	if c.Wasm.TurnTimeout <= 0 {
		bad("wasm.turn_timeout", c.Wasm.TurnTimeout, "must be positive")
	}
	if c.Wasm.MaxResultBytes < 1024 {
		bad("wasm.max_result_bytes", c.Wasm.MaxResultBytes, "must be at least 1024")
	}
	if c.Runtime.LeaseTTL < 100*time.Millisecond {
		bad("runtime.lease_ttl", c.Runtime.LeaseTTL, "must be at least 100ms")
	}
	if c.Runtime.IdleTimeout <= 0 {
		bad("runtime.idle_timeout", c.Runtime.IdleTimeout, "must be positive")
	}
	if c.Runtime.ScanInterval <= 0 {
		bad("runtime.scan_interval", c.Runtime.ScanInterval, "must be positive")
	}
	if c.Runtime.TranscriptTail < 0 || c.Runtime.TranscriptTail > 1000 {
		bad("runtime.transcript_tail", c.Runtime.TranscriptTail, "must be between 0 and 1000")
	}
	if c.Runtime.ShutdownTimeout < 0 {
		bad("runtime.shutdown_timeout", c.Runtime.ShutdownTimeout, "must not be negative")
	}
	if c.Retry.MaxAttempts < 1 {
		bad("retry.max_attempts", c.Retry.MaxAttempts, "must be at least 1")
	}
	if c.Retry.BackoffMin <= 0 {
		bad("retry.backoff_min", c.Retry.BackoffMin, "must be positive")
	}
	if c.Retry.BackoffMax < c.Retry.BackoffMin {
		bad("retry.backoff_max", c.Retry.BackoffMax, "must not be below retry.backoff_min ("+c.Retry.BackoffMin.String()+")")
	}
	if c.API.MaxBodyBytes < 1024 {
		bad("api.max_body_bytes", c.API.MaxBodyBytes, "must be at least 1024")
	}
	if c.API.MaxModuleBytes < 1024 {
		bad("api.max_module_bytes", c.API.MaxModuleBytes, "must be at least 1024")
	}
	if !validPolicy(c.CrashPolicy) {
		bad("crash_policy", c.CrashPolicy, "must be restart, sleep or destroy")
	}
	for i, a := range c.Agents {
		key := fmt.Sprintf("agents[%d]", i)
		if a.Name == "" {
			bad(key+".name", `""`, "must not be empty")
		}
		if a.ModuleFile == "" {
			bad(key+".module_file", `""`, "must not be empty")
		}
		if a.CrashPolicy != "" && !validPolicy(a.CrashPolicy) {
			bad(key+".crash_policy", a.CrashPolicy, "must be restart, sleep or destroy")
		}
	}
	return errors.Join(errs...)
}

func validPolicy(p string) bool { return p == "restart" || p == "sleep" || p == "destroy" }

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
