package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/paddock-dev/paddock/store"
)

// Group commit of appends. Concurrent AppendEvent calls (signals to
// different sessions from many API requests) are sent together: one batch
// of appendEventSQL statements in one implicit transaction, one round trip
// and one WAL flush for all of them, instead of one each. There is no
// waiting window: a flusher takes whatever queued while the previous batch
// was in flight, so a lone signal goes out at once and batches grow only
// under load. Every caller still returns only after its own event is
// committed ("durable before 202").
//
// A batch is all or nothing. When a statement in it fails (a deadlock with
// another batch, an idempotency-key race), the transaction rolled back and
// each append runs again on its own; an append that found nothing to do (a
// destroyed session, a used idempotency key) is decided on its own path
// after the batch committed. A connection failure is returned to every
// caller of the batch, unretried: the batch may have committed.

const (
	// groupFlushers is how many batches may be in flight at once.
	groupFlushers = 2
	// groupMax caps the appends in one batch.
	groupMax = 64
)

type appendReq struct {
	ctx  context.Context
	key  store.ActorKey
	ne   newEvent
	done chan appendRes
}

type appendRes struct {
	e       store.Event
	created bool
	// solo: the batch did not decide this append; run it on its own.
	solo bool
	err  error
}

// appendGroup queues appends for the flushers.
type appendGroup struct {
	s     *Store
	queue chan *appendReq
	once  sync.Once
	// stopped is closed when no flusher runs any more (or none started):
	// a request not answered by then never will be.
	stopped chan struct{}
}

func (g *appendGroup) start() {
	g.once.Do(func() {
		g.queue = make(chan *appendReq, 4*groupMax)
		g.stopped = make(chan struct{})
		g.s.mu.Lock()
		defer g.s.mu.Unlock()
		if g.s.isClosed {
			close(g.stopped)
			return // appends then fail with "store closed"
		}
		var flushers sync.WaitGroup
		for range groupFlushers {
			g.s.subs.Add(1)
			flushers.Add(1)
			go func() {
				defer g.s.subs.Done()
				defer flushers.Done()
				g.flushLoop()
			}()
		}
		go func() { flushers.Wait(); close(g.stopped) }()
	})
}

// append queues one append and waits for its batch.
func (g *appendGroup) append(ctx context.Context, key store.ActorKey, ne newEvent) appendRes {
	g.start()
	r := &appendReq{ctx: ctx, key: key, ne: ne, done: make(chan appendRes, 1)}
	select {
	case g.queue <- r:
	case <-ctx.Done():
		return appendRes{err: ctx.Err()}
	case <-g.s.closedCtx.Done():
		return appendRes{err: errors.New("store closed")}
	}
	select {
	case res := <-r.done:
		return res
	case <-ctx.Done():
		// The append may still commit; like a single statement whose
		// caller gave up, its outcome is unknown to the caller.
		return appendRes{err: ctx.Err()}
	case <-g.stopped:
		// Every flusher has returned (the store closed): r was answered
		// or never will be.
		select {
		case res := <-r.done:
			return res
		default:
			return appendRes{err: errors.New("store closed")}
		}
	}
}

func (g *appendGroup) flushLoop() {
	for {
		var first *appendReq
		select {
		case first = <-g.queue:
		case <-g.s.closedCtx.Done():
			return
		}
		batch := []*appendReq{first}
	more:
		for len(batch) < groupMax {
			select {
			case r := <-g.queue:
				batch = append(batch, r)
			default:
				break more
			}
		}
		g.flush(batch)
	}
}

// flush sends one batch and answers its callers.
func (g *appendGroup) flush(batch []*appendReq) {
	live := batch[:0:0]
	for _, r := range batch {
		if r.ctx.Err() != nil {
			r.done <- appendRes{err: r.ctx.Err()}
			continue
		}
		live = append(live, r)
	}
	if len(live) == 0 {
		return
	}
	// One lock order for every batch (sessions sorted), so that two
	// batches in flight cannot deadlock on each other's session rows; a
	// session's own appends keep their arrival order (stable sort).
	slices.SortStableFunc(live, func(a, b *appendReq) int {
		return cmp.Or(strings.Compare(a.key.AgentUID, b.key.AgentUID), strings.Compare(a.key.SessionID, b.key.SessionID))
	})
	ctx, cancel := withDeadline(context.WithoutCancel(live[0].ctx), g.s.callTimeout)
	defer cancel()
	res := make([]appendRes, len(live))
	b := &pgx.Batch{}
	for i, r := range live {
		b.Queue(appendEventSQL, insertEventArgs(r.key, r.ne)...).QueryRow(func(row pgx.Row) error {
			e, created, err := insertResult(scanEvent(row))
			res[i] = appendRes{e: e, created: created, solo: err == nil && !created, err: err}
			return err
		})
	}
	err := g.s.pool.SendBatch(ctx, b).Close()
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
	case errors.As(err, &pgErr):
		// The server refused a statement (a deadlock with another batch,
		// an idempotency-key race): the implicit transaction rolled back,
		// so nothing of the batch was written. Each append goes alone.
		for i := range res {
			res[i] = appendRes{solo: true}
		}
	default:
		for i := range res {
			res[i] = appendRes{err: fmt.Errorf("group commit of %d appends: %w", len(live), err)}
		}
	}
	for i, r := range live {
		r.done <- res[i]
	}
}
