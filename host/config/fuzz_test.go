package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/v2"
)

// FuzzLoad fuzzes the YAML text given to Load. Properties: no panic or
// hang; a refusal names what is wrong — every error it joins is a
// *KeyError with a key and a reason, or the file's own parse error
// ("config: file …"); an accepted configuration validates, loads the same
// again, and holds the scalar values the text gave its keys.
func FuzzLoad(f *testing.F) {
	example, err := os.ReadFile("../../examples/paddock.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(example)
	for _, s := range []string{
		"", "listen: 127.0.0.1:9090\n", "listen: 0.0.0.0:80\n", "listen: 0.0.0.0:80\nauth_token: t\n",
		"policy:\n  crash_policy: explode\n", "policy:\n  backoff_min: 10s\n  backoff_max: 1s\n", "policy:\n  turn_timeout: -1s\n",
		"pools:\n  default:\n    capacity: -3\n", "agents:\n  - name: x\n    bogus: 1\n", "agents: 5\n", "store: [1, 2]\n",
		"unknown_key: 1\n", "wasm:\n  memory_limit_pages: 999999999\n", "listen: [\n", "\t- :\n", "a: &a [*a]\n",
		"fabric:\n  workers:\n    - id: w1\n      key_file: /dev/zero\n",
		"fabric:\n  workers:\n    - id: w1\n      key_file: /dev/stdin\n",
		"plugins:\n  - name: p\n    path: /bin/true\n    sha256_file: /dev/zero\n",
		"fabric:\n  workers:\n    - id: w1\n      key: AAAA\n", "policy:\n  max_attempts: 1e400\n", "log:\n  level: loud\n",
	} {
		f.Add([]byte(s))
	}
	path := filepath.Join(f.TempDir(), "paddock.yaml")
	f.Fuzz(func(t *testing.T, text []byte) {
		if err := os.WriteFile(path, text, 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := Load(Sources{File: path})
		if err != nil {
			for _, e := range leaves(err) {
				var ke *KeyError
				switch {
				case errors.As(e, &ke):
					if ke.Key == "" || ke.Reason == "" {
						t.Fatalf("a KeyError without key or reason: %#v", ke)
					}
				case strings.HasPrefix(e.Error(), "config: file "+path+": "):
					// The YAML itself does not parse (or is not a map).
				default:
					t.Fatalf("error %q (%T) names no key", e, e)
				}
			}
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("a loaded configuration does not validate: %v", err)
		}
		again, err := Load(Sources{File: path})
		if err != nil || !reflect.DeepEqual(cfg, again) {
			t.Fatalf("loading the same text again gave %+v, %v", again, err)
		}
		// The scalar strings the text set are the configuration's.
		k := koanf.New(".")
		if k.Load(rawText(text), yaml.Parser()) != nil {
			t.Fatal("Load accepted text the YAML parser refuses")
		}
		for _, key := range knownKeys(reflect.TypeOf(Config{}), "") {
			v, ok := k.Get(key).(string)
			if !ok {
				continue
			}
			fv, ok := field(reflect.ValueOf(cfg), key)
			if ok && fv.Kind() == reflect.String && fv.String() != v {
				t.Fatalf("%s: the text says %q, the configuration %q", key, v, fv.String())
			}
		}
	})
}

// rawText is a koanf provider of YAML text in memory.
type rawText []byte

func (r rawText) ReadBytes() ([]byte, error)    { return r, nil }
func (r rawText) Read() (map[string]any, error) { return nil, errors.New("rawText: use ReadBytes") }

// leaves flattens joined and wrapped-joined errors.
func leaves(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, leaves(e)...)
		}
		return out
	}
	return []error{err}
}

// field finds the struct field of a dotted koanf key.
func field(v reflect.Value, key string) (reflect.Value, bool) {
	for _, part := range strings.Split(key, ".") {
		if v.Kind() != reflect.Struct {
			return v, false
		}
		found := false
		for i := range v.NumField() {
			if tag, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("koanf"), ","); tag == part {
				v, found = v.Field(i), true
				break
			}
		}
		if !found {
			return v, false
		}
	}
	return v, true
}
