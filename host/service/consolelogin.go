package service

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"sync"
	"time"
)

// ConsoleLoginTTL is how long a web console login lasts.
const ConsoleLoginTTL = 12 * time.Hour

// maxConsoleLogins bounds the logins a host keeps (the oldest one goes).
const maxConsoleLogins = 10000

// consoleLogins are the web console's logins: a random id (the browser's
// cookie) standing for a caller until it expires. They live in this
// host's memory: a restart, or another host behind the same address,
// asks the browser to log in again (docs/DESIGN.md "Tokens, roles and the
// audit log").
type consoleLogins struct {
	mu sync.Mutex
	m  map[string]consoleLogin
}

type consoleLogin struct {
	caller  Caller
	expires time.Time
}

func newConsoleLogins() *consoleLogins { return &consoleLogins{m: map[string]consoleLogin{}} }

// ConsoleLogin authenticates token (Authenticate) and starts a console
// login for its caller: it returns the login's id, which the browser keeps
// in a cookie instead of the token, for ConsoleLoginTTL.
func (s *Service) ConsoleLogin(ctx context.Context, token string) (id string, c Caller, err error) {
	c, err = s.Authenticate(ctx, token)
	if err != nil {
		return "", Caller{}, err
	}
	var b [32]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	id = base64.RawURLEncoding.EncodeToString(b[:])
	now := time.Now()
	l := s.logins
	l.mu.Lock()
	defer l.mu.Unlock()
	var oldest string
	for k, v := range l.m {
		if now.After(v.expires) {
			delete(l.m, k)
		} else if oldest == "" || v.expires.Before(l.m[oldest].expires) {
			oldest = k
		}
	}
	if len(l.m) >= maxConsoleLogins {
		delete(l.m, oldest)
	}
	l.m[id] = consoleLogin{caller: c, expires: now.Add(ConsoleLoginTTL)}
	return id, c, nil
}

// ConsoleCaller returns the caller of a console login: on an open host the
// anonymous admin; otherwise the login's caller, re-checked (CheckCaller:
// a token revoked since ends the login). An unknown or expired login is an
// *UnauthenticatedError (counted).
func (s *Service) ConsoleCaller(ctx context.Context, id string) (Caller, error) {
	if s.Open() {
		return s.Authenticate(ctx, "")
	}
	l := s.logins
	l.mu.Lock()
	v, ok := l.m[id]
	if ok && time.Now().After(v.expires) {
		delete(l.m, id)
		ok = false
	}
	l.mu.Unlock()
	if !ok || id == "" {
		s.refused(refusedUnauthenticated)
		return Caller{}, &UnauthenticatedError{Message: "not logged in (or the login expired)"}
	}
	if err := s.CheckCaller(ctx, v.caller); err != nil {
		var un *UnauthenticatedError
		if errors.As(err, &un) {
			s.ConsoleLogout(id)
			s.refused(refusedUnauthenticated)
		}
		return Caller{}, err
	}
	return v.caller, nil
}

// ConsoleLogout ends a console login.
func (s *Service) ConsoleLogout(id string) {
	s.logins.mu.Lock()
	delete(s.logins.m, id)
	s.logins.mu.Unlock()
}
