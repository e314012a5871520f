package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// cluster is the throwaway PostgreSQL cluster the run owns: it is the only
// kind of server the run can restart (pg_ctl needs the data directory).
//
// It runs as the postgres OS user when this process is root (PostgreSQL
// refuses to run as root), lives in a temporary directory (on /dev/shm when
// it has room), and is stopped and removed by stop — or, if this process
// dies first, by a reaper shell that waits for EOF on a pipe only this
// process holds open (the store/pgtest design).
//
// Durability settings: fsync and full_page_writes are off (no OS crash is
// simulated, and a killed server's writes are in the kernel's page cache),
// but synchronous_commit stays on: with it off, an immediate restart would
// lose commits the hosts were told were durable, and the checker would
// report losses that are the test set-up's, not Paddock's.
type cluster struct {
	bindir string
	dir    string
	port   int
	owner  *osUser
	// reaperIn is the write end of the reaper's stdin (see above).
	reaperIn *os.File
	reaper   *exec.Cmd
}

// osUser is the account the cluster runs as.
type osUser struct {
	uid, gid int
}

func (c *cluster) dataDir() string { return filepath.Join(c.dir, "data") }
func (c *cluster) logFile() string { return filepath.Join(c.dir, "postgres.log") }

// dsn is the URL of database db, over TCP as the superuser.
func (c *cluster) dsn(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, db)
}

// startCluster runs initdb and pg_ctl start in a new temporary directory
// and creates database db.
func startCluster(ctx context.Context, bindir, db string) (_ *cluster, err error) {
	if bindir == "" {
		if bindir, err = findBinDir(); err != nil {
			return nil, err
		}
	}
	owner, err := clusterOwner()
	if err != nil {
		return nil, err
	}
	base := os.TempDir()
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() && fi.Mode().Perm()&0o002 != 0 && freeBytes("/dev/shm") >= 1<<30 {
		base = "/dev/shm"
	}
	dir, err := os.MkdirTemp(base, "paddock-chaos-pg-")
	if err != nil {
		return nil, fmt.Errorf("cluster dir: %w", err)
	}
	c := &cluster{bindir: bindir, dir: dir, owner: owner}
	defer func() {
		if err != nil {
			_ = c.stop()
		}
	}()
	if owner != nil {
		if err := os.Chown(dir, owner.uid, owner.gid); err != nil {
			return nil, fmt.Errorf("chown cluster dir: %w", err)
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			return nil, err
		}
	}
	if err := c.startReaper(); err != nil {
		return nil, err
	}
	if out, err := c.command(ctx, "initdb", "-D", c.dataDir(), "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--locale=C", "--no-sync").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	for attempt := 1; ; attempt++ {
		if c.port, err = freePort(); err != nil {
			return nil, err
		}
		if err = c.pgctl(ctx, "start"); err == nil {
			break
		}
		if attempt == 3 || !strings.Contains(c.logTail(), "could not bind") {
			return nil, err
		}
	}
	conn, err := pgx.Connect(ctx, c.dsn("postgres"))
	if err != nil {
		return nil, fmt.Errorf("connect to the cluster: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize()); err != nil {
		return nil, fmt.Errorf("create database: %w", err)
	}
	return c, nil
}

// serverOpts are the postgres options of every start and restart.
func (c *cluster) serverOpts() string {
	return strings.Join([]string{
		"-p", strconv.Itoa(c.port), "-h", "127.0.0.1", "-k", c.dir,
		"-c", "fsync=off", "-c", "full_page_writes=off",
		"-c", "max_connections=300", "-c", "shared_buffers=64MB",
	}, " ")
}

// pgctl runs pg_ctl start or restart (restart in immediate mode: the
// server's processes die at once, as in a crash, and it recovers from WAL).
func (c *cluster) pgctl(ctx context.Context, action string, extra ...string) error {
	args := []string{action, "-D", c.dataDir(), "-l", c.logFile(), "-w", "-t", "60", "-o", c.serverOpts()}
	out, err := c.command(ctx, "pg_ctl", append(args, extra...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl %s: %w\n%s\nserver log:\n%s", action, err, out, c.logTail())
	}
	return nil
}

// restart restarts the server: mode is fast or immediate.
func (c *cluster) restart(ctx context.Context, mode string) error {
	return c.pgctl(ctx, "restart", "-m", mode)
}

// stop stops the server, removes its directory and lets the reaper go.
func (c *cluster) stop() error {
	var errs []error
	if _, err := os.Stat(filepath.Join(c.dataDir(), "postmaster.pid")); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 70*time.Second)
		out, err := c.command(ctx, "pg_ctl", "stop", "-D", c.dataDir(), "-m", "immediate", "-w", "-t", "60").CombinedOutput()
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("pg_ctl stop: %w\n%s", err, out))
		}
	}
	if err := os.RemoveAll(c.dir); err != nil {
		errs = append(errs, err)
	}
	if c.reaper != nil {
		_ = c.reaperIn.Close()
		done := make(chan struct{})
		go func() { _ = c.reaper.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			errs = append(errs, fmt.Errorf("cluster reaper (pid %d) did not finish", c.reaper.Process.Pid))
		}
		c.reaper = nil
	}
	return errors.Join(errs...)
}

// reaperScript stops the cluster and removes its directory once its stdin
// reaches EOF ($1 = bindir, $2 = dir). It ignores terminal signals.
const reaperScript = `trap '' HUP INT QUIT TERM
cat >/dev/null
if [ -f "$2/data/postmaster.pid" ]; then
	"$1/pg_ctl" stop -D "$2/data" -m immediate -w -t 30 >/dev/null 2>&1
fi
rm -rf "$2"
`

func (c *cluster) startReaper() error {
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd := exec.Command("/bin/sh", "-c", reaperScript, "paddock-chaos-pg-reaper", c.bindir, c.dir)
	cmd.Stdin = r
	cmd.Dir = "/"
	cmd.SysProcAttr = c.procAttr()
	if err := cmd.Start(); err != nil {
		_ = r.Close()
		_ = w.Close()
		return fmt.Errorf("start the cluster reaper: %w", err)
	}
	_ = r.Close()
	c.reaper, c.reaperIn = cmd, w
	return nil
}

// procAttr runs a child as the cluster owner, in its own process group (a
// terminal ^C reaches this program, which then stops the cluster in order).
func (c *cluster) procAttr() *syscall.SysProcAttr {
	attr := &syscall.SysProcAttr{Setpgid: true}
	if c.owner != nil {
		attr.Credential = &syscall.Credential{Uid: uint32(c.owner.uid), Gid: uint32(c.owner.gid)}
	}
	return attr
}

func (c *cluster) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bindir, name), args...)
	cmd.Dir = c.dir
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "LC_") || strings.HasPrefix(kv, "LANG=") {
			continue
		}
		env = append(env, kv)
	}
	cmd.Env = append(env, "LC_ALL=C")
	cmd.SysProcAttr = c.procAttr()
	return cmd
}

// logTail is the end of the server log.
func (c *cluster) logTail() string {
	b, err := os.ReadFile(c.logFile())
	if err != nil {
		return "(no server log)"
	}
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	return string(b)
}

// findBinDir locates initdb and pg_ctl: pg_config --bindir, then the newest
// /usr/lib/postgresql/<v>/bin, then PATH.
func findBinDir() (string, error) {
	has := func(dir string) bool {
		for _, n := range []string{"initdb", "pg_ctl"} {
			if fi, err := os.Stat(filepath.Join(dir, n)); err != nil || fi.IsDir() {
				return false
			}
		}
		return true
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil && has(strings.TrimSpace(string(out))) {
		return strings.TrimSpace(string(out)), nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	ver := func(d string) float64 { v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(d)), 64); return v }
	sort.Slice(dirs, func(i, j int) bool { return ver(dirs[i]) > ver(dirs[j]) })
	for _, d := range dirs {
		if has(d) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil && has(filepath.Dir(p)) {
		return filepath.Dir(p), nil
	}
	return "", errors.New("no PostgreSQL server binaries (initdb, pg_ctl) found: install them (apt-get install postgresql), pass -pg-bin, or set DATABASE_URL (then PostgreSQL is not restarted)")
}

// clusterOwner is nil when the cluster can run as this user, else the
// postgres OS user (this process is root).
func clusterOwner() (*osUser, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, PostgreSQL must run as the postgres OS user, which was not found: %w", err)
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("user postgres has a non-numeric uid/gid %q/%q", u.Uid, u.Gid)
	}
	return &osUser{uid: uid, gid: gid}, nil
}

func freeBytes(dir string) uint64 {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0
	}
	return st.Bavail * uint64(st.Bsize)
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
