package api_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/api"
	"github.com/paddock-dev/paddock/store/postgres"
)

const pgBin = "/usr/lib/postgresql/15/bin"

// ownCluster is a PostgreSQL cluster of this test's own, which it stops
// and starts (the shared pgtest cluster must stay up).
type ownCluster struct {
	t         *testing.T
	dir, port string
	cred      *syscall.Credential
}

func (c *ownCluster) run(name string, args ...string) {
	c.t.Helper()
	cmd := exec.Command(filepath.Join(pgBin, name), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Setpgid: true}
	if out, err := cmd.CombinedOutput(); err != nil {
		c.t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

func (c *ownCluster) start() {
	c.run("pg_ctl", "start", "-w", "-D", filepath.Join(c.dir, "data"), "-l", filepath.Join(c.dir, "log"),
		"-o", "-p "+c.port+" -h 127.0.0.1 -k "+c.dir+" -c fsync=off")
}

func (c *ownCluster) stop() {
	c.run("pg_ctl", "stop", "-w", "-m", "fast", "-D", filepath.Join(c.dir, "data"))
}

func newOwnCluster(t *testing.T) *ownCluster {
	if _, err := os.Stat(filepath.Join(pgBin, "initdb")); err != nil {
		t.Skipf("no PostgreSQL binaries: %v", err)
	}
	c := &ownCluster{t: t, dir: t.TempDir()}
	if os.Geteuid() == 0 { // PostgreSQL refuses to run as root
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Skipf("running as root without a postgres user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		for _, d := range []string{filepath.Dir(c.dir), c.dir} {
			if err := os.Chown(d, uid, gid); err != nil {
				t.Fatal(err)
			}
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c.port = strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	c.run("initdb", "-D", filepath.Join(c.dir, "data"), "-U", "postgres", "-A", "trust", "--no-sync")
	c.start()
	t.Cleanup(func() {
		cmd := exec.Command(filepath.Join(pgBin, "pg_ctl"), "stop", "-m", "immediate", "-D", filepath.Join(c.dir, "data"))
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
		_ = cmd.Run()
	})
	return c
}

// TestAStoppedStoreIsNotReadyAndEveryRouteSays503: /healthz is liveness
// and stays 200; /readyz and every /v1 route answer 503 store_unavailable
// while PostgreSQL is stopped, and /readyz 200 again once it is back.
func TestAStoppedStoreIsNotReadyAndEveryRouteSays503(t *testing.T) {
	t.Parallel()
	c := newOwnCluster(t)
	ctx := context.Background()
	st, err := postgres.Open(ctx, fmt.Sprintf("postgres://postgres@127.0.0.1:%s/postgres?sslmode=disable", c.port))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	h, err := host.New(host.Options{Store: st, Runner: noRunner{}, Policy: host.DefaultPolicy(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.New(api.Options{Host: h, Modules: fuzzModules{}, MaxBodyBytes: 4096, MaxModuleBytes: 1 << 20, Logger: quiet}))
	defer srv.Close()
	e := &env{t: t, st: st, url: srv.URL}
	if code, b := e.json("GET", "/readyz", ""); code != 200 || b["status"] != "ok" {
		t.Fatalf("/readyz with the store up: %d %v", code, b)
	}
	c.stop()
	if code, b := e.json("GET", "/healthz", ""); code != 200 {
		t.Errorf("/healthz with the store stopped: %d %v, want 200 (liveness)", code, b)
	}
	for _, r := range [][2]string{{"GET", "/readyz"}, {"GET", "/v1/agents"}, {"GET", "/v1/modules"}, {"GET", "/v1/agents/a/sessions/s"},
		{"POST", "/v1/agents"}} {
		body := ""
		if r[0] == "POST" {
			body = `{"name":"a","module":"sha256:00"}`
		}
		code, b := e.json(r[0], r[1], body)
		if c, _, _ := errorOf(b); code != 503 || c != "store_unavailable" {
			t.Errorf("%s %s with the store stopped: %d %v, want 503 store_unavailable", r[0], r[1], code, b)
		}
	}
	c.start()
	if code, b := e.json("GET", "/readyz", ""); code != 200 {
		t.Errorf("/readyz with the store back: %d %v, want 200", code, b)
	}
}
