package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	apiclient "github.com/paddock-dev/paddock/host/api/client"
	"github.com/paddock-dev/paddock/plugins/plugintest"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// runWithin runs the CLI against ra and fails the test if it has not
// returned within d (a CLI reading /dev/zero or waiting on a FIFO would
// not return at all).
func runWithin(t *testing.T, ra *realAPI, d time.Duration, args ...string) (string, error) {
	t.Helper()
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := ra.run(context.Background(), args...)
		done <- result{out, err}
	}()
	select {
	case r := <-done:
		return r.out, r.err
	case <-time.After(d):
		t.Fatalf("paddock %s has not returned after %s", strings.Join(args, " "), d)
		return "", nil
	}
}

// mkfifo makes a FIFO in a temporary directory; at the end of the test it
// is opened for writing and closed, which lets a reader blocked on it go.
func mkfifo(t *testing.T, name string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	t.Cleanup(func() {
		if f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	})
	return path
}

// sparse makes a sparse file of size bytes (no disk blocks, nothing to
// read but zeros).
func sparse(t *testing.T, name string, size int64) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestUploadsRefuseFilesTheyCannotStream runs `module upload`, `agent
// create --module FILE.wasm` and `plugin register --path` against the real
// API (module limit 8 MiB) with files the CLI used to read whole into
// memory: /dev/zero and a FIFO fail at once with an error naming the path;
// a sparse file over --max-module-bytes fails before any upload; one under
// it but over the host's limit gets the host's 413; a real module uploads.
func TestUploadsRefuseFilesTheyCannotStream(t *testing.T) {
	const hostLimit = 8 << 20
	ra := startRealAPI(t, hostLimit)
	fifo := mkfifo(t, "fifo.wasm")
	const fast = 20 * time.Second
	for _, args := range [][]string{
		{"module", "upload", "/dev/zero"},
		{"module", "upload", fifo},
		{"agent", "create", "a", "--module", fifo},
		{"agent", "update", "a", "--module", fifo},
		{"plugin", "register", "x", "--path", "/dev/zero"},
		{"plugin", "register", "x", "--path", fifo},
	} {
		_, err := runWithin(t, ra, fast, args...)
		var nr *NotRegularFileError
		path := args[len(args)-1]
		if !errors.As(err, &nr) || nr.Path != path || !strings.Contains(err.Error(), path+" is not a regular file") {
			t.Errorf("paddock %s: %v, want %s is not a regular file", strings.Join(args, " "), err, path)
		}
	}

	big := sparse(t, "big.wasm", defaultMaxModuleBytes()+1)
	_, err := runWithin(t, ra, fast, "module", "upload", big)
	var tl *FileTooLargeError
	if !errors.As(err, &tl) || tl.Path != big || tl.Size != defaultMaxModuleBytes()+1 || tl.Limit != defaultMaxModuleBytes() {
		t.Errorf("module upload of a sparse %d-byte file: %v, want it over the limit of %d", defaultMaxModuleBytes()+1, err, defaultMaxModuleBytes())
	}
	_, err = runWithin(t, ra, fast, "module", "upload", sparse(t, "3k.wasm", 3000), "--max-module-bytes", "2048")
	if !errors.As(err, &tl) || tl.Limit != 2048 {
		t.Errorf("module upload of 3000 bytes with --max-module-bytes 2048: %v", err)
	}
	if n := ra.uploads.Load(); n != 0 {
		t.Errorf("the server got %d uploads of files the CLI should have refused", n)
	}

	// Under the CLI's limit, over the host's: the host's 413 is the final word.
	_, err = runWithin(t, ra, time.Minute, "module", "upload", sparse(t, "16m.wasm", 2*hostLimit))
	if ae := apiclient.AsError(err); ae == nil || ae.Status != 413 || ae.Code != apiclient.CodeBodyTooLarge {
		t.Errorf("module upload of 16 MiB to a host limited to 8 MiB: %v, want 413 body_too_large", err)
	}

	path, wasmBytes := wasmtest.BuildExample(t, wasmtest.Notes)
	if len(wasmBytes) > hostLimit {
		t.Fatalf("the notes module is %d bytes, over the test host's limit", len(wasmBytes))
	}
	out, err := runWithin(t, ra, time.Minute, "module", "upload", path)
	sum := sha256.Sum256(wasmBytes)
	if err != nil || strings.TrimSpace(out) != "sha256:"+hex.EncodeToString(sum[:]) {
		t.Fatalf("module upload %s: %q %v", path, out, err)
	}
	if m, err := ra.api.GetModule(context.Background(), strings.TrimSpace(out)); err != nil || m.Size != int64(len(wasmBytes)) {
		t.Errorf("the uploaded module: %+v %v, want %d bytes", m, err, len(wasmBytes))
	}
}

// TestPluginRegisterHashesTheBinary checks the sha256 that `plugin
// register` computes of a binary, read as a stream: the real API (which
// checks the sum against the file) registers the notes plugin, and the
// registration records the binary's sha256.
func TestPluginRegisterHashesTheBinary(t *testing.T) {
	ctx := context.Background()
	ra := startRealAPI(t, 32<<20)
	bin, built := plugintest.Build(t, plugintest.Notes)
	// The build is cached for the test binary (like paddockBin's) and left
	// in its temporary directory: TestMain is pgtest.Main, which exits, and
	// removing it here would break -count=N.
	content, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(content)
	if built != hex.EncodeToString(sum[:]) {
		t.Fatalf("plugintest says sha256 %s, the file has %x", built, sum)
	}
	if out, err := ra.run(ctx, "plugin", "register", "p", "--path", bin); err != nil || !strings.Contains(out, hex.EncodeToString(sum[:])) {
		t.Fatalf("plugin register: %q %v", out, err)
	}
	if p, err := ra.api.GetPlugin(ctx, "p"); err != nil || p.SHA256 != hex.EncodeToString(sum[:]) || p.Path != bin {
		t.Errorf("registered %+v %v, want sha256 %x", p, err, sum)
	}
}
