package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paddock-dev/paddock/store"
)

// Subscribe timings.
const (
	// listenIdle is how long the listener waits for a notification before
	// it pings, to notice a half-open connection.
	listenIdle = 30 * time.Second
	// reconnectMin and reconnectMax bound the listener's reconnect backoff.
	reconnectMin = 100 * time.Millisecond
	reconnectMax = 5 * time.Second
	// subscribeBuffer is the capacity of a subscription's channel.
	subscribeBuffer = 64
)

// Subscribe returns a channel of actor keys that received events, from
// every host sharing the database: LISTEN paddock_events on a connection of
// its own, outside the pool (a pooled connection would return to the pool
// and run transactions, during which notifications are held back). When
// Subscribe returns, the listener is registered, so an event appended after
// it is seen. A lost connection is re-established with backoff;
// notifications sent meanwhile are lost, which is why this is a wake-up hint
// only (RunnableSessions is the truth). The channel closes when ctx ends or
// the store is closed. A slow reader delays the listener, not the writers:
// PostgreSQL queues the notifications.
func (s *Store) Subscribe(ctx context.Context) (<-chan store.ActorKey, error) {
	return subscribe(ctx, s, func(w store.Wakeup) store.ActorKey { return w.Key })
}

// SubscribeEchoes is Subscribe with each hint's EchoSeq: the seq of the
// event when the notification's origin tag is this Store value's (its own
// AppendEvent or Steer), else 0; see store.EchoSubscriber.
func (s *Store) SubscribeEchoes(ctx context.Context) (<-chan store.Wakeup, error) {
	return subscribe(ctx, s, func(w store.Wakeup) store.Wakeup { return w })
}

// subscribe runs Subscribe's listener, sending as(hint) for each
// notification.
func subscribe[T any](ctx context.Context, s *Store, as func(store.Wakeup) T) (<-chan T, error) {
	// Register with Close before doing anything, so that Close waits for
	// this subscription or Subscribe sees the store closed.
	s.mu.Lock()
	if s.isClosed {
		s.mu.Unlock()
		return nil, errors.New("store/postgres: subscribe: store closed")
	}
	s.subs.Add(1)
	s.mu.Unlock()
	cctx, cancel := withDeadline(ctx, s.callTimeout)
	conn, err := s.listen(cctx)
	cancel()
	if err != nil {
		s.subs.Done()
		return nil, fmt.Errorf("store/postgres: subscribe: %w", err)
	}
	ctx, stop := context.WithCancel(ctx)
	ch := make(chan T, subscribeBuffer)
	go func() {
		defer s.subs.Done()
		defer close(ch)
		defer stop()
		// End with the store too.
		unregister := context.AfterFunc(s.closedCtx, stop)
		defer unregister()
		s.listenLoop(ctx, conn, func(w store.Wakeup) {
			select {
			case ch <- as(w):
			case <-ctx.Done():
			}
		})
	}()
	return ch, nil
}

// listen opens a dedicated connection and LISTENs on the events channel.
func (s *Store) listen(ctx context.Context) (*pgx.Conn, error) {
	// A fresh copy per connection: pgx installs its notification buffer
	// only when OnNotification is nil (jackc/pgx#618).
	conn, err := pgx.ConnectConfig(ctx, s.listenCfg.Copy())
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{notifyChannel}.Sanitize()); err != nil {
		closeConn(conn)
		return nil, err
	}
	return conn, nil
}

// listenLoop forwards notifications to send until ctx ends, reconnecting
// when the connection fails. It owns conn.
func (s *Store) listenLoop(ctx context.Context, conn *pgx.Conn, send func(store.Wakeup)) {
	defer func() {
		if conn != nil {
			closeConn(conn)
		}
	}()
	backoff := reconnectMin
	for ctx.Err() == nil {
		if conn == nil {
			cctx, cancel := context.WithTimeout(ctx, s.callTimeout)
			c, err := s.listen(cctx)
			cancel()
			if err != nil {
				select {
				case <-time.After(backoff):
				case <-ctx.Done():
				}
				backoff = min(2*backoff, reconnectMax)
				continue
			}
			conn, backoff = c, reconnectMin
		}
		wctx, cancel := context.WithTimeout(ctx, listenIdle)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
			w, ok := s.parseWakeup(n.Payload)
			if !ok {
				continue
			}
			send(w)
		case ctx.Err() != nil:
			return
		case errors.Is(err, context.DeadlineExceeded) && !conn.IsClosed():
			// Idle: check the connection is still there.
			pctx, cancel := context.WithTimeout(ctx, s.callTimeout)
			err = conn.Ping(pctx)
			cancel()
			if err != nil {
				closeConn(conn)
				conn = nil
			}
		default:
			closeConn(conn)
			conn = nil
		}
	}
}

// parseWakeup reads a notification payload: "agent_uid/session_id", or
// "origin:seq:agent_uid/session_id" from AppendEvent and Steer (an agent
// uid has no ':'). EchoSeq is seq when origin is this Store value's.
func (s *Store) parseWakeup(payload string) (store.Wakeup, bool) {
	agent, session, ok := strings.Cut(payload, "/")
	if !ok || agent == "" || session == "" {
		return store.Wakeup{}, false
	}
	var w store.Wakeup
	if tag, uid, tagged := cutLast(agent, ":"); tagged {
		origin, seq, ok := strings.Cut(tag, ":")
		if !ok || uid == "" {
			return store.Wakeup{}, false
		}
		if origin == s.origin {
			n, err := strconv.ParseInt(seq, 10, 64)
			if err != nil || n <= 0 {
				return store.Wakeup{}, false
			}
			w.EchoSeq = n
		}
		agent = uid
	}
	w.Key = store.ActorKey{AgentUID: agent, SessionID: session}
	return w, true
}

// cutLast is strings.Cut at the last sep.
func cutLast(s, sep string) (before, after string, found bool) {
	if i := strings.LastIndex(s, sep); i >= 0 {
		return s[:i], s[i+len(sep):], true
	}
	return s, "", false
}

// closeConn closes a listener connection under a short deadline.
func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}
