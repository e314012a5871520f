package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paddock-dev/paddock/host/api/client"
)

// session is one session the driver sends to.
type session struct {
	name  string // chaos-sNN, also its key
	agent string
	id    string // session_id
	// accepted are its accepted signals in sending order (only this
	// session's sender goroutine appends; read after it ended).
	accepted []acceptedSignal
	// notAccepted counts signals given up on (the run was interrupted or
	// every host refused for too long).
	notAccepted int
}

// acceptedSignal is a signal an API call answered with an event id.
type acceptedSignal struct {
	seq     int
	message string
	eventID int64
	// retries counts API calls beyond the first (connection errors,
	// timeouts, 5xx) before the one that answered.
	retries int
	// created is false when the answer was the idempotent replay of an
	// earlier call that had been accepted without the driver hearing it.
	created bool
}

// api is the driver's client over the hosts: one API client per host, on
// one *http.Client.
type api struct {
	e       *env
	clients map[*host]*client.Client
	mu      sync.Mutex
	rnd     *rand.Rand
}

func newAPI(e *env, seed int64) *api {
	hc := &http.Client{Timeout: e.cfg.HTTPTimeout}
	a := &api{e: e, clients: map[*host]*client.Client{}, rnd: rand.New(rand.NewPCG(uint64(seed), 7))}
	for _, h := range e.hosts {
		a.clients[h] = client.New("http://"+h.addr, client.WithHTTPClient(hc), client.WithUserAgent("paddock-chaos"))
	}
	return a
}

// pick returns a random host believed up (any host when none is), other
// than avoid when it can.
func (a *api) pick(avoid *host) *host {
	var up []*host
	for _, h := range a.e.hosts {
		if h.isUp() && h != avoid {
			up = append(up, h)
		}
	}
	if len(up) == 0 {
		up = a.e.hosts
	}
	return up[a.intN(len(up))]
}

// intN is a random int in [0, n); a's generator is shared by the senders.
func (a *api) intN(n int) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.rnd.IntN(n)
}

// do calls f on a random live host's client, and again on another after a
// connection error, a timeout or a 5xx, until it succeeds (nil), a 4xx
// answer (the *client.Error: retrying the same call cannot help) or ctx's
// end. It returns the retries made.
func (a *api) do(ctx context.Context, f func(*client.Client) error) (int, error) {
	var last *host
	for retries := 0; ; retries++ {
		if err := ctx.Err(); err != nil {
			return retries, err
		}
		h := a.pick(last)
		last = h
		err := f(a.clients[h])
		// A transport error (down, stopped or restarting: another host) or
		// a 5xx (PostgreSQL restarting, most likely) is retried, after a
		// pause so that a moment with every host down does not spin.
		if err == nil || (client.AsError(err) != nil && !client.IsServerError(err)) {
			return retries, err
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(50+a.intN(150)) * time.Millisecond):
		}
	}
}

// createSessions creates the run's sessions by key (get-or-create, so a
// retried call cannot create two), spread round-robin over the agents.
func createSessions(ctx context.Context, e *env) ([]*session, error) {
	a := newAPI(e, e.cfg.Seed+2)
	var out []*session
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for i := range e.cfg.Sessions {
		s := &session{name: fmt.Sprintf("chaos-s%02d", i), agent: agentNames[i%len(agentNames)]}
		var x client.Session
		if _, err := a.do(ctx, func(c *client.Client) (err error) {
			x, err = c.GetOrCreateSession(ctx, s.agent, client.SessionRequest{Key: s.name})
			return err
		}); err != nil {
			return nil, fmt.Errorf("session %s of %s: %w", s.name, s.agent, err)
		}
		if x.SessionID == "" {
			return nil, fmt.Errorf("session %s of %s: no session_id in the answer", s.name, s.agent)
		}
		s.id = x.SessionID
		out = append(out, s)
	}
	return out, nil
}

// driver sends the signals: one sender goroutine per session, in order,
// paced so that they spread over the planned chaos phase.
type driver struct {
	e        *env
	sessions []*session
	api      *api
	seed     int64
	// refused are 4xx answers (each a failure of the run).
	mu      sync.Mutex
	refused []string
	// outOfOrder are accepted signals whose event id is not above the
	// previous one of their session (acceptance order broken).
	outOfOrder []string
}

func newDriver(e *env, sessions []*session, seed int64) *driver {
	return &driver{e: e, sessions: sessions, api: newAPI(e, seed), seed: seed}
}

// run sends every session's share of the signals, spread over planned;
// it returns when all were accepted or ctx ended. A signal still refused
// after planned plus a grace period is given up (counted, and a failure).
func (d *driver) run(ctx context.Context, planned time.Duration) {
	n, k := d.e.cfg.Signals, len(d.sessions)
	sendCtx, cancel := context.WithTimeout(ctx, planned+3*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for i, s := range d.sessions {
		count := n / k
		if i < n%k {
			count++
		}
		gap := planned / time.Duration(count)
		rnd := rand.New(rand.NewPCG(uint64(d.seed), uint64(i)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.sendAll(sendCtx, s, count, gap, rnd)
		}()
	}
	wg.Wait()
}

func (d *driver) sendAll(ctx context.Context, s *session, count int, gap time.Duration, rnd *rand.Rand) {
	next := time.Now().Add(time.Duration(rnd.Int64N(int64(gap) + 1)))
	var lastID int64
	for seq := 1; seq <= count; seq++ {
		if wait := time.Until(next); wait > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
		}
		// Jittered pacing around gap; a slow call does not pile signals up.
		next = time.Now().Add(time.Duration(float64(gap) * (0.5 + rnd.Float64())))
		if ctx.Err() != nil {
			s.notAccepted += count - seq + 1
			return
		}
		text := fmt.Sprintf("%s-%d", s.name, seq)
		msg := "note " + text
		var resp client.SignalResult
		retries, err := d.api.do(ctx, func(c *client.Client) (err error) {
			resp, err = c.SendSignal(ctx, s.agent, s.id, client.Signal{Message: msg, IdempotencyKey: text})
			return err
		})
		if err == nil && resp.EventID <= 0 {
			err = fmt.Errorf("no event_id in the answer")
		}
		if err != nil {
			if ctx.Err() != nil {
				s.notAccepted += count - seq + 1
				return
			}
			d.mu.Lock()
			d.refused = append(d.refused, fmt.Sprintf("session %s signal %q: %v", s.name, msg, err))
			d.mu.Unlock()
			s.notAccepted++
			continue
		}
		if resp.EventID <= lastID {
			d.mu.Lock()
			d.outOfOrder = append(d.outOfOrder, fmt.Sprintf("session %s: signal %q accepted as event %d after event %d", s.name, msg, resp.EventID, lastID))
			d.mu.Unlock()
		}
		lastID = resp.EventID
		s.accepted = append(s.accepted, acceptedSignal{seq: seq, message: msg, eventID: resp.EventID, retries: retries, created: resp.Created})
	}
}

// accepted counts the accepted signals (once run has returned).
func (d *driver) accepted() int {
	n := 0
	for _, s := range d.sessions {
		n += len(s.accepted)
	}
	return n
}

// fileSHA256 is the lowercase hex sha256 of a file.
func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// createDatabase creates a fresh database on the server of rawURL and
// returns its DSN.
func createDatabase(ctx context.Context, rawURL string) (string, error) {
	conn, err := pgx.Connect(ctx, rawURL)
	if err != nil {
		return "", fmt.Errorf("connect to DATABASE_URL: %w", err)
	}
	defer conn.Close(context.Background())
	name := fmt.Sprintf("paddock_chaos_%d", time.Now().UnixNano())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("create database on DATABASE_URL: %w", err)
	}
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return rawURL + " dbname=" + name, nil
	}
	u.Path = "/" + name
	return u.String(), nil
}

// dropDatabase drops the database of dsn on the server of rawURL.
func dropDatabase(rawURL, dsn string) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, rawURL)
	if err != nil {
		return
	}
	defer conn.Close(context.Background())
	_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{cfg.Database}.Sanitize()+" WITH (FORCE)")
}
