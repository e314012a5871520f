// Package plugintest builds Paddock plugin workers into real binaries for
// tests, with the go toolchain that runs the tests.
package plugintest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/paddock-dev/paddock/plugins/pluginhost"
)

// Packages of plugin mains, relative to the module root, for Build.
const (
	// Notes is the notes example agent as a plugin.
	Notes = "./examples/notes/plugin"
)

// Package state of this test helper, kept for the life of the test binary
// so that its tests share one build per package.
var (
	builds sync.Map // pkg → *build
	dir    struct {
		once sync.Once
		path string
		err  error
	}
)

type build struct {
	once sync.Once
	path string
	sum  string
	err  error
}

// Build builds the main package pkg — a path relative to the module root
// such as Notes, or a full import path — once per test binary into a
// temporary directory, and returns the binary's path and sha256 (lowercase
// hex). It fails t if the build fails. Treat the file as read-only.
func Build(t testing.TB, pkg string) (path, sha256 string) {
	t.Helper()
	v, _ := builds.LoadOrStore(pkg, &build{})
	b := v.(*build)
	b.once.Do(func() { b.path, b.sum, b.err = goBuild(pkg) })
	if b.err != nil {
		t.Fatalf("plugintest: build %s: %v", pkg, b.err)
	}
	return b.path, b.sum
}

// Dir returns the directory the binaries are built into (created once per
// test binary under os.TempDir()); RemoveAll it from TestMain to clean up.
func Dir() (string, error) {
	dir.once.Do(func() { dir.path, dir.err = os.MkdirTemp("", "paddock-plugintest-") })
	return dir.path, dir.err
}

func goBuild(pkg string) (string, string, error) {
	d, err := Dir()
	if err != nil {
		return "", "", err
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		return "", "", fmt.Errorf("find the go command: %w", err)
	}
	root, err := moduleRoot(gobin)
	if err != nil {
		return "", "", err
	}
	name := strings.NewReplacer("/", "_", ".", "_").Replace(strings.Trim(pkg, "./"))
	out := filepath.Join(d, name)
	cmd := exec.Command(gobin, "build", "-trimpath", "-o", out, pkg)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return "", "", fmt.Errorf("go build %s: %w\n%s", pkg, err, stderr.String())
	}
	sum, err := pluginhost.FileSHA256(out)
	if err != nil {
		return "", "", err
	}
	return out, sum, nil
}

// moduleRoot returns the directory of the main module's go.mod.
func moduleRoot(gobin string) (string, error) {
	out, err := exec.Command(gobin, "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("not inside a Go module")
	}
	return filepath.Dir(gomod), nil
}
