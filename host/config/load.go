package config

// Reading the layers: defaults, file, environment and flags merged by
// koanf, every key checked against Config's, and decoded strictly.

import (
	"errors"
	"fmt"
	"math"
	"os"
	"reflect"
	"regexp"
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
				strictNumbers,
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

// strictNumbers refuses what WeaklyTypedInput would turn into another
// value without a word (found in review; the same values from the
// environment were refused): a bare number for a duration (YAML's 30
// became 30 ns), a number with a fraction for an integer (2.5 became 2),
// and an integer outside its key's type (4294968320 pages became 1024, -1
// became 4294967295).
func strictNumbers(from, to reflect.Type, data any) (any, error) {
	v := reflect.ValueOf(data)
	if !v.IsValid() || from == to {
		return data, nil // the defaults, typed already
	}
	var f float64
	switch from.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		f = float64(v.Int())
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		f = float64(v.Uint())
	case reflect.Float32, reflect.Float64:
		f = v.Float()
	default:
		return data, nil
	}
	if to == reflect.TypeFor[time.Duration]() {
		if f == 0 {
			return time.Duration(0), nil // 0 needs no unit (promote_after's "off", an approval that waits for ever)
		}
		return nil, fmt.Errorf("%v is a bare number: a duration needs its unit, such as 30s, 500ms or 2m", data)
	}
	var lo, hi float64
	switch to.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		bits := to.Bits()
		lo, hi = -math.Pow(2, float64(bits-1)), math.Pow(2, float64(bits-1))-1
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		lo, hi = 0, math.Pow(2, float64(to.Bits()))-1
	default:
		return data, nil
	}
	if f != math.Trunc(f) {
		return nil, fmt.Errorf("%v is not a whole number", data)
	}
	if f < lo || f > hi {
		return nil, fmt.Errorf("%v is out of range (%.0f to %.0f)", data, lo, hi)
	}
	return data, nil
}

// valueAt is the value at mapstructure's name of a key: a map's entry
// (pools[default].capacity) is koanf's pools.default.capacity; inside a
// list (agents[0].name) koanf has no path, and the value is not shown.
func valueAt(k *koanf.Koanf, name string) any {
	path := mapEntryRE.ReplaceAllString(name, ".$1")
	if strings.Contains(path, "[") {
		return "…"
	}
	return k.Get(path)
}

// mapEntryRE matches a map entry's key in mapstructure's names: [default],
// not a list index such as [0].
var mapEntryRE = regexp.MustCompile(`\[([^\]0-9][^\]]*)\]`)

// decodeErrors turns mapstructure's errors into KeyErrors that also show
// the offending value.
func decodeErrors(k *koanf.Koanf, err error) error {
	var out []error
	var walk func(error)
	walk = func(e error) {
		var de *mapstructure.DecodeError
		if errors.As(e, &de) {
			reason := de.Unwrap().Error()
			if keys, ok := strings.CutPrefix(reason, "has invalid keys: "); ok {
				// An unknown key inside a list entry (agents[i]) or a map.
				out = append(out, &KeyError{Key: de.Name() + "." + keys, Value: "…", Reason: "unknown key"})
				return
			}
			if sensitiveKey(de.Name()) {
				// The decoder's reason quotes the value.
				reason = "a value of the wrong type (not shown: the key may hold a secret)"
			}
			out = append(out, &KeyError{Key: de.Name(), Value: valueAt(k, de.Name()), Reason: reason})
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

// ClientEnv are the PADDOCK_ variables of the client commands; the host's
// configuration ignores them (every other PADDOCK_ variable must be a
// configuration key).
var ClientEnv = []string{"PADDOCK_SERVER", "PADDOCK_TOKEN", "PADDOCK_NAMESPACE"}

// envKey maps PADDOCK_STORE__DSN to store.dsn; single underscores stay.
func envKey(k, v string) (string, any) {
	if slices.Contains(ClientEnv, k) {
		return "", nil
	}
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
	var v any = e.Value
	if sensitiveKey(e.Key) {
		v = "…"
	}
	return fmt.Sprintf("config: %s = %v: %s", e.Key, v, e.Reason)
}

// sensitiveKey reports whether a key's value may be a secret, which an
// error never shows (docs/DESIGN.md invariant 13): the API token, the
// secrets key, a store DSN (its password), and a plugin's environment.
func sensitiveKey(key string) bool {
	last := key[strings.LastIndex(key, ".")+1:]
	switch last {
	case "auth_token", "secrets_key", "dsn":
		return true
	}
	return strings.Contains(key, ".env.") || strings.HasSuffix(key, ".env") || strings.HasPrefix(key, "tracing.headers")
}

// checkKeys refuses keys the Config struct does not have: one *KeyError
// per unknown key, joined, the last followed by the list of known keys.
func checkKeys(k *koanf.Koanf) error {
	known := knownKeys(reflect.TypeOf(Config{}), "")
	var unknown []string
	var sections []error
	for _, key := range k.Keys() {
		if slices.Contains(known, key) || underList(key, known) {
			continue
		}
		if k.Get(key) == nil && slices.ContainsFunc(known, func(kk string) bool { return strings.HasPrefix(kk, key+".") }) {
			// "policy:" with nothing under it (YAML's null) is a section
			// left empty, not an unknown key (found in review).
			sections = append(sections, &KeyError{Key: key, Value: "null", Reason: "a section with no keys: give it keys or leave it out"})
			continue
		}
		unknown = append(unknown, key)
	}
	if len(unknown) == 0 {
		return errors.Join(sections...)
	}
	sort.Strings(unknown)
	errs := make([]error, 0, len(unknown))
	for i, key := range unknown {
		reason := "unknown key"
		if i == len(unknown)-1 {
			// The known keys once, after the last unknown one.
			reason += " (known keys: " + strings.Join(known, ", ") + ")"
		}
		// Not the value: an unknown key may be a secret that only looks
		// like configuration (PADDOCK_OPENAI_KEY=sk-… in the environment).
		errs = append(errs, &KeyError{Key: key, Value: "…", Reason: reason})
	}
	return errors.Join(append(sections, errs...)...)
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
			if fv.Kind() == reflect.Map {
				for _, mk := range fv.MapKeys() {
					walk(fv.MapIndex(mk), prefix+tag+"."+mk.String()+".")
				}
				continue
			}
			out[prefix+tag] = fv.Interface()
		}
	}
	walk(reflect.ValueOf(c), "")
	return out
}
