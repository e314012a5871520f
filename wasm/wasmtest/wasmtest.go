// Package wasmtest builds Paddock's example agents into real wasm modules
// for tests, with the go toolchain that runs the tests.
package wasmtest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// Packages of wasip1 mains for BuildExample: the example agents, the
// hostile module of the host's sandbox suite and the host-call guest of
// the wasm package's tests (testdata packages: go builds them when named,
// and ./... patterns skip them).
const (
	Notes     = "./examples/notes/cmd"
	Faulty    = "./examples/faulty/cmd"
	Hostile   = "./host/testdata/hostile"
	CallGuest = "./wasm/testdata/callguest"
)

// Package state of this test helper, kept for the life of the test binary
// so that its tests share one build per package and one cache directory.
var (
	builds   sync.Map // pkg → *build
	cacheDir struct {
		once sync.Once
		path string
		err  error
	}
)

type build struct {
	once  sync.Once
	path  string
	bytes []byte
	err   error
}

// BuildExample builds the wasip1 main package pkg — a path relative to the
// module root such as Notes, or a full import path — as a reactor
// (GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -trimpath) once per
// test binary, and returns the module's path and bytes. It fails t if the
// build fails. The file lives under os.TempDir()/paddock-wasmtest, replaced
// atomically, so parallel test binaries can share it; treat it as read-only.
func BuildExample(t testing.TB, pkg string) (path string, wasm []byte) {
	t.Helper()
	v, _ := builds.LoadOrStore(pkg, &build{})
	b := v.(*build)
	b.once.Do(func() { b.path, b.bytes, b.err = goBuild(pkg) })
	if b.err != nil {
		t.Fatalf("wasmtest: build %s: %v", pkg, b.err)
	}
	return b.path, b.bytes
}

// CacheDir returns a wazero compilation cache directory shared by every test
// binary of the module on this machine, under os.TempDir(), and kept
// between runs: only the first test run compiles the examples cold (which
// takes a minute or more per module under -race). The directory is keyed by
// the wazero version in go.mod and GOARCH, because wazero keys its own cache
// entries by version "dev" inside test binaries. It fails t if go.mod
// cannot be read.
func CacheDir(t testing.TB) string {
	t.Helper()
	cacheDir.once.Do(func() {
		gobin, err := exec.LookPath("go")
		if err != nil {
			cacheDir.err = fmt.Errorf("find the go command: %w", err)
			return
		}
		root, err := moduleRoot(gobin)
		if err != nil {
			cacheDir.err = err
			return
		}
		cmd := exec.Command(gobin, "list", "-m", "-f", "{{.Version}}", "github.com/tetratelabs/wazero")
		cmd.Dir = root
		out, err := cmd.Output()
		if err != nil {
			cacheDir.err = fmt.Errorf("go list -m github.com/tetratelabs/wazero: %w", err)
			return
		}
		version := strings.TrimSpace(string(out))
		cacheDir.path = filepath.Join(os.TempDir(), "paddock-wasmtest", "wazero-"+version+"-"+runtime.GOARCH)
		cacheDir.err = os.MkdirAll(cacheDir.path, 0o755)
	})
	if cacheDir.err != nil {
		t.Fatalf("wasmtest: cache dir: %v", cacheDir.err)
	}
	return cacheDir.path
}

func goBuild(pkg string) (string, []byte, error) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		return "", nil, fmt.Errorf("find the go command: %w", err)
	}
	root, err := moduleRoot(gobin)
	if err != nil {
		return "", nil, err
	}
	key := sha256.Sum256([]byte(root + "\x00" + pkg))
	name := strings.NewReplacer("/", "_", ".", "_").Replace(strings.Trim(pkg, "./"))
	dir := filepath.Join(os.TempDir(), "paddock-wasmtest")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", nil, fmt.Errorf("cache dir: %w", err)
	}
	final := filepath.Join(dir, fmt.Sprintf("%s-%s.wasm", name, hex.EncodeToString(key[:6])))
	tmp, err := os.CreateTemp(dir, name+"-*.tmp")
	if err != nil {
		return "", nil, fmt.Errorf("temp file: %w", err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name())

	cmd := exec.Command(gobin, "build", "-buildmode=c-shared", "-trimpath", "-o", tmp.Name(), pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", nil, fmt.Errorf("%s: %w\n%s", strings.Join(cmd.Args, " "), err, out.String())
	}
	wasm, err := os.ReadFile(tmp.Name())
	if err != nil {
		return "", nil, fmt.Errorf("read module: %w", err)
	}
	if err := os.Rename(tmp.Name(), final); err != nil {
		return "", nil, fmt.Errorf("publish module: %w", err)
	}
	return final, wasm, nil
}

// moduleRoot finds the directory of the main module's go.mod.
func moduleRoot(gobin string) (string, error) {
	out, err := exec.Command(gobin, "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("not inside a Go module (go env GOMOD = %q)", gomod)
	}
	return filepath.Dir(gomod), nil
}
