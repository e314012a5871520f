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
// Audit rows ride in the same batches (AppendAudit): every mutating API
// call appends one before its answer is released (docs/DESIGN.md "Tokens,
// roles and the audit log"), a signal's right after its event, so
// concurrent signals' events and audit rows share round trips and WAL
// flushes, each caller still answered only once its row committed. An
// audit row locks no row (it sorts first, with the zero key); one the
// server refuses (a NUL byte) rolls its batch back like a failed append.
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

// group is the machinery of a group commit: callers queue requests
// (do); groupFlushers flushers each take what queued while the previous
// batch was in flight, up to groupMax, and flush it as one batch, which
// answers every request of it. In is a request's input, Out its answer.
type group[In, Out any] struct {
	s     *Store
	queue chan *groupReq[In, Out]
	once  sync.Once
	// stopped is closed when no flusher runs any more (or none started):
	// a request not answered by then never will be.
	stopped chan struct{}
	// flush sends a batch and answers each request on its done channel.
	flush func(batch []*groupReq[In, Out])
	// failed is the answer to a request that failed before its batch: its
	// context ended, or the store closed.
	failed func(err error) Out
}

// groupReq is one request of a group: its caller's context, its input
// and where its answer goes.
type groupReq[In, Out any] struct {
	ctx  context.Context
	in   In
	done chan Out
}

func (g *group[In, Out]) start() {
	g.once.Do(func() {
		g.queue = make(chan *groupReq[In, Out], 4*groupMax)
		g.stopped = make(chan struct{})
		g.s.mu.Lock()
		defer g.s.mu.Unlock()
		if g.s.isClosed {
			close(g.stopped)
			return // requests then fail with "store closed"
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

// do queues one request and waits for its batch.
func (g *group[In, Out]) do(ctx context.Context, in In) Out {
	g.start()
	r := &groupReq[In, Out]{ctx: ctx, in: in, done: make(chan Out, 1)}
	select {
	case g.queue <- r:
	case <-ctx.Done():
		return g.failed(ctx.Err())
	case <-g.s.closedCtx.Done():
		return g.failed(errors.New("store closed"))
	}
	select {
	case res := <-r.done:
		return res
	case <-ctx.Done():
		// The request may still commit; like a single statement whose
		// caller gave up, its outcome is unknown to the caller.
		return g.failed(ctx.Err())
	case <-g.stopped:
		// Every flusher has returned (the store closed): r was answered
		// or never will be.
		select {
		case res := <-r.done:
			return res
		default:
			return g.failed(errors.New("store closed"))
		}
	}
}

func (g *group[In, Out]) flushLoop() {
	for {
		var first *groupReq[In, Out]
		select {
		case first = <-g.queue:
		case <-g.s.closedCtx.Done():
			return
		}
		batch := []*groupReq[In, Out]{first}
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

// live answers the requests of batch whose caller gave up and returns the
// others, sorted by session (key of each) with a session's own requests
// in arrival order: one lock order for every batch, so that two batches
// in flight cannot deadlock on each other's rows.
func live[In, Out any](g *group[In, Out], batch []*groupReq[In, Out], key func(In) store.ActorKey) []*groupReq[In, Out] {
	out := batch[:0:0]
	for _, r := range batch {
		if r.ctx.Err() != nil {
			r.done <- g.failed(r.ctx.Err())
			continue
		}
		out = append(out, r)
	}
	slices.SortStableFunc(out, func(a, b *groupReq[In, Out]) int {
		ka, kb := key(a.in), key(b.in)
		return cmp.Or(strings.Compare(ka.AgentUID, kb.AgentUID), strings.Compare(ka.SessionID, kb.SessionID))
	})
	return out
}

// sendGroup sends b, the statements of n requests, as one implicit
// transaction under the deadline of the batch's first request. solo: the
// server refused a statement (a deadlock with another batch, a check that
// raised), so the transaction rolled back and nothing of the batch was
// written — each request then runs on its own path. Any other error
// (the connection) is the batch's: it may have committed.
func (s *Store) sendGroup(first context.Context, b *pgx.Batch, n int, what string) (solo bool, err error) {
	ctx, cancel := withDeadline(context.WithoutCancel(first), s.callTimeout)
	defer cancel()
	err = s.pool.SendBatch(ctx, b).Close()
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return false, nil
	case errors.As(err, &pgErr):
		return true, nil
	}
	return false, fmt.Errorf("group commit of %d %s: %w", n, what, err)
}

// appendIn is an append of the group (appendGroup): an event, or an
// audit row when audit is set.
type appendIn struct {
	key store.ActorKey
	ne  newEvent
	// audit, when set, is an audit row to insert instead (AppendAudit).
	audit *store.AppendAuditParams
}

type appendRes struct {
	e       store.Event
	created bool
	// row is an audit row's, as inserted.
	row store.AuditEntry
	// solo: the batch did not decide this append; run it on its own.
	solo bool
	err  error
}

// appendGroup is the group commit of appends.
type appendGroup = group[appendIn, appendRes]

// newAppendGroup returns s's group commit of appends.
func newAppendGroup(s *Store) *appendGroup {
	g := &appendGroup{s: s, failed: func(err error) appendRes { return appendRes{err: err} }}
	g.flush = func(batch []*groupReq[appendIn, appendRes]) { flushAppends(g, batch) }
	return g
}

// flushAppends sends one batch of appends and answers its callers.
func flushAppends(g *appendGroup, batch []*groupReq[appendIn, appendRes]) {
	reqs := live(g, batch, func(in appendIn) store.ActorKey { return in.key })
	if len(reqs) == 0 {
		return
	}
	res := make([]appendRes, len(reqs))
	b := &pgx.Batch{}
	for i, r := range reqs {
		if r.in.audit != nil {
			b.Queue(insertAuditSQL, auditArgs(*r.in.audit)...).QueryRow(func(row pgx.Row) error {
				var err error
				res[i].row, err = scanAudit(row)
				return err
			})
			continue
		}
		b.Queue(appendEventSQL, insertEventArgs(r.in.key, r.in.ne)...).QueryRow(func(row pgx.Row) error {
			e, created, err := insertResult(scanEvent(row))
			res[i] = appendRes{e: e, created: created, solo: err == nil && !created, err: err}
			return err
		})
	}
	solo, err := g.s.sendGroup(reqs[0].ctx, b, len(reqs), "appends")
	for i, r := range reqs {
		switch {
		case solo:
			// An idempotency-key race, a deadlock, a refused audit row:
			// each append goes alone.
			res[i] = appendRes{solo: true}
		case err != nil:
			res[i] = appendRes{err: err}
		}
		r.done <- res[i]
	}
}

// Group commit of turn commits. Concurrent CommitTurn calls of different
// sessions that carry their payloads and open no wait (the common commit:
// its fence and writes are one batch already) go out together in one
// implicit transaction, as appends do, sorted by session: one round trip
// and one WAL flush for all. A commit's fence raises inside the database
// when it refuses, which rolls the whole batch back; every commit of such
// a batch then runs on its own path, where a refusal is explained and a
// lock race reruns. One session's refusal thus never undoes another's
// commit; it costs the others one more try.

// commitIn is a commit of the group (commitGroup).
type commitIn struct {
	p      store.CommitTurnParams
	alarms store.AlarmWrites
	next   *store.NextDeliveryParams
}

type commitRes struct {
	t store.Turn
	// solo: the batch rolled back; run the commit on its own.
	solo bool
	err  error
}

// commitGroup is the group commit of turn commits.
type commitGroup = group[commitIn, commitRes]

// newCommitGroup returns s's group commit of turn commits.
func newCommitGroup(s *Store) *commitGroup {
	g := &commitGroup{s: s, failed: func(err error) commitRes { return commitRes{err: err} }}
	g.flush = func(batch []*groupReq[commitIn, commitRes]) { flushCommits(g, batch) }
	return g
}

// flushCommits sends one batch of commits and answers their callers.
func flushCommits(g *commitGroup, batch []*groupReq[commitIn, commitRes]) {
	flushQueued(g, batch, "turn commits", func(in commitIn) store.ActorKey { return store.KeyOf(in.p.Ref) },
		func(b *pgx.Batch, in commitIn) *queuedCommit {
			return queueCommit(b, in.p, in.p.Payloads, true, in.alarms, in.next)
		},
		func(q *queuedCommit) commitRes { return commitRes{t: q.turn()} }, commitRes{solo: true})
}

// Group commit of dispatches: concurrent one-statement claims
// (NextDelivery with an expectation, queueClaim) of different sessions go
// out together in one implicit transaction, sorted by session, as appends
// and commits do. A claim that takes nothing answers no row; one that
// raises (a lock race) rolls its batch back, and every claim of it then
// runs on its own.

// claimRes is a claim's answer from its batch.
type claimRes struct {
	d     store.Dispatch
	taken bool
	// solo: the batch rolled back; run the claim on its own.
	solo bool
	err  error
}

// claimGroup is the group commit of dispatches.
type claimGroup = group[store.NextDeliveryParams, claimRes]

// newClaimGroup returns s's group commit of dispatches.
func newClaimGroup(s *Store) *claimGroup {
	g := &claimGroup{s: s, failed: func(err error) claimRes { return claimRes{err: err} }}
	g.flush = func(batch []*groupReq[store.NextDeliveryParams, claimRes]) { flushClaims(g, batch) }
	return g
}

// flushClaims sends one batch of claims and answers their callers.
func flushClaims(g *claimGroup, batch []*groupReq[store.NextDeliveryParams, claimRes]) {
	flushQueued(g, batch, "dispatches", func(p store.NextDeliveryParams) store.ActorKey { return p.Activation.ActorKey },
		func(b *pgx.Batch, p store.NextDeliveryParams) *claim { return queueClaim(b, p, false) },
		func(c *claim) claimRes {
			d, taken := c.dispatch()
			return claimRes{d: d, taken: taken}
		}, claimRes{solo: true})
}

// Group commit of activation claims: concurrent ClaimActivation calls of
// different sessions (each with its first turn's claim, when asked) go out
// together in one implicit transaction, sorted by session, as the others
// do — the wake-up of many sessions at once (a burst of signals to idle
// sessions) costs one round trip and one WAL flush per batch. A claim
// that finds its session unclaimable answers no row (the caller then
// reads why); one that raises (a live activation appeared, a first turn's
// lock race) rolls its batch back, and every claim of it then runs on its
// own.

// activationRes is a claim's answer from its batch.
type activationRes struct {
	a store.Activation
	// claimed is false when the session was not claimable (claimRefusal
	// says why).
	claimed bool
	// solo: the batch rolled back; run the claim on its own.
	solo bool
	err  error
}

// activationGroup is the group commit of activation claims.
type activationGroup = group[store.ClaimActivationParams, activationRes]

// newActivationGroup returns s's group commit of activation claims.
func newActivationGroup(s *Store) *activationGroup {
	g := &activationGroup{s: s, failed: func(err error) activationRes { return activationRes{err: err} }}
	g.flush = func(batch []*groupReq[store.ClaimActivationParams, activationRes]) { flushActivations(g, batch) }
	return g
}

// flushActivations sends one batch of activation claims and answers their
// callers.
func flushActivations(g *activationGroup, batch []*groupReq[store.ClaimActivationParams, activationRes]) {
	flushQueued(g, batch, "activation claims", func(p store.ClaimActivationParams) store.ActorKey { return p.Key },
		queueActivation, func(q *queuedActivation) activationRes {
			return activationRes{a: q.activation(), claimed: q.claimed}
		}, activationRes{solo: true})
}

// flushQueued sends one batch of requests that each queue their statements
// (queue, in the batch's session order: live) and are answered from what
// they queued once the batch committed (answer). A batch the server
// refused answers each request with solo (run it on its own); a
// connection error is every request's (g.failed).
func flushQueued[In, Out, Q any](g *group[In, Out], batch []*groupReq[In, Out], what string,
	key func(In) store.ActorKey, queue func(*pgx.Batch, In) Q, answer func(Q) Out, solo Out) {
	reqs := live(g, batch, key)
	if len(reqs) == 0 {
		return
	}
	b := &pgx.Batch{}
	qs := make([]Q, len(reqs))
	for i, r := range reqs {
		qs[i] = queue(b, r.in)
	}
	refused, err := g.s.sendGroup(reqs[0].ctx, b, len(reqs), what)
	for i, r := range reqs {
		switch {
		case refused:
			r.done <- solo
		case err != nil:
			r.done <- g.failed(err)
		default:
			r.done <- answer(qs[i])
		}
	}
}
