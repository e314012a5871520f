package postgres_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/pgtest"
	"github.com/paddock-dev/paddock/store/postgres"
)

// TestPipeHugeBatchesDoNotDeadlock: a batch whose statements and answers
// are each larger than the socket buffers (appends of large payloads,
// answered with their events) goes through. The server writes the first
// answers while the host still writes the batch: unless the reader reads
// them meanwhile, each side waits for the other to read.
func TestPipeHugeBatchesDoNotDeadlock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := postgres.Open(ctx, pgtest.DSN(t), postgres.WithCallTimeout(time.Minute))
	must(t, err, "Open")
	t.Cleanup(func() { _ = s.Close() })
	f := newFixtureOn(t, s)
	const senders = 48
	big := bytes.Repeat([]byte("x"), 512<<10)
	keys := make([]store.ActorKey, senders)
	for i := range keys {
		keys[i] = f.session(f.key.AgentUID)
	}
	ctx, cancel := context.WithTimeout(ctx, 45*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, senders)
	for i := range senders {
		wg.Go(func() {
			payload := fmt.Appendf(nil, `{"message":"%d %s"}`, i, big)
			e, created, err := s.AppendEvent(ctx, store.AppendEventParams{Key: keys[i], Kind: abi.EventMessage, Payload: payload})
			switch {
			case err != nil:
				errs <- fmt.Errorf("sender %d: %w", i, err)
			case !created || !bytes.Equal(e.Payload, payload):
				errs <- fmt.Errorf("sender %d: created %v, payload of %d bytes back, want %d", i, created, len(e.Payload), len(payload))
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i, key := range keys {
		evs, err := s.ListEvents(context.Background(), store.ListEventsParams{Key: key, Limit: 10})
		must(t, err, "ListEvents")
		if len(evs) != 1 || len(evs[0].Payload) < len(big) {
			t.Fatalf("session %d: %d events stored, want its one large append", i, len(evs))
		}
	}
}

// pipeProxy forwards PostgreSQL connections to target and tells the group
// commit's pipelined connections from the others: a connection is the
// group commit's from the moment the store prepares a statement named
// paddock_gc_* on it. Only those are attacked; the pool's connections
// (the solo path, the fixtures) pass untouched.
type pipeProxy struct {
	ln     net.Listener
	target string
	// armed is the attack the next reply on a group commit's connection
	// gets (pipeFatal, pipeCut); it fires once, and fired counts it.
	armed atomic.Int32
	fired atomic.Int64
	// stall, when not nil, holds the next message the server sends on a
	// group commit's connection until it is closed (release); held counts
	// the messages held.
	mu    sync.Mutex
	stall chan struct{}
	held  atomic.Int64
}

// The attacks of pipeProxy.
const (
	pipeNone int32 = iota
	// pipeFatal: the next ReadyForQuery after a data row (a batch that
	// committed) becomes a FATAL, and the connection closes.
	pipeFatal
	// pipeCut: the connection closes in the middle of the next data row
	// (half of its bytes forwarded).
	pipeCut
)

func newPipeProxy(t *testing.T, dsn string) (*pipeProxy, string) {
	t.Helper()
	u, err := url.Parse(dsn)
	must(t, err, "parse DSN")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err, "Listen")
	p := &pipeProxy{ln: ln, target: u.Host}
	t.Cleanup(func() {
		_ = ln.Close()
		p.release()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.handle(c)
		}
	}()
	u.Host = ln.Addr().String()
	return p, u.String()
}

// hold stalls the group commit's connections: nothing the server sends
// on them reaches the store until release.
func (p *pipeProxy) hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stall == nil {
		p.stall = make(chan struct{})
	}
}

func (p *pipeProxy) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stall != nil {
		close(p.stall)
		p.stall = nil
	}
}

func (p *pipeProxy) stalled() chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stall
}

// fire arms attack and waits until it fired on a group commit's
// connection (the caller keeps batches going meanwhile).
func (p *pipeProxy) fire(t *testing.T, attack int32) {
	t.Helper()
	n := p.fired.Load()
	p.armed.Store(attack)
	deadline := time.Now().Add(20 * time.Second)
	for p.fired.Load() == n {
		if time.Now().After(deadline) {
			t.Fatal("the proxy's attack did not fire within 20s: no batch went out")
		}
		time.Sleep(time.Millisecond)
	}
}

// readMsg reads one message of the protocol (a type byte, unless untyped,
// then a length that counts itself) from r.
func readMsg(r *bufio.Reader, typed bool) ([]byte, error) {
	hdr := 4
	if typed {
		hdr = 5
	}
	msg := make([]byte, hdr)
	if _, err := io.ReadFull(r, msg); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint32(msg[hdr-4:])) - 4
	if n < 0 || n > 1<<30 {
		return nil, fmt.Errorf("bad message length %d", n)
	}
	msg = append(msg, make([]byte, n)...)
	_, err := io.ReadFull(r, msg[hdr:])
	return msg, err
}

func (p *pipeProxy) handle(c net.Conn) {
	srv, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = c.Close()
		return
	}
	done := make(chan struct{})
	var once sync.Once
	end := func() {
		once.Do(func() {
			close(done)
			_ = c.Close()
			_ = srv.Close()
		})
	}
	defer end()
	var gc atomic.Bool
	// Client to server: the startup message (an SSL request is refused
	// here), then typed messages; a Parse of paddock_gc_* marks the
	// connection.
	go func() {
		defer end()
		r, w := bufio.NewReader(c), bufio.NewWriter(srv)
		for {
			msg, err := readMsg(r, false)
			if err != nil {
				return
			}
			if len(msg) == 8 && binary.BigEndian.Uint32(msg[4:]) == 80877103 {
				if _, err := c.Write([]byte{'N'}); err != nil {
					return
				}
				continue
			}
			if _, err := w.Write(msg); err != nil {
				return
			}
			break
		}
		for {
			if r.Buffered() == 0 {
				if err := w.Flush(); err != nil {
					return
				}
			}
			msg, err := readMsg(r, true)
			if err != nil {
				_ = w.Flush()
				return
			}
			if msg[0] == 'P' && bytes.HasPrefix(msg[5:], []byte("paddock_gc_")) {
				gc.Store(true)
			}
			if _, err := w.Write(msg); err != nil {
				return
			}
		}
	}()
	// Server to client.
	r, w := bufio.NewReader(srv), bufio.NewWriter(c)
	sawRow := false
	for {
		if r.Buffered() == 0 {
			if err := w.Flush(); err != nil {
				return
			}
		}
		msg, err := readMsg(r, true)
		if err != nil {
			_ = w.Flush()
			return
		}
		if !gc.Load() {
			if _, err := w.Write(msg); err != nil {
				return
			}
			continue
		}
		if stall := p.stalled(); stall != nil {
			_ = w.Flush()
			p.held.Add(1)
			select {
			case <-stall:
			case <-done:
				return
			}
		}
		switch msg[0] {
		case 'D':
			sawRow = true
			if p.armed.CompareAndSwap(pipeCut, pipeNone) {
				p.fired.Add(1)
				_, _ = w.Write(msg[:len(msg)/2])
				_ = w.Flush()
				return
			}
		case 'Z':
			if sawRow && p.armed.CompareAndSwap(pipeFatal, pipeNone) {
				p.fired.Add(1)
				_, _ = w.Write(fatalAfterCommit)
				_ = w.Flush()
				return
			}
			sawRow = false
		}
		if _, err := w.Write(msg); err != nil {
			return
		}
	}
}

// pipeTracer finds the group commit's connections: the pipe traces each
// of its prepare round trips as a batch without a pgx.Batch, on the
// connection's hijacked handle, and each statement of it as a prepare.
type pipeTracer struct {
	mu       sync.Mutex
	prepares map[*pgx.Conn]int
	conns    []*pgx.Conn // in the order of their first prepare
	// stmts counts per connection the prepares of each statement's text;
	// again counts those of a text that connection had prepared before.
	stmts map[*pgx.Conn]map[string]int
	again map[*pgx.Conn]int
}

func newPipeTracer() *pipeTracer {
	return &pipeTracer{prepares: map[*pgx.Conn]int{}, stmts: map[*pgx.Conn]map[string]int{}, again: map[*pgx.Conn]int{}}
}

func (tr *pipeTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (tr *pipeTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (tr *pipeTracer) TraceBatchStart(ctx context.Context, c *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	if d.Batch == nil {
		tr.mu.Lock()
		if tr.prepares[c] == 0 {
			tr.conns = append(tr.conns, c)
		}
		tr.prepares[c]++
		tr.mu.Unlock()
	}
	return ctx
}
func (tr *pipeTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (tr *pipeTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}
func (tr *pipeTracer) TracePrepareStart(ctx context.Context, c *pgx.Conn, d pgx.TracePrepareStartData) context.Context {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.stmts[c] == nil {
		tr.stmts[c] = map[string]int{}
	}
	if tr.stmts[c][d.SQL] > 0 {
		tr.again[c]++
	}
	tr.stmts[c][d.SQL]++
	return ctx
}
func (tr *pipeTracer) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

// pipe returns the group commit's connection that prepared last (of
// either lane; a test of appends alone has only the acceptance lane's),
// its backend's pid, and how many prepare round trips it made.
func (tr *pipeTracer) pipe() (c *pgx.Conn, pid uint32, prepares int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if len(tr.conns) == 0 {
		return nil, 0, 0
	}
	c = tr.conns[len(tr.conns)-1]
	return c, c.PgConn().PID(), tr.prepares[c]
}

// preparedAgain returns how many statements connection c prepared a
// second time or more (a statement first seen later, such as the set
// append's when a batch first reaches setAppendMin, is not counted).
func (tr *pipeTracer) preparedAgain(c *pgx.Conn) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.again[c]
}

func (tr *pipeTracer) pipes() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return len(tr.conns)
}

// latency records the longest call of the workers that take their
// contexts from ctxOf.
type latency struct{ max atomic.Int64 }

func (l *latency) ctxOf(parent context.Context) func() (context.Context, context.CancelFunc) {
	return func() (context.Context, context.CancelFunc) {
		start := time.Now()
		ctx, cancel := context.WithCancel(parent)
		return ctx, func() {
			cancel()
			d := int64(time.Since(start))
			for {
				m := l.max.Load()
				if d <= m || l.max.CompareAndSwap(m, d) {
					return
				}
			}
		}
	}
}

func (l *latency) longest() time.Duration { return time.Duration(l.max.Load()) }

// waitWithin waits for wg, failing the test if its callers are still
// blocked after d.
func waitWithin(t *testing.T, wg *sync.WaitGroup, d time.Duration, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s: callers still blocked after %v", what, d)
	}
}

// ackedAtLeast waits until o holds at least n acknowledged appends.
func ackedAtLeast(t *testing.T, o *attackOutcome, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		o.mu.Lock()
		got := len(o.acked)
		o.mu.Unlock()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d appends acknowledged after 20s, want %d: the store stopped serving", got, n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (o *attackOutcome) counts() (acked, committed, errs int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.acked), len(o.committed), o.errs
}

// pipeAttackCallTimeout is the call timeout of the attack tests: a caller
// of a batch whose connection broke is answered at once, not at its
// deadline.
const pipeAttackCallTimeout = 5 * time.Second

// pipeUnderAttack runs attackWorkers on 12 sessions of a store opened
// through a pipeProxy and calls attack rounds times, each after more
// appends were acknowledged since the one before; then it checks that
// every caller was answered before its call timeout (the breaks were
// heard, not waited out), that each attack cost the group commit exactly
// one connection (of the acceptance or the turns lane: the workers' appends
// and commits keep both busy), that the store still serves appends on every session,
// and checkAttackedSessions.
func pipeUnderAttack(t *testing.T, rounds int, attack func(i int, px *pipeProxy, tr *pipeTracer)) {
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	px, proxied := newPipeProxy(t, dsn)
	tr := newPipeTracer()
	s, err := postgres.Open(ctx, proxied, postgres.WithTracer(tr), postgres.WithCallTimeout(pipeAttackCallTimeout))
	must(t, err, "Open")
	t.Cleanup(func() { _ = s.Close() })
	f := newFixtureOn(t, s)
	acts := liveSessions(f, 12)

	const lanes = 3 // starts (the claims above), acceptance and turns
	o := newAttackOutcome()
	stop, cancelStop := context.WithCancel(ctx)
	defer cancelStop()
	var wg sync.WaitGroup
	var lat latency
	attackWorkers(s, acts, o, stop, lat.ctxOf(ctx), &wg, nil)
	for i := range rounds {
		acked, _, _ := o.counts()
		ackedAtLeast(t, o, acked+30)
		// The group commit's connections of this round are up, one per
		// lane (each has prepared its statements): the starts lane's,
		// opened by liveSessions' claims before the workers ran and idle
		// since (never the one attacked: tr.pipe is the connection opened
		// last), and the workers' acceptance and turns lanes.
		for deadline := time.Now().Add(20 * time.Second); tr.pipes() < i+lanes; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("attack %d: the group commit has %d connections after 20s, want %d", i, tr.pipes(), i+lanes)
			}
		}
		attack(i, px, tr)
	}
	acked, _, _ := o.counts()
	ackedAtLeast(t, o, acked+30) // served after the last attack
	cancelStop()
	waitWithin(t, &wg, 2*pipeAttackCallTimeout, "after the attacks")
	acked, committed, errs := o.counts()
	t.Logf("%d attacks: %d appends, %d commits acknowledged, %d errors; longest call %v; %d connections",
		rounds, acked, committed, errs, lat.longest(), tr.pipes())
	if errs == 0 {
		t.Error("no caller saw an error: the attacks broke no batch in flight")
	}
	if l := lat.longest(); l >= pipeAttackCallTimeout {
		t.Errorf("a call took %v, its call timeout %v: a broken batch's callers waited for their deadline", l, pipeAttackCallTimeout)
	}
	if n := tr.pipes(); n != rounds+lanes {
		t.Errorf("the group commit opened %d connections, want %d: one per lane, and one after each attack", n, rounds+lanes)
	}

	// The store serves new appends and turns on every session.
	keys := make([]store.ActorKey, len(acts))
	for i, a := range acts {
		keys[i] = a.ActorKey
		payload := fmt.Sprintf(`{"message": "after-%d"}`, i)
		_, created, err := s.AppendEvent(ctx, store.AppendEventParams{Key: a.ActorKey, Kind: abi.EventMessage, Payload: []byte(payload)})
		if err != nil || !created {
			t.Fatalf("append to session %d after the attacks: created %v, %v", i, created, err)
		}
		o.ack(payload)
	}
	checkAttackedSessions(t, s, keys, o)
}

// TestPipeAttackFatalUnderLoad: while appends and turns of many sessions
// go through the pipelined group commit, its connection fails mid-flight,
// six times: a FATAL instead of a committed batch's ReadyForQuery (the
// proxy), or its backend terminated (pg_terminate_backend) while batches
// are in flight. The batches in flight fail (their callers hear it at
// once); every acknowledged append is stored exactly once, nothing twice,
// no batch half-written, every acknowledged commit has its turn; the next
// batches go out on a new connection.
func TestPipeAttackFatalUnderLoad(t *testing.T) {
	t.Parallel()
	killer, err := pgx.Connect(context.Background(), pgtest.DSN(t))
	must(t, err, "Connect")
	defer killer.Close(context.Background())
	pipeUnderAttack(t, 6, func(i int, px *pipeProxy, tr *pipeTracer) {
		if i%2 == 0 {
			px.fire(t, pipeFatal)
			return
		}
		// The pid the hijacked connection's backend had: the same
		// database (pgtest.DSN(t) names it, the proxy forwards to it).
		_, pid, _ := tr.pipe()
		var ok bool
		must(t, killer.QueryRow(context.Background(), `SELECT pg_terminate_backend($1)`, int32(pid)).Scan(&ok), "pg_terminate_backend")
		if !ok {
			t.Fatalf("pg_terminate_backend(%d) found no backend", pid)
		}
	})
}

// TestPipeAttackCutMidReply: the group commit's connection closes in the
// middle of a server reply (half a data row of a batch's answers
// forwarded), four times under load. The callers of the batches in flight
// get errors at once (the reader does not wait for the rest of a
// message); acknowledged work is stored exactly once; new work succeeds on
// a new connection.
func TestPipeAttackCutMidReply(t *testing.T) {
	t.Parallel()
	pipeUnderAttack(t, 4, func(_ int, px *pipeProxy, _ *pipeTracer) { px.fire(t, pipeCut) })
}

// TestPipeCloseWhileTheServerStalls: the server's replies on the group
// commit's connection stop (the proxy holds them) while appends and
// turns run; Close returns within about the call timeout (the stalled
// batch's deadline), every caller is answered (an error or its result)
// within a bound, and what the callers were told went through is stored
// exactly once (checked on a store reopened directly).
func TestPipeCloseWhileTheServerStalls(t *testing.T) {
	t.Parallel()
	const callTimeout = 2 * time.Second
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	px, proxied := newPipeProxy(t, dsn)
	s, err := postgres.Open(ctx, proxied, postgres.WithCallTimeout(callTimeout))
	must(t, err, "Open")
	t.Cleanup(func() { _ = s.Close() })
	f := newFixtureOn(t, s)
	acts := liveSessions(f, 8)

	o := newAttackOutcome()
	stop, cancelStop := context.WithCancel(ctx)
	defer cancelStop()
	var wg sync.WaitGroup
	var lat latency
	// The callers of the stalled batches hear the reader give their
	// connection up at their deadline.
	var connErrs atomic.Int64
	attackWorkers(s, acts, o, stop, lat.ctxOf(ctx), &wg, func(err error) {
		if strings.Contains(err.Error(), "group commit connection") {
			connErrs.Add(1)
		}
	})
	ackedAtLeast(t, o, 60)
	px.hold()
	// A reply of a batch in flight is held.
	for deadline := time.Now().Add(20 * time.Second); px.held.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the stall held no reply within 20s: no batch went out")
		}
	}
	start := time.Now()
	closed := make(chan struct{})
	go func() {
		_ = s.Close()
		close(closed)
	}()
	bound := callTimeout + 3*time.Second
	select {
	case <-closed:
	case <-time.After(bound):
		t.Fatalf("Close still blocked %v after the server stalled (call timeout %v)", bound, callTimeout)
	}
	took := time.Since(start)
	cancelStop()
	waitWithin(t, &wg, bound, "after Close")
	acked, committed, errs := o.counts()
	t.Logf("Close took %v; %d appends, %d commits acknowledged, %d errors (%d of the stalled connection); longest call %v",
		took, acked, committed, errs, connErrs.Load(), lat.longest())
	if l := lat.longest(); l > bound {
		t.Errorf("a call took %v, more than %v", l, bound)
	}
	if connErrs.Load() == 0 {
		t.Error("no caller heard of the stalled connection: the stall held no batch")
	}

	px.release()
	s2, err := postgres.Open(ctx, dsn)
	must(t, err, "Open again")
	t.Cleanup(func() { _ = s2.Close() })
	keys := make([]store.ActorKey, len(acts))
	for i, a := range acts {
		keys[i] = a.ActorKey
	}
	checkAttackedSessions(t, s2, keys, o)
}

// TestPipeSchemaChangeUnderLoad: while appends run through the pipelined
// group commit, actor_events changes under its prepared statements.
//
// A column added and dropped leaves the statements' result types alone
// (they name their columns): the server plans them again silently, no
// caller sees an error and the pipe prepares nothing again.
//
// A column's type changed (kind: text to varchar and back) changes the
// append statement's result type: the server refuses the prepared
// statement (SQLSTATE 0A000, "cached plan must not change result type"),
// the refused batches roll back and their callers run on their own path,
// and the pipe prepares its statements again on the same connection
// (pipe.stale), once per change. A caller's own path may meet a pool
// connection whose statement cache predates the change: the store runs
// that transaction again (pgx dropped the statement), so no caller sees
// an error. Every append ends stored exactly once, and appends keep
// succeeding afterwards.
func TestPipeSchemaChangeUnderLoad(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	tr := newPipeTracer()
	// Two pool connections: each may hold an outdated statement once, and a
	// transaction runs up to four times (txAttempts).
	s, err := postgres.Open(ctx, dsn, postgres.WithTracer(tr), postgres.WithMaxConns(2))
	must(t, err, "Open")
	t.Cleanup(func() { _ = s.Close() })
	f := newFixtureOn(t, s)
	ddl, err := pgx.Connect(ctx, dsn)
	must(t, err, "Connect")
	defer ddl.Close(ctx)
	const senders = 8
	keys := make([]store.ActorKey, senders)
	for i := range keys {
		keys[i] = f.session(f.key.AgentUID)
	}

	o := newAttackOutcome()
	errs := make(chan error, senders)
	appendOnce := func(i int, payload string) error {
		_, created, err := s.AppendEvent(ctx, store.AppendEventParams{Key: keys[i], Kind: abi.EventMessage, Payload: []byte(payload)})
		switch {
		case err != nil:
			return fmt.Errorf("append %s: %w", payload, err)
		case !created:
			return fmt.Errorf("append %s: not created", payload)
		}
		o.ack(payload)
		return nil
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range senders {
		wg.Go(func() {
			for j := 0; ; j++ {
				select {
				case <-stop:
					return
				default:
				}
				if err := appendOnce(i, fmt.Sprintf(`{"message": "s%d-%d"}`, i, j)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	// progress waits until the pipe went on after a change: more
	// appends acknowledged.
	progress := func(what string) {
		t.Helper()
		acked, _, _ := o.counts()
		ackedAtLeast(t, o, acked+50)
		select {
		case err := <-errs:
			t.Fatalf("%s: %v", what, err)
		default:
		}
	}
	exec := func(sql string) {
		t.Helper()
		_, err := ddl.Exec(ctx, sql)
		must(t, err, sql)
	}
	progress("before the changes")
	pipe, _, _ := tr.pipe()
	again := tr.preparedAgain(pipe)

	exec(`ALTER TABLE actor_events ADD COLUMN x int`)
	progress("after ADD COLUMN")
	exec(`ALTER TABLE actor_events DROP COLUMN x`)
	progress("after DROP COLUMN")
	if c, _, _ := tr.pipe(); c != pipe || tr.preparedAgain(pipe) != again {
		t.Fatalf("a column added and dropped: the pipe prepared %d statements again (was %d), new connection %v; want neither",
			tr.preparedAgain(pipe), again, c != pipe)
	}

	for _, sql := range []string{`ALTER TABLE actor_events ALTER COLUMN kind TYPE varchar`,
		`ALTER TABLE actor_events ALTER COLUMN kind TYPE text`} {
		exec(sql)
		progress(sql)
		deadline := time.Now().Add(20 * time.Second)
		for {
			c, _, _ := tr.pipe()
			if c != pipe {
				t.Fatalf("%s: the group commit opened a new connection instead of preparing again", sql)
			}
			if n := tr.preparedAgain(pipe); n > again {
				again = n
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the pipe did not prepare its statements again", sql)
			}
			progress(sql)
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	// Afterwards every append goes through at once.
	var after sync.WaitGroup
	for i := range senders {
		after.Go(func() {
			for j := range 10 {
				if err := appendOnce(i, fmt.Sprintf(`{"message": "after-s%d-%d"}`, i, j)); err != nil {
					t.Error(err)
				}
			}
		})
	}
	after.Wait()
	acked, _, _ := o.counts()
	t.Logf("%d appends; the pipe prepared %d statements again", acked, again)
	checkAttackedSessions(t, s, keys, o)
}

// TestPipeRefusedBatchesAmongPipelined: under load, batches the server
// refuses (a commit that replays a committed turn: its fence raises, the
// batch rolls back) and appends a batch cannot decide (to a destroyed
// session: its statement takes no row) share the pipelined connection
// with batches that commit. The refused batches' requests run again on
// their own path, each with its own outcome: every fresh append and
// commit succeeds, every replay is refused as superseded (and writes
// nothing), every append to the destroyed session gets
// ErrSessionDestroyed; each session ends with exactly its events and
// turns.
func TestPipeRefusedBatchesAmongPipelined(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	f := newFixtureOn(t, s)
	const turnSessions, rounds, appendSessions, appends = 8, 12, 8, 40
	acts := liveSessions(f, turnSessions)
	plain := make([]store.ActorKey, appendSessions)
	for i := range plain {
		plain[i] = f.session(f.key.AgentUID)
	}
	dead := f.session(f.key.AgentUID)
	_, err := s.DestroySession(ctx, dead)
	must(t, err, "DestroySession")

	var wg sync.WaitGroup
	errs := make(chan error, 64)
	fail := func(format string, args ...any) {
		select {
		case errs <- fmt.Errorf(format, args...):
		default:
		}
	}
	var live latency
	call := live.ctxOf(ctx)
	for i, a := range acts {
		wg.Go(func() {
			var refs []abi.TurnRef
			for r := range rounds {
				payload := fmt.Sprintf(`{"message":"t%d-%d"}`, i, r)
				cctx, cancel := call()
				e, created, err := s.AppendEvent(cctx, store.AppendEventParams{Key: a.ActorKey, Kind: abi.EventMessage, Payload: []byte(payload)})
				cancel()
				if err != nil || !created {
					fail("session %d round %d: append: created %v, %v", i, r, created, err)
					return
				}
				d, err := s.NextDelivery(ctx, store.NextDeliveryParams{Activation: a.Ref(), DeliveryID: uuid.NewString(),
					Binding: "sha256:test", MarkSent: true})
				if err != nil || d.Event.ID != e.ID {
					fail("session %d round %d: NextDelivery took event %d, want %d: %v", i, r, d.Event.ID, e.ID, err)
					return
				}
				cctx, cancel = call()
				turn, err := s.CommitTurn(cctx, store.CommitTurnParams{Ref: d.Delivery.TurnRef(), Outcome: abi.OutcomeOK,
					KeepState: true, Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "reply"}},
					Payloads: []string{string(d.Event.Payload)}})
				cancel()
				if err != nil || turn.EventID != e.ID || turn.TurnNo != int64(r+1) {
					fail("session %d round %d: commit: turn %d of event %d, want %d of %d: %v", i, r, turn.TurnNo, turn.EventID, r+1, e.ID, err)
					return
				}
				refs = append(refs, d.Delivery.TurnRef())
				// The turn just committed, and one of an earlier round.
				for _, ref := range []abi.TurnRef{refs[len(refs)-1], refs[r/2]} {
					cctx, cancel = call()
					err := replayRefused(cctx, s, ref)
					cancel()
					if err != nil {
						fail("session %d round %d: %v", i, r, err)
						return
					}
				}
			}
		})
	}
	for i, key := range plain {
		wg.Go(func() {
			for j := range appends {
				cctx, cancel := call()
				e, created, err := s.AppendEvent(cctx, store.AppendEventParams{Key: key, Kind: abi.EventMessage,
					Payload: []byte(fmt.Sprintf(`{"message":"p%d-%d"}`, i, j))})
				cancel()
				if err != nil || !created || e.Seq != int64(j+1) {
					fail("plain session %d append %d: seq %d, created %v, %v", i, j, e.Seq, created, err)
					return
				}
			}
		})
	}
	for i := range 3 {
		wg.Go(func() {
			for j := range appends / 2 {
				cctx, cancel := call()
				_, _, err := s.AppendEvent(cctx, store.AppendEventParams{Key: dead, Kind: abi.EventMessage,
					Payload: []byte(fmt.Sprintf(`{"message":"dead%d-%d"}`, i, j))})
				cancel()
				if !errors.Is(err, store.ErrSessionDestroyed) {
					fail("append %d to a destroyed session: %v, want ErrSessionDestroyed", j, err)
					return
				}
			}
		})
	}
	waitWithin(t, &wg, time.Minute, "refused batches")
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	t.Logf("longest call %v", live.longest())
	if l := live.longest(); l >= postgres.DefaultCallTimeout {
		t.Errorf("a call took %v, its call timeout %v", l, postgres.DefaultCallTimeout)
	}

	for i, a := range acts {
		evs, err := s.ListEvents(ctx, store.ListEventsParams{Key: a.ActorKey, Limit: 1000})
		must(t, err, "ListEvents")
		turns, err := s.Transcript(ctx, store.TranscriptParams{Key: a.ActorKey, Limit: 1000})
		must(t, err, "Transcript")
		if len(evs) != rounds || len(turns) != rounds {
			t.Fatalf("turn session %d: %d events, %d turns, want %d of each", i, len(evs), len(turns), rounds)
		}
		for r, turn := range turns {
			if turn.EventID != evs[r].ID || len(turn.Messages) != 2 || turn.Messages[1].Content != "reply" ||
				turn.Messages[0].Content != fmt.Sprintf("t%d-%d", i, r) {
				t.Fatalf("turn session %d turn %d: %+v, want event %d's", i, r+1, turn, evs[r].ID)
			}
		}
	}
	for i, key := range plain {
		evs, err := s.ListEvents(ctx, store.ListEventsParams{Key: key, Limit: 1000})
		must(t, err, "ListEvents")
		if len(evs) != appends {
			t.Fatalf("plain session %d: %d events, want %d", i, len(evs), appends)
		}
		for j, e := range evs {
			if e.Seq != int64(j+1) || string(e.Payload) != fmt.Sprintf(`{"message":"p%d-%d"}`, i, j) {
				t.Fatalf("plain session %d event %d: seq %d payload %s", i, j, e.Seq, e.Payload)
			}
		}
	}
	if evs, _ := s.ListEvents(ctx, store.ListEventsParams{Key: dead, Limit: 10}); len(evs) != 0 {
		t.Fatalf("the destroyed session got %d events", len(evs))
	}
}

// TestPipeIdleConnectionDroppedIsPinged: the server drops the group
// commit's connection while it sits idle (its backend terminated, as a
// restart or an idle timeout would); once the pipe has been idle longer
// than pipeIdleCheck (a second), the next batch is preceded by a ping,
// which finds the connection dead: the batch goes out on a new connection
// and its appends succeed, instead of being sent into the dead one and
// failing with an error that leaves their outcome unknown. Twice: one
// append, then several at once.
func TestPipeIdleConnectionDroppedIsPinged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	tr := newPipeTracer()
	s, err := postgres.Open(ctx, dsn, postgres.WithTracer(tr))
	must(t, err, "Open")
	t.Cleanup(func() { _ = s.Close() })
	f := newFixtureOn(t, s)
	killer, err := pgx.Connect(ctx, dsn)
	must(t, err, "Connect")
	defer killer.Close(ctx)
	keys := make([]store.ActorKey, 6)
	for i := range keys {
		keys[i] = f.session(f.key.AgentUID)
	}
	o := newAttackOutcome()
	f.append("opens the pipe")
	for round, callers := range []int{1, len(keys)} {
		last := time.Now()
		_, pid, _ := tr.pipe()
		// The server sees the pipe's backend idle.
		var state string
		must(t, killer.QueryRow(ctx, `SELECT state FROM pg_stat_activity WHERE pid = $1 AND datname = current_database()`,
			int32(pid)).Scan(&state), "the pipe's backend in pg_stat_activity")
		if state != "idle" {
			t.Fatalf("round %d: the pipe's backend is %q, want idle", round, state)
		}
		var ok bool
		must(t, killer.QueryRow(ctx, `SELECT pg_terminate_backend($1, 10000)`, int32(pid)).Scan(&ok), "pg_terminate_backend")
		if !ok {
			t.Fatalf("round %d: the pipe's backend %d did not end", round, pid)
		}
		time.Sleep(time.Until(last.Add(1200 * time.Millisecond))) // idle past pipeIdleCheck
		var wg sync.WaitGroup
		for i := range callers {
			wg.Go(func() {
				payload := fmt.Sprintf(`{"message": "r%d-%d"}`, round, i)
				_, created, err := s.AppendEvent(ctx, store.AppendEventParams{Key: keys[i], Kind: abi.EventMessage, Payload: []byte(payload)})
				if err != nil || !created {
					t.Errorf("round %d: append after the idle connection was dropped: created %v, %v", round, created, err)
					return
				}
				o.ack(payload)
			})
		}
		waitWithin(t, &wg, 30*time.Second, "appends after the drop")
		if n := tr.pipes(); n != round+2 {
			t.Fatalf("round %d: %d connections of the group commit, want %d", round, n, round+2)
		}
		if _, newPID, _ := tr.pipe(); newPID == pid {
			t.Fatalf("round %d: the pipe's backend is still %d", round, pid)
		}
	}
	checkAttackedSessions(t, s, keys, o)
}

// TestPipeShortDeadlinesBreakNoBatch: callers whose contexts end within a
// few milliseconds share batches with callers without a deadline. A
// caller that gives up returns at its deadline; the batch it was in goes
// on under the call timeout. The callers without a deadline all succeed
// and the group commit keeps its one connection: a batch read under the
// deadline of its first request (as it once was) timed out, broke the
// connection under every batch in flight, and told callers that had all
// the time in the world that their appends' outcome was unknown.
func TestPipeShortDeadlinesBreakNoBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tr := newPipeTracer()
	s, err := postgres.Open(ctx, pgtest.DSN(t), postgres.WithTracer(tr))
	must(t, err, "Open")
	t.Cleanup(func() { _ = s.Close() })
	f := newFixtureOn(t, s)
	const senders, each = 16, 100
	keys := make([]store.ActorKey, senders)
	for i := range keys {
		keys[i] = f.session(f.key.AgentUID)
	}
	o := newAttackOutcome()
	var hurried atomic.Int64
	var wg sync.WaitGroup
	for i, key := range keys {
		wg.Go(func() {
			for j := range each {
				cctx, cancel := context.WithCancel(ctx)
				short := i%2 == 0
				if short {
					cctx, cancel = context.WithTimeout(ctx, time.Duration(500+rand.IntN(2000))*time.Microsecond)
				}
				payload := fmt.Sprintf(`{"message": "s%d-%d"}`, i, j)
				_, created, err := s.AppendEvent(cctx, store.AppendEventParams{Key: key, Kind: abi.EventMessage, Payload: []byte(payload)})
				cancel()
				switch {
				case err == nil && created:
					o.ack(payload)
				case short && err != nil:
					hurried.Add(1)
				default:
					t.Errorf("sender %d append %d, without a deadline: created %v, %v", i, j, created, err)
				}
			}
		})
	}
	waitWithin(t, &wg, time.Minute, "short deadlines")
	acked, _, _ := o.counts()
	t.Logf("%d appends acknowledged, %d callers gave up at their deadline; %d connections", acked, hurried.Load(), tr.pipes())
	if n := tr.pipes(); n != 1 {
		t.Errorf("the group commit opened %d connections, want 1: its connection broke", n)
	}
	checkAttackedSessions(t, s, keys, o)
}
