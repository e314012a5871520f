package config

import (
	"os"
	"path/filepath"
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
	if cfg.Listen != "127.0.0.1:8080" || cfg.Store.Driver != "sqlite" || cfg.Retry.BackoffMin != 5*time.Second || cfg.Retry.BackoffMax != 120*time.Second {
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
runtime:
  idle_timeout: 45s
agents:
  - name: notes
    module_file: notes.wasm
`)
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	fs.String("data-dir", "", "")
	fs.String("listen", "", "")
	if err := fs.Parse([]string{"--data-dir", "/tmp/from-flag"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(Sources{
		File:     file,
		Environ:  []string{"PADDOCK_STORE__DSN=postgres://env", "PADDOCK_DATA_DIR=/tmp/from-env", "PADDOCK_RETRY__MAX_ATTEMPTS=7", "HOME=/root"},
		Flags:    fs,
		FlagKeys: map[string]string{"data-dir": "data_dir", "listen": "listen"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "127.0.0.1:9000" {
		t.Errorf("listen = %q: an unset flag must not override the file", cfg.Listen)
	}
	if cfg.Store.DSN != "postgres://env" || cfg.Retry.MaxAttempts != 7 {
		t.Errorf("env did not override the file: dsn %q attempts %d", cfg.Store.DSN, cfg.Retry.MaxAttempts)
	}
	if cfg.DataDir != "/tmp/from-flag" {
		t.Errorf("data_dir = %q, want the flag's value", cfg.DataDir)
	}
	if cfg.Runtime.IdleTimeout != 45*time.Second || cfg.Runtime.LeaseTTL != 15*time.Second {
		t.Errorf("runtime = %+v: file value or default lost", cfg.Runtime)
	}
	if len(cfg.Agents) != 1 || cfg.Agents[0].Name != "notes" {
		t.Errorf("agents = %+v", cfg.Agents)
	}
}

func TestBadConfigIsRefusedNamingKeyValueAndReason(t *testing.T) {
	cases := []struct {
		name, file string
		environ    []string
		want       []string
	}{
		{"unknown key", "lisen: 127.0.0.1:1\n", nil, []string{"lisen", "unknown key"}},
		{"unknown nested key", "runtime:\n  idle_timout: 3s\n", nil, []string{"runtime.idle_timout", "unknown key"}},
		{"unknown key in a list entry", "agents:\n  - name: a\n    module_file: a.wasm\n    modul: x\n", nil, []string{"modul"}},
		{"bad duration", "runtime:\n  lease_ttl: soon\n", nil, []string{"lease_ttl", "soon"}},
		{"bad driver", "store:\n  driver: mysql\n", nil, []string{"store.driver", "mysql", "sqlite or postgres"}},
		{"postgres without dsn", "store:\n  driver: postgres\n", nil, []string{"store.dsn", "required"}},
		{"backoff bounds reversed", "retry:\n  backoff_min: 10s\n  backoff_max: 1s\n", nil, []string{"retry.backoff_max", "1s"}},
		{"crash policy", "crash_policy: reboot\n", nil, []string{"crash_policy", "reboot"}},
		{"public listen without token", "listen: 0.0.0.0:8080\n", nil, []string{"auth_token", "required"}},
		{"bad env value", "", []string{"PADDOCK_RETRY__MAX_ATTEMPTS=lots"}, []string{"max_attempts", "lots"}},
		{"unknown env key", "", []string{"PADDOCK_NOPE=1"}, []string{"nope", "unknown key"}},
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
