// Package pgtest gives tests a fresh PostgreSQL database each.
//
// DSN(t) creates a new database for the calling test and drops it when the
// test ends. The server is either the one named by DATABASE_URL (any database
// on it the role may connect to; the role needs CREATEDB), or, when
// DATABASE_URL is unset, one throwaway cluster per test binary, started on
// first use from the installed server binaries (initdb and pg_ctl, found with
// `pg_config --bindir` or under /usr/lib/postgresql/*/bin) in a temporary
// directory on a free port of 127.0.0.1.
//
// A test binary that uses the throwaway cluster calls Main from TestMain:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
// Main stops the cluster and removes its directory after the tests. A
// binary that dies before Main returns (a panicking test, a -timeout, a
// signal) is covered too: a small reaper process started with the cluster
// holds the read end of a pipe whose write end only this process has; when
// the process ends, however it ends, the kernel closes the pipe and the
// reaper stops the cluster and deletes the directory.
//
// Without server binaries and without DATABASE_URL, DSN fails the test with
// instructions; it never skips, so a missing PostgreSQL cannot pass silently.
//
// Why: the postgres driver's correctness lives in SQL (row locks, partial
// unique indexes, clock_timestamp()), so its tests must run against a real
// server, never a mock.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// EnvDatabaseURL names the environment variable that points the harness at
// an existing server instead of a throwaway cluster.
const EnvDatabaseURL = "DATABASE_URL"

// Timeouts of the harness.
const (
	// startTimeout bounds initdb plus pg_ctl start.
	startTimeout = 2 * time.Minute
	// pgCtlWaitSeconds is pg_ctl's own -t for start and stop.
	pgCtlWaitSeconds = 60
	// createTimeout bounds CREATE DATABASE and DROP DATABASE.
	createTimeout = time.Minute
	// reaperWait bounds how long Main waits for the reaper to finish.
	reaperWait = 30 * time.Second
)

// installHelp is appended to every "no server" failure.
const installHelp = `PostgreSQL server binaries are required for these tests; they never skip.
Either install them, e.g.
    apt-get install postgresql          (Debian/Ubuntu; binaries land in /usr/lib/postgresql/<v>/bin)
    dnf install postgresql-server       (Fedora/RHEL)
    brew install postgresql             (macOS)
or point the tests at a running server (the role needs CREATEDB):
    DATABASE_URL=postgres://user:pass@host:5432/postgres?sslmode=disable go test ./...`

// shared is the one harness of this test binary. It is the package's only
// mutable state, by necessity: the cluster is started once per binary
// (sync.Once) and stopped by Main.
var shared = &harness{}

// harness is the per-binary state: the server in use and an admin pool on
// its maintenance database.
type harness struct {
	once sync.Once
	err  error

	// dsnFor turns a database name into a DSN for that database.
	dsnFor func(db string) string
	admin  *pgxpool.Pool
	// cluster is the throwaway cluster, nil with DATABASE_URL.
	cluster *cluster
	seq     atomic.Int64
}

// Main runs the tests of m, then stops the throwaway cluster (if one was
// started) and removes its directory, and exits with the tests' status. Call
// it from TestMain. When the tests failed it prints the tail of the server
// log to stderr first.
func Main(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	code := m.Run()
	if err := shared.shutdown(code != 0); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// DSN creates a fresh, empty database for t and returns a connection string
// for it (URL form for the throwaway cluster). The database is dropped when t
// ends (connections still open are terminated). It fails t, with install
// instructions, when no server can be had.
func DSN(t testing.TB) string {
	t.Helper()
	h := shared
	h.once.Do(h.setup)
	if h.err != nil {
		t.Fatalf("pgtest: %v", h.err)
	}
	name := dbName(t.Name(), h.seq.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), createTimeout)
	defer cancel()
	if _, err := h.admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("pgtest: create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), createTimeout)
		defer cancel()
		// WITH (FORCE) (PostgreSQL 13+) terminates sessions a test left open.
		if _, err := h.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})
	return h.dsnFor(name)
}

// setup picks the server (DATABASE_URL or a new cluster) and opens the admin
// pool. It runs once; its error fails every DSN call.
func (h *harness) setup() {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if raw := os.Getenv(EnvDatabaseURL); raw != "" {
		h.err = h.useServer(ctx, raw)
		return
	}
	c, err := startCluster(ctx)
	if err != nil {
		h.err = err
		return
	}
	h.cluster = c
	h.dsnFor = c.dsn
	h.admin, err = openAdmin(ctx, c.dsn("postgres"))
	if err != nil {
		h.err = fmt.Errorf("connect to the throwaway cluster: %w\n%s", err, c.logTail())
	}
}

// useServer points the harness at the server of DATABASE_URL.
func (h *harness) useServer(ctx context.Context, raw string) error {
	if _, err := pgx.ParseConfig(raw); err != nil {
		return fmt.Errorf("%s is not a valid connection string: %w", EnvDatabaseURL, err)
	}
	h.dsnFor = func(db string) string { return withDatabase(raw, db) }
	admin, err := openAdmin(ctx, raw)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", EnvDatabaseURL, err)
	}
	h.admin = admin
	return nil
}

// shutdown closes the admin pool and stops and removes the cluster.
func (h *harness) shutdown(failed bool) error {
	if h.admin != nil {
		h.admin.Close()
	}
	if h.cluster == nil {
		return nil
	}
	if failed {
		fmt.Fprintf(os.Stderr, "pgtest: tests failed; tail of the server log %s:\n%s\n", h.cluster.logFile(), h.cluster.logTail())
		if d := h.cluster.deadlockReports(); d != "" {
			// A test that counts deadlocks fails long before the tail:
			// which statements and locks each involved.
			fmt.Fprintf(os.Stderr, "pgtest: deadlocks the server reported:\n%s\n", d)
		}
	}
	return h.cluster.stop()
}

func openAdmin(ctx context.Context, dsn string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// withDatabase returns dsn (URL or keyword/value form) naming database db.
func withDatabase(dsn, db string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		if u, err := url.Parse(dsn); err == nil {
			u.Path = "/" + db
			u.RawPath = ""
			return u.String()
		}
	}
	// In keyword/value form a later keyword overrides an earlier one.
	return dsn + " dbname=" + db
}

// dbName makes a valid, unique database name (at most 63 bytes) from a test
// name: "pgt_<sanitized test name>_<seq>_<random>".
func dbName(test string, seq int64) string {
	var b strings.Builder
	for _, r := range strings.ToLower(test) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	s := b.String()
	if len(s) > 36 {
		s = s[len(s)-36:]
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	return fmt.Sprintf("pgt_%s_%d_%s", s, seq, hex.EncodeToString(rnd[:]))
}

// cluster is a throwaway PostgreSQL cluster.
type cluster struct {
	bindir string
	dir    string // temp dir: data/, postgres.log, the socket
	port   int
	// owner runs initdb, pg_ctl and the reaper (the postgres OS user when
	// this process is root, else nil = this user).
	owner *osUser
	// reaperIn is the write end of the reaper's stdin; closing it (or this
	// process ending) makes the reaper stop the cluster and delete dir.
	// Referenced here so that it is never garbage-collected (and closed).
	reaperIn *os.File
	reaper   *exec.Cmd
}

func (c *cluster) dataDir() string { return filepath.Join(c.dir, "data") }
func (c *cluster) logFile() string { return filepath.Join(c.dir, "postgres.log") }

// dsn is the URL of database db on the cluster, over TCP as the superuser.
func (c *cluster) dsn(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, db)
}

// startCluster runs initdb and pg_ctl start in a new temp dir.
func startCluster(ctx context.Context) (_ *cluster, err error) {
	bindir, err := findBinDir()
	if err != nil {
		return nil, err
	}
	owner, err := clusterOwner()
	if err != nil {
		return nil, err
	}
	base := clusterBase(owner)
	dir, err := os.MkdirTemp(base, "paddock-pgtest-")
	if err != nil {
		return nil, fmt.Errorf("create cluster dir: %w", err)
	}
	c := &cluster{bindir: bindir, dir: dir, owner: owner}
	defer func() {
		if err != nil {
			_ = c.stop()
		}
	}()
	if owner != nil {
		if err := os.Chown(dir, owner.uid, owner.gid); err != nil {
			return nil, fmt.Errorf("chown cluster dir to %s: %w", owner.name, err)
		}
	}
	if err := c.startReaper(); err != nil {
		return nil, err
	}
	out, err := c.command(ctx, "initdb", "-D", c.dataDir(), "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--locale=C", "--no-sync").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	// A free port can be taken between probing and binding: retry a few times.
	for attempt := 1; ; attempt++ {
		c.port, err = freePort()
		if err != nil {
			return nil, err
		}
		err = c.start(ctx)
		if err == nil {
			return c, nil
		}
		if attempt == 3 || ctx.Err() != nil || !strings.Contains(c.logTail(), "could not bind") {
			return nil, err
		}
	}
}

// start runs pg_ctl start on c.port and waits until the server accepts
// connections.
func (c *cluster) start(ctx context.Context) error {
	opts := strings.Join([]string{
		"-p", strconv.Itoa(c.port),
		"-h", "127.0.0.1",
		"-k", c.dir,
		// A throwaway cluster needs no durability; tests get speed.
		"-c", "fsync=off",
		"-c", "synchronous_commit=off",
		"-c", "full_page_writes=off",
		"-c", "max_connections=500",
		"-c", "shared_buffers=64MB",
	}, " ")
	out, err := c.command(ctx, "pg_ctl", "start", "-D", c.dataDir(), "-l", c.logFile(),
		"-w", "-t", strconv.Itoa(pgCtlWaitSeconds), "-o", opts).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl start: %w\n%s\nserver log %s:\n%s", err, out, c.logFile(), c.logTail())
	}
	return nil
}

// stop stops the server (immediate mode: the data is thrown away), removes
// the directory and lets the reaper finish.
func (c *cluster) stop() error {
	var errs []error
	if _, err := os.Stat(filepath.Join(c.dataDir(), "postmaster.pid")); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), (pgCtlWaitSeconds+10)*time.Second)
		out, err := c.command(ctx, "pg_ctl", "stop", "-D", c.dataDir(), "-m", "immediate",
			"-w", "-t", strconv.Itoa(pgCtlWaitSeconds)).CombinedOutput()
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("pg_ctl stop: %w\n%s", err, out))
		}
	}
	if err := os.RemoveAll(c.dir); err != nil {
		errs = append(errs, fmt.Errorf("remove cluster dir: %w", err))
	}
	if c.reaper != nil {
		_ = c.reaperIn.Close()
		done := make(chan error, 1)
		go func() { done <- c.reaper.Wait() }()
		select {
		case <-done:
		case <-time.After(reaperWait):
			errs = append(errs, fmt.Errorf("reaper (pid %d) did not finish in %s", c.reaper.Process.Pid, reaperWait))
		}
		c.reaper = nil
	}
	return errors.Join(errs...)
}

// reaperScript waits for EOF on stdin (this process closed the pipe or
// ended), then stops the cluster and removes its directory. $1 = bindir,
// $2 = dir. It ignores terminal signals so that a ^C aimed at the test run
// does not kill it before it cleans up.
const reaperScript = `trap '' HUP INT QUIT TERM
cat >/dev/null
if [ -f "$2/data/postmaster.pid" ]; then
	"$1/pg_ctl" stop -D "$2/data" -m immediate -w -t 30 >/dev/null 2>&1
fi
rm -rf "$2"
`

// startReaper starts the reaper process (see the package doc).
func (c *cluster) startReaper() error {
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("reaper pipe: %w", err)
	}
	cmd := exec.Command("/bin/sh", "-c", reaperScript, "pgtest-reaper", c.bindir, c.dir)
	cmd.Stdin = r // stdout and stderr: /dev/null, so go test never waits on it
	cmd.Dir = "/"
	cmd.SysProcAttr = sysProcAttr(c.owner, true)
	if err := cmd.Start(); err != nil {
		_ = r.Close()
		_ = w.Close()
		return fmt.Errorf("start reaper: %w", err)
	}
	_ = r.Close()
	c.reaper = cmd
	c.reaperIn = w // O_CLOEXEC: no other child inherits it
	return nil
}

// command builds an exec.Cmd for a server binary, run as c.owner.
func (c *cluster) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bindir, name), args...)
	cmd.Dir = c.dir
	cmd.Env = serverEnv()
	cmd.SysProcAttr = sysProcAttr(c.owner, false)
	return cmd
}

// serverEnv is this process's environment without libpq/server variables
// (PGDATA, PGPORT, PGHOST...) that would redirect the server binaries, and
// with the C locale.
func serverEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "LC_") || strings.HasPrefix(kv, "LANG=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "LC_ALL=C")
}

// logTail returns the last 4 KiB of the server log.
func (c *cluster) logTail() string {
	b, err := os.ReadFile(c.logFile())
	if err != nil {
		return "(no server log: " + err.Error() + ")"
	}
	const n = 4096
	if len(b) > n {
		b = b[len(b)-n:]
		if i := strings.IndexByte(string(b), '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(b)
}

// deadlockReports returns each "deadlock detected" report of the server
// log — its ERROR line and the lines after it (DETAIL names the processes
// and the locks they waited for, CONTEXT and STATEMENT the statement) —
// or "" when there is none.
func (c *cluster) deadlockReports() string {
	b, err := os.ReadFile(c.logFile())
	if err != nil {
		return ""
	}
	var out []string
	lines := strings.Split(string(b), "\n")
	for i, l := range lines {
		if strings.Contains(l, "deadlock detected") && strings.Contains(l, "ERROR:") {
			out = append(out, lines[i:min(i+16, len(lines))]...)
			out = append(out, "---")
		}
	}
	return strings.Join(out, "\n")
}

// findBinDir locates the directory holding initdb and pg_ctl: pg_config
// --bindir first, then the newest /usr/lib/postgresql/<v>/bin, then PATH.
func findBinDir() (string, error) {
	return searchBinDir("pg_config", "/usr/lib/postgresql/*/bin")
}

// searchBinDir is findBinDir with the pg_config command and the glob of
// versioned bin directories as parameters.
func searchBinDir(pgConfig, versionGlob string) (string, error) {
	has := func(dir string) bool {
		for _, name := range []string{"initdb", "pg_ctl"} {
			if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.IsDir() {
				return false
			}
		}
		return true
	}
	var tried []string
	if out, err := exec.Command(pgConfig, "--bindir").Output(); err == nil {
		dir := strings.TrimSpace(string(out))
		if has(dir) {
			return dir, nil
		}
		tried = append(tried, dir+" (pg_config --bindir)")
	} else {
		tried = append(tried, "pg_config --bindir ("+err.Error()+")")
	}
	dirs, _ := filepath.Glob(versionGlob)
	sort.Slice(dirs, func(i, j int) bool { return pgVersion(dirs[i]) > pgVersion(dirs[j]) })
	for _, dir := range dirs {
		if has(dir) {
			return dir, nil
		}
	}
	tried = append(tried, versionGlob)
	if p, err := exec.LookPath("initdb"); err == nil && has(filepath.Dir(p)) {
		return filepath.Dir(p), nil
	}
	tried = append(tried, "$PATH")
	return "", fmt.Errorf("no PostgreSQL server binaries (initdb, pg_ctl) found; looked in %s and %s is unset.\n%s",
		strings.Join(tried, ", "), EnvDatabaseURL, installHelp)
}

// pgVersion extracts <v> from /usr/lib/postgresql/<v>/bin for sorting.
func pgVersion(bindir string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(bindir)), 64)
	return v
}

// osUser is the OS account the cluster runs as.
type osUser struct {
	name     string
	uid, gid int
}

// clusterOwner returns nil when the cluster can run as this user, or the
// postgres OS user when this process is root (PostgreSQL refuses to run as
// root).
func clusterOwner() (*osUser, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, PostgreSQL must run as another OS user, and user %q was not found (%v); create it (useradd -r postgres), run the tests as a non-root user, or set %s.\n%s",
			"postgres", err, EnvDatabaseURL, installHelp)
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("user postgres has a non-numeric uid/gid %q/%q", u.Uid, u.Gid)
	}
	return &osUser{name: u.Username, uid: uid, gid: gid}, nil
}

// EnvTmpDir names the environment variable that chooses where the
// throwaway cluster lives (default: /dev/shm when it has room, else the
// system temp dir).
const EnvTmpDir = "PGTEST_TMPDIR"

// shmMinFree is the free space /dev/shm needs for the cluster to go there.
const shmMinFree = 1 << 30

// clusterBase picks the parent directory of the cluster: $PGTEST_TMPDIR,
// else a memory file system (/dev/shm: CREATE DATABASE is several times
// faster there than on a disk, fsync=off notwithstanding) when it has
// shmMinFree bytes free, else os.TempDir(). A root process needs a parent the
// postgres user can reach; /tmp is the fallback.
func clusterBase(owner *osUser) string {
	if dir := os.Getenv(EnvTmpDir); dir != "" {
		return dir
	}
	base := os.TempDir()
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() && fi.Mode().Perm()&0o002 != 0 &&
		freeBytes("/dev/shm") >= shmMinFree {
		base = "/dev/shm"
	}
	if owner != nil && !worldSearchable(base) {
		base = "/tmp"
	}
	return base
}

// worldSearchable reports whether every directory from dir up to / can be
// traversed by other users (so that the postgres user can reach dir).
func worldSearchable(dir string) bool {
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil || fi.Mode().Perm()&0o001 == 0 {
			return false
		}
		if d == filepath.Dir(d) {
			return true
		}
	}
}

// freePort asks the kernel for a free TCP port on 127.0.0.1.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
