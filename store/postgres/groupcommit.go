package postgres

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paddock-dev/paddock/store"
)

// Group commit. Concurrent requests of every kind the host sends per turn
// — appends (signals to different sessions from many API requests) and
// audit rows, turn commits, one-statement dispatches, deferred dispatches'
// reads and promotions, and activation claims — go out together: one batch
// of their statements in one implicit transaction, one round trip and one
// WAL flush for all of them, instead of one each. There is no waiting
// window: a flusher takes whatever queued while its previous batch was in
// flight, so a lone request goes out at once and batches grow only under
// load. Every caller still returns only after its own request committed
// ("durable before 202").
//
// Three lanes, each one flusher on one connection (pipeline.go: the next
// batch is sent while the last one commits, both on one backend, one after
// the other): acceptance — appends and audit rows, what a 202 waits for —,
// turns — commits, dispatches, reads and promotions — and starts —
// activation claims, each with its first turn's read or claim. A signal's
// acceptance thus never queues behind other sessions' turn work, nor a
// cold start behind the turns of live sessions, and the backends run at
// once: while one waits for its WAL flush or for the host, another runs
// statements. On the bench (N=10000, K=1000, P=8, five interleaved pairs)
// the first two lanes raised turns/s by 6 to 60 %, median 27 %, over one
// shared flusher, whose backend had become the bottleneck (docs/DESIGN.md
// "Store"). Splitting by session instead (each lane every kind for its
// sessions) was measured no faster, and a lane for the deferred reads no
// faster than two. The starts lane is for latency: in the turns lane a
// burst of cold starts (800 new sessions in a run's first second) went
// statement by statement behind each set commit (splitSet), and the turns
// of live sessions waited behind them; on a lane of their own, p99
// signal→commit at half load fell from 46–80 to 33–45 ms and at full load
// from 262–415 to 53–81 ms, turns/s and CPU per turn within the noise
// (docs/DESIGN.md, twelfth session).
//
// A batch's statements are sorted by session. Every transaction that
// locks rows of more than one session — a batch of any lane, of this host
// or another, and the alarm sweep (which skips a locked session) — takes
// them in that order, and within a session every transaction takes the
// activation before the session row: the turns lane locks a session's
// activation, then its rows; the starts lane's claims lock the session
// row, then, with a snapshot taken under that lock (queueActivation),
// insert the activation only when none is live, so the insert waits for no
// live activation's row (no turn transaction of the session), then take
// the new activation's first turn; the acceptance lane locks only session
// rows. A starts batch is one of the turns lane's batches of
// before, with only claims in it. So a batch may wait for another
// batch's row (an append for a commit of the same session, a few
// milliseconds) but no cycle of waits can form, with each other or with a
// request run on its own path. Audit rows lock no row (they sort first,
// with the zero key).
//
// A batch is all or nothing. When a statement in it fails (a commit's
// fence refusing, a lock race, an idempotency-key race, a refused audit
// row) the transaction rolled back and each request runs again on its own
// path, where a refusal is explained; one session's refusal thus never
// undoes another's write, it costs the others one more try. A request that
// found nothing to do (an append to a destroyed session, a used
// idempotency key, a claim that took nothing) is decided on its own path
// after the batch committed. A connection failure is returned to every
// caller of the batch, unretried: the batch may have committed.

// groupMax caps the requests in one batch.
const groupMax = 128

// batcher is one lane of the group commit: its queue and flusher, shared
// by the kinds of request (group) of that lane.
type batcher struct {
	s     *Store
	queue chan groupItem
	once  sync.Once
	// stopped is closed when the flusher no longer runs (or never
	// started): a request not answered by then never will be.
	stopped chan struct{}
}

// groupItem is one queued request of any kind (a *groupReq).
type groupItem interface {
	context() context.Context
	key() store.ActorKey
	// queue appends the request's statements to b.
	queue(b *pgx.Batch)
	// settle answers the request once its batch ran: refused, the server
	// refused the batch (run it on its own); err, the connection failed.
	settle(refused bool, err error)
	// abandon answers a request that never went out.
	abandon(err error)
}

// group is one kind of request of the group commit: In is a request's
// input, Out its answer.
type group[In, Out any] struct {
	b   *batcher
	key func(In) store.ActorKey
	// prepare queues a request's statements and returns its answer,
	// valid once the batch committed.
	prepare func(b *pgx.Batch, in In) func() Out
	// solo answers a request whose batch the server refused: run it on
	// its own.
	solo Out
	// failed is the answer to a request that failed: its context ended,
	// the store closed, the batch's connection failed.
	failed func(err error) Out
}

// groupReq is one request of a group: its caller's context, its input
// and where its answer goes.
type groupReq[In, Out any] struct {
	g      *group[In, Out]
	ctx    context.Context
	in     In
	answer func() Out
	done   chan Out
}

func (r *groupReq[In, Out]) context() context.Context { return r.ctx }
func (r *groupReq[In, Out]) key() store.ActorKey      { return r.g.key(r.in) }
func (r *groupReq[In, Out]) queue(b *pgx.Batch)       { r.answer = r.g.prepare(b, r.in) }
func (r *groupReq[In, Out]) abandon(err error)        { r.done <- r.g.failed(err) }

func (r *groupReq[In, Out]) settle(refused bool, err error) {
	switch {
	case refused:
		r.done <- r.g.solo
	case err != nil:
		r.done <- r.g.failed(err)
	default:
		r.done <- r.answer()
	}
}

func (b *batcher) start() {
	b.once.Do(func() {
		b.queue = make(chan groupItem, 4*groupMax)
		b.stopped = make(chan struct{})
		b.s.mu.Lock()
		defer b.s.mu.Unlock()
		if b.s.isClosed {
			close(b.stopped)
			return // requests then fail with "store closed"
		}
		b.s.subs.Add(1)
		go func() {
			defer b.s.subs.Done()
			defer close(b.stopped)
			b.flushLoop()
		}()
	})
}

// do queues one request and waits for its batch.
func (g *group[In, Out]) do(ctx context.Context, in In) Out {
	b := g.b
	b.start()
	r := &groupReq[In, Out]{g: g, ctx: ctx, in: in, done: make(chan Out, 1)}
	select {
	case b.queue <- r:
	case <-ctx.Done():
		return g.failed(ctx.Err())
	case <-b.s.closedCtx.Done():
		return g.failed(errors.New("store closed"))
	}
	select {
	case res := <-r.done:
		return res
	case <-ctx.Done():
		// The request may still commit; like a single statement whose
		// caller gave up, its outcome is unknown to the caller.
		return g.failed(ctx.Err())
	case <-b.stopped:
		// The flusher has returned (the store closed): r was answered
		// or never will be.
		select {
		case res := <-r.done:
			return res
		default:
			return g.failed(errors.New("store closed"))
		}
	}
}

func (b *batcher) flushLoop() {
	var p *pipe
	defer func() {
		if p != nil {
			p.close()
		}
	}()
	// carry is what the last batch left for this one (splitSet); a batch
	// that starts with it is not split again, so nothing waits for more
	// than one batch.
	var carry []groupItem
	for {
		batch := carry
		if len(batch) == 0 {
			select {
			case first := <-b.queue:
				batch = []groupItem{first}
			case <-b.s.closedCtx.Done():
				return
			}
		}
		split := len(carry) == 0
		carry = nil
		if p != nil {
			// Wait until the batch in flight has run its statements: the
			// next one takes whatever queued meanwhile.
			select {
			case <-p.room:
			case <-p.dead:
			}
			if p.isDead() {
				p.close()
				p = nil
			}
		}
	more:
		for len(batch) < groupMax {
			select {
			case r := <-b.queue:
				batch = append(batch, r)
			default:
				break more
			}
		}
		p, carry = b.flush(p, batch, split)
	}
}

// flush sends one batch on p (a new pipe when p is nil) and returns the
// pipe to send the next one on, and the requests it left for the next
// batch: with split, a batch may go out as a set commit and leave its
// other locking requests (splitSet). The caller holds p's room token; the
// reader answers the batch's requests. A request whose batch could not be
// sent at all (no connection, a statement that does not prepare) runs on
// its own path.
func (b *batcher) flush(p *pipe, batch []groupItem, split bool) (*pipe, []groupItem) {
	reqs := live(batch)
	giveBack := func() {
		if p != nil {
			p.room <- struct{}{}
		}
	}
	if len(reqs) == 0 {
		giveBack()
		return p, nil
	}
	solo := func() {
		for _, r := range reqs {
			r.settle(true, nil)
		}
	}
	deadline := batchDeadline(b.s.callTimeout)
	if p != nil && time.Since(p.idle) > pipeIdleCheck {
		if err := p.ping(deadline); err != nil {
			p.close()
			p = nil
		}
	}
	if p == nil {
		ctx, cancel := context.WithDeadline(b.s.closedCtx, deadline)
		np, err := b.s.openPipe(ctx)
		cancel()
		if err != nil {
			solo()
			return nil, nil
		}
		p = np
		<-p.room
	}
	pb := &pgx.Batch{}
	sent, carry := reqs, []groupItem(nil)
	switch {
	case queueSet(pb, reqs), queueSetAppends(pb, reqs):
	default:
		if set, rest, ok := splitSet(reqs); split && ok && queueSet(pb, set) {
			sent, carry = set, rest
			break
		}
		for _, r := range reqs {
			r.queue(pb)
		}
	}
	p.idle = time.Now()
	if err := p.send(sent, pb, deadline); err != nil {
		solo()
		if p.isDead() {
			p.close()
			return nil, nil
		}
		giveBack()
		return p, nil
	}
	return p, carry
}

// pipeIdleCheck: a pipe idle for longer is checked before a batch goes
// out on it (pipe.ping).
const pipeIdleCheck = time.Second

// batchDeadline is the deadline of a batch (its writes and the reads of
// its answers): callTimeout from now, whatever its requests' deadlines. A
// caller whose context ends returns then (group.do); the batch goes on,
// as the others wait for it. Under a request's earlier deadline, a read
// that timed out would break the connection under every batch in flight,
// and their callers would not know whether their requests committed.
func batchDeadline(callTimeout time.Duration) time.Time {
	return time.Now().Add(callTimeout)
}

// live answers the requests of batch whose caller gave up and returns the
// others, sorted by session (a session's in arrival order): one lock
// order for every batch.
func live(batch []groupItem) []groupItem {
	out := batch[:0:0]
	for _, r := range batch {
		if err := r.context().Err(); err != nil {
			r.abandon(err)
			continue
		}
		out = append(out, r)
	}
	slices.SortStableFunc(out, func(a, b groupItem) int {
		ka, kb := a.key(), b.key()
		return cmp.Or(strings.Compare(ka.AgentUID, kb.AgentUID), strings.Compare(ka.SessionID, kb.SessionID))
	})
	return out
}

// groups are the kinds of request of s's group commit, in three lanes:
// appends (acceptance), activation claims (starts) and the rest (turns).
type groups struct {
	appends     *group[appendIn, appendRes]
	commits     *group[commitIn, commitRes]
	claims      *group[store.NextDeliveryParams, claimRes]
	reads       *group[store.NextDeliveryParams, readRes]
	promotes    *group[store.PromoteParams, claimRes]
	activations *group[store.ClaimActivationParams, activationRes]
}

// newGroups returns s's group commit.
func newGroups(s *Store) groups {
	accept, b, starts := &batcher{s: s}, &batcher{s: s}, &batcher{s: s}
	return groups{
		appends: &group[appendIn, appendRes]{b: accept,
			key: func(in appendIn) store.ActorKey { return in.key }, prepare: prepareAppend,
			solo: appendRes{solo: true}, failed: func(err error) appendRes { return appendRes{err: err} }},
		commits: &group[commitIn, commitRes]{b: b,
			key: func(in commitIn) store.ActorKey { return store.KeyOf(in.p.Ref) },
			prepare: func(b *pgx.Batch, in commitIn) func() commitRes {
				if deferredInOne(in.p, in.alarms) {
					q := queueDeferredCommit(b, in.p, in.next)
					return func() commitRes { return commitRes{t: q.turn()} }
				}
				if d := in.p.Deferred; d != nil {
					// A deferred turn: its promotion first (a claim that takes
					// nothing leaves no delivery, and the fence refuses).
					queueClaimOf(b, promoteClaim(*d), &d.Delivery)
				}
				q := queueCommit(b, in.p, in.p.Payloads, true, in.alarms, in.next)
				return func() commitRes { return commitRes{t: q.turn()} }
			},
			solo: commitRes{solo: true}, failed: func(err error) commitRes { return commitRes{err: err} }},
		claims: &group[store.NextDeliveryParams, claimRes]{b: b,
			key: func(p store.NextDeliveryParams) store.ActorKey { return p.Activation.ActorKey },
			prepare: func(b *pgx.Batch, p store.NextDeliveryParams) func() claimRes {
				c := queueClaim(b, p, false)
				return func() claimRes {
					d, taken := c.dispatch()
					return claimRes{d: d, taken: taken}
				}
			},
			solo: claimRes{solo: true}, failed: func(err error) claimRes { return claimRes{err: err} }},
		reads: &group[store.NextDeliveryParams, readRes]{b: b,
			key: func(p store.NextDeliveryParams) store.ActorKey { return p.Activation.ActorKey },
			prepare: func(b *pgx.Batch, p store.NextDeliveryParams) func() readRes {
				r := queueDeferredRead(b, p)
				return func() readRes { return readRes{r: r} }
			},
			solo: readRes{}, failed: func(err error) readRes { return readRes{err: err} }},
		promotes: &group[store.PromoteParams, claimRes]{b: b,
			key: func(p store.PromoteParams) store.ActorKey { return p.Activation.ActorKey },
			prepare: func(b *pgx.Batch, p store.PromoteParams) func() claimRes {
				c := queueClaimOf(b, promoteClaim(p), &p.Delivery)
				return func() claimRes { return claimRes{taken: c.taken} }
			},
			solo: claimRes{solo: true}, failed: func(err error) claimRes { return claimRes{err: err} }},
		activations: &group[store.ClaimActivationParams, activationRes]{b: starts,
			key: func(p store.ClaimActivationParams) store.ActorKey { return p.Key },
			prepare: func(b *pgx.Batch, p store.ClaimActivationParams) func() activationRes {
				q := queueActivation(b, p)
				return func() activationRes { return activationRes{a: q.activation(), claimed: q.claimed} }
			},
			solo: activationRes{solo: true}, failed: func(err error) activationRes { return activationRes{err: err} }},
	}
}

// appendIn is an append of the group commit: an event, or an audit row
// when audit is set.
type appendIn struct {
	key store.ActorKey
	ne  newEvent
	// audit, when set, is an audit row to insert instead (AppendAudit).
	audit *store.AppendAuditParams
	// eventAudit, when set, is the audit row of the call that appends the
	// event, inserted with it (store.AppendEventParams.Audit).
	eventAudit *store.AppendAuditParams
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

// prepareAppend queues an append (appendEventSQL) or an audit row
// (insertAuditSQL).
func prepareAppend(b *pgx.Batch, in appendIn) func() appendRes {
	var res appendRes
	if in.audit != nil {
		b.Queue(insertAuditSQL, auditArgs(*in.audit)...).QueryRow(func(row pgx.Row) error {
			var err error
			res.row, err = scanAudit(row)
			return err
		})
	} else {
		queueAppend(b, in.key, in.ne, in.eventAudit, func(e store.Event, created bool, err error) {
			res = appendRes{e: e, created: created, solo: err == nil && !created, err: err}
		})
	}
	return func() appendRes { return res }
}

// commitIn is a commit of the group commit: CommitTurn calls of different
// sessions that carry their payloads and open no wait (the common commit:
// its fence and writes are one batch already).
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

// claimRes is a dispatch's answer from its batch: one-statement claims
// (NextDelivery with an expectation, queueClaim) and promotions (Promote,
// whose answer is taken alone). A claim that takes nothing answers no
// row.
type claimRes struct {
	d     store.Dispatch
	taken bool
	// solo: the batch rolled back; run the claim on its own.
	solo bool
	err  error
}

// readRes is a deferred dispatch's reads from their batch
// (queueDeferredRead); r is nil when the batch rolled back (read on its
// own).
type readRes struct {
	r   *deferredRead
	err error
}

// activationRes is an activation claim's answer from its batch (each with
// its first turn's claim, when asked): the wake-up of many sessions at
// once (a burst of signals to idle sessions) costs one round trip and one
// WAL flush per batch. A claim that finds its session unclaimable answers
// no row (the caller then reads why).
type activationRes struct {
	a store.Activation
	// claimed is false when the session was not claimable (claimRefusal
	// says why).
	claimed bool
	// solo: the batch rolled back; run the claim on its own.
	solo bool
	err  error
}
