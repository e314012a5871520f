package main

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A SQLite file serves one host: a second `paddock serve` on the same data
// dir is refused at start, naming the file and the holder, and after kill
// -9 of the first a new host starts on the file at once (the kernel drops
// the lock with the process).
func TestSecondServeOnOneSQLiteFileIsRefused(t *testing.T) {
	addr1 := freePort(t)
	cfg1 := writeConfig(t, "sqlite", addr1)
	first := startServer(t, cfg1, addr1)

	// The same configuration (same data_dir, so the same SQLite file) on
	// another port.
	addr2 := freePort(t)
	b, err := os.ReadFile(cfg1)
	if err != nil {
		t.Fatal(err)
	}
	cfg2 := filepath.Join(t.TempDir(), "paddock.yaml")
	if err := os.WriteFile(cfg2, bytes.Replace(b, []byte("listen: "+addr1), []byte("listen: "+addr2), 1), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd := exec.Command(paddockBin(t), "serve", "--config", cfg2)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	refused := false
	for !refused {
		select {
		case err := <-done:
			if err == nil {
				t.Fatalf("second paddock serve exited 0:\n%s", out.String())
			}
			refused = true
		default:
			if resp, err := http.Get("http://" + addr2 + "/healthz"); err == nil {
				resp.Body.Close()
				_ = cmd.Process.Kill()
				<-done
				t.Fatalf("a second paddock serve started on the first one's SQLite file")
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	msg := out.String()
	db := filepath.Join(filepath.Dir(strings.TrimSuffix(cfg1, "paddock.yaml")), "data", "paddock.db")
	for _, want := range []string{db, fmt.Sprintf("pid %d", first.cmd.Process.Pid), "PostgreSQL"} {
		if !strings.Contains(msg, want) {
			t.Errorf("refusal does not name %q:\n%s", want, msg)
		}
	}

	first.kill9()
	startServer(t, cfg2, addr2) // fails the test unless it becomes healthy
}
