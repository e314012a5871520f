package sqlite

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// ErrInUse is returned (wrapped in an *InUseError) by Open when another
// process holds the database file: a SQLite store serves one host.
var ErrInUse = errors.New("store/sqlite: database file in use by another process")

// InUseError says which process holds the database file Open was asked for.
type InUseError struct {
	// Path is the database file.
	Path string
	// LockPath is the lock file beside it, held with flock(2).
	LockPath string
	// Holder describes the holding process as it wrote itself into the
	// lock file ("pid 1234 on host x"), or "" when it could not be read.
	Holder string
}

// Error names the file and its holder.
func (e *InUseError) Error() string {
	holder := e.Holder
	if holder == "" {
		holder = "another process"
	}
	return fmt.Sprintf("store/sqlite: %s is in use by %s (lock %s): a SQLite database serves one host; stop that host, or share a PostgreSQL store between hosts",
		e.Path, holder, e.LockPath)
}

// Unwrap returns ErrInUse.
func (e *InUseError) Unwrap() error { return ErrInUse }

// fileLock is the exclusive advisory lock of one database file, held for
// the Store's life. The kernel releases it when the process dies, however
// it dies, so a host restarted after kill -9 opens the file at once.
type fileLock struct{ f *os.File }

// lockPath is the lock file of the database at path.
func lockPath(path string) string { return path + ".lock" }

// dbPath returns the file system path of dsnOrPath (a path or a file: URI).
func dbPath(dsnOrPath string) (string, error) {
	rest, ok := strings.CutPrefix(dsnOrPath, "file:")
	if !ok {
		return dsnOrPath, nil
	}
	p, _, _ := strings.Cut(rest, "?")
	p, err := url.PathUnescape(p)
	if err != nil {
		return "", fmt.Errorf("parse dsn path: %w", err)
	}
	return p, nil
}

// lockFile takes the exclusive lock of the database at path without
// waiting: a held lock fails with an *InUseError.
func lockFile(path string) (*fileLock, error) {
	lp := lockPath(path)
	f, err := os.OpenFile(lp, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock file: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder := ""
		if b, rerr := os.ReadFile(lp); rerr == nil {
			holder = strings.TrimSpace(string(b))
		}
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, &InUseError{Path: path, LockPath: lp, Holder: holder}
		}
		return nil, fmt.Errorf("lock %s: %w", lp, err)
	}
	host, _ := os.Hostname()
	who := "pid " + strconv.Itoa(os.Getpid())
	if host != "" {
		who += " on " + host
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(who+"\n"), 0)
	}
	return &fileLock{f: f}, nil
}

// release drops the lock. The lock file stays: removing it would let a
// process that opened it before the removal lock a file no one else sees.
func (l *fileLock) release() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}
