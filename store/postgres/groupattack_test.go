package postgres_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/url"
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

// attackOutcome is what one caller of the group commit was told.
type attackOutcome struct {
	mu sync.Mutex
	// acked: the payloads whose append returned created.
	acked map[string]bool
	// committed: the event ids whose commit returned a turn.
	committed map[int64]bool
	errs      int
}

func newAttackOutcome() *attackOutcome {
	return &attackOutcome{acked: map[string]bool{}, committed: map[int64]bool{}}
}

func (o *attackOutcome) ack(payload string) {
	o.mu.Lock()
	o.acked[payload] = true
	o.mu.Unlock()
}

func (o *attackOutcome) commit(eventID int64) {
	o.mu.Lock()
	o.committed[eventID] = true
	o.mu.Unlock()
}

func (o *attackOutcome) failed() {
	o.mu.Lock()
	o.errs++
	o.mu.Unlock()
}

// waitAll waits for wg, failing the test if its callers are still blocked
// after a generous liveness bound (not a timing assertion).
func waitAll(t *testing.T, wg *sync.WaitGroup, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("%s: callers still blocked after two minutes", what)
	}
}

// allPages reads every page of a paged list: page(after) returns the rows
// after the cursor, cursor gives a row's; it stops at an empty page.
func allPages[T any](t *testing.T, what string, page func(after int64) ([]T, error), cursor func(T) int64) []T {
	t.Helper()
	var all []T
	for {
		var after int64
		if len(all) > 0 {
			after = cursor(all[len(all)-1])
		}
		rows, err := page(after)
		must(t, err, what)
		if len(rows) == 0 {
			return all
		}
		all = append(all, rows...)
	}
}

// checkAttackedSessions checks, on a store that runs, what the callers
// were told against what the database holds: every acknowledged append is
// there exactly once, no payload is there twice, each session's seqs run
// 1..n without a gap (no half-written batch), every acknowledged commit's
// turn is there, and no event was committed as two turns.
func checkAttackedSessions(t *testing.T, s *postgres.Store, keys []store.ActorKey, o *attackOutcome) {
	t.Helper()
	ctx := context.Background()
	seen := map[string]int{}
	for i, key := range keys {
		evs := allPages(t, "ListEvents", func(after int64) ([]store.Event, error) {
			return s.ListEvents(ctx, store.ListEventsParams{Key: key, After: after, Limit: 1000})
		}, func(e store.Event) int64 { return e.ID })
		for j, e := range evs {
			if e.Seq != int64(j+1) {
				t.Fatalf("session %d event %d has seq %d: a gap", i, j, e.Seq)
			}
			seen[string(e.Payload)]++
		}
		turns := allPages(t, "Transcript", func(after int64) ([]store.Turn, error) {
			return s.Transcript(ctx, store.TranscriptParams{Key: key, AfterTurn: after, Limit: 1000})
		}, func(turn store.Turn) int64 { return turn.TurnNo })
		byEvent := map[int64]int64{}
		for _, turn := range turns {
			if prev, dup := byEvent[turn.EventID]; dup {
				t.Errorf("session %d: event %d committed as turns %d and %d", i, turn.EventID, prev, turn.TurnNo)
			}
			byEvent[turn.EventID] = turn.TurnNo
		}
		o.mu.Lock()
		for id := range o.committed {
			evOfSession := false
			for _, e := range evs {
				evOfSession = evOfSession || e.ID == id
			}
			if _, ok := byEvent[id]; evOfSession && !ok {
				t.Errorf("session %d: the commit of event %d was acknowledged but has no turn", i, id)
			}
		}
		o.mu.Unlock()
	}
	for p, n := range seen {
		if n > 1 {
			t.Errorf("payload %s appended %d times", p, n)
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for p := range o.acked {
		if seen[p] != 1 {
			t.Errorf("acknowledged append %s is there %d times, want once", p, seen[p])
		}
	}
}

// attackWorkers starts, on s, per session one appender (sequential
// appends with unique payloads) and, on half of the sessions, one turn
// loop (a dispatch on the locked path, then a commit that carries its
// payload, grouped); they run until stop ends, tolerate errors, and
// record what they were told in o. ctxOf gives each call its context.
// Only the group commit's calls (appends, commits) count as failed in o
// and are passed to onErr (nil: none); a dispatch that finds no event yet,
// or fails, waits a millisecond and tries again.
func attackWorkers(s *postgres.Store, acts []store.Activation, o *attackOutcome, stop context.Context,
	ctxOf func() (context.Context, context.CancelFunc), wg *sync.WaitGroup, onErr func(error)) {
	failed := func(err error) {
		o.failed()
		if onErr != nil {
			onErr(err)
		}
		time.Sleep(time.Millisecond)
	}
	for i, a := range acts {
		wg.Go(func() {
			for j := 0; stop.Err() == nil; j++ {
				payload := fmt.Sprintf(`{"message": "a%d-%d"}`, i, j)
				ctx, cancel := ctxOf()
				_, created, err := s.AppendEvent(ctx, store.AppendEventParams{Key: a.ActorKey, Kind: abi.EventMessage,
					Payload: []byte(payload)})
				cancel()
				switch {
				case err != nil:
					failed(err)
				case created:
					o.ack(payload)
				}
			}
		})
		if i%2 == 1 {
			continue
		}
		wg.Go(func() {
			for stop.Err() == nil {
				ctx, cancel := ctxOf()
				d, err := s.NextDelivery(ctx, store.NextDeliveryParams{Activation: a.Ref(), DeliveryID: uuid.NewString(),
					Binding: "sha256:test", MarkSent: true})
				cancel()
				if err != nil {
					// No event yet, or the dispatch (not grouped) failed.
					time.Sleep(time.Millisecond)
					continue
				}
				ctx, cancel = ctxOf()
				turn, err := s.CommitTurn(ctx, store.CommitTurnParams{Ref: d.Delivery.TurnRef(), Outcome: abi.OutcomeOK,
					KeepState: true, Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "reply"}},
					Payloads: []string{string(d.Event.Payload)}})
				cancel()
				if err != nil {
					failed(err)
					continue
				}
				o.commit(turn.EventID)
			}
		})
	}
}

// TestGroupAttackConnectionKilledMidBatch: while appends and turns of
// many sessions go through the group commit, another connection keeps
// terminating the store's backends (pg_terminate_backend), so batches die
// mid-flight. Every caller returns; whatever a caller was told it got is
// there exactly once, nothing is there twice (a killed batch rolled back
// and reran solo, or was reported, never both), no session's seqs have a
// gap (no half-written batch), no event is committed as two turns; and
// once the killing stops the store works again.
func TestGroupAttackConnectionKilledMidBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	s, err := postgres.Open(ctx, dsn)
	must(t, err, "Open")
	t.Cleanup(func() { _ = s.Close() })
	f := newFixtureOn(t, s)
	acts := liveSessions(f, 12)
	killer, err := pgx.Connect(ctx, dsn)
	must(t, err, "Connect")
	defer killer.Close(ctx)

	o := newAttackOutcome()
	stop, cancelStop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	attackWorkers(s, acts, o, stop, func() (context.Context, context.CancelFunc) { return context.WithCancel(ctx) }, &wg, nil)
	var killed int64
	for range 40 {
		var n int64
		must(t, killer.QueryRow(ctx, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend') k`).Scan(&n),
			"pg_terminate_backend")
		killed += n
		time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond) // spreads the kills; asserts nothing
	}
	cancelStop()
	waitAll(t, &wg, "connection killed")
	if killed == 0 || o.errs == 0 {
		t.Fatalf("killed %d backends, callers saw %d errors: the attack did not land", killed, o.errs)
	}
	t.Logf("killed %d backends; %d appends, %d commits acknowledged, %d errors", killed, len(o.acked), len(o.committed), o.errs)

	// The store recovers: a fresh append and turn go through.
	keys := make([]store.ActorKey, len(acts))
	for i, a := range acts {
		keys[i] = a.ActorKey
	}
	f.key = keys[0]
	f.append("after the kills")
	checkAttackedSessions(t, s, keys, o)
}

// TestGroupAttackCancelledCallersAndClose: callers whose contexts end at
// random moments (before their request went out, while their batch is in
// flight) share batches with callers that wait; then the store closes
// while batches are in flight. Every caller returns; a caller that was
// told its append or commit went through finds it there exactly once on a
// store reopened on the same database, and nothing is there twice.
func TestGroupAttackCancelledCallersAndClose(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	s, err := postgres.Open(ctx, dsn)
	must(t, err, "Open")
	f := newFixtureOn(t, s)
	acts := liveSessions(f, 16)

	o := newAttackOutcome()
	stop, cancelStop := context.WithCancel(ctx)
	defer cancelStop()
	var wg sync.WaitGroup
	var calls atomic.Int64
	attackWorkers(s, acts, o, stop, func() (context.Context, context.CancelFunc) {
		// One call in three has a context that ends soon, at a random
		// moment of its request's life.
		if calls.Add(1)%3 == 0 {
			return context.WithTimeout(ctx, time.Duration(rand.IntN(3000))*time.Microsecond)
		}
		return context.WithCancel(ctx)
	}, &wg, nil)
	// Let the workers run until a few hundred calls went through, then
	// close the store under them.
	for calls.Load() < 600 {
		time.Sleep(10 * time.Millisecond)
	}
	must(t, s.Close(), "Close")
	cancelStop()
	waitAll(t, &wg, "store closed")
	t.Logf("%d calls; %d appends, %d commits acknowledged, %d errors", calls.Load(), len(o.acked), len(o.committed), o.errs)

	s2, err := postgres.Open(ctx, dsn)
	must(t, err, "Open again")
	t.Cleanup(func() { _ = s2.Close() })
	keys := make([]store.ActorKey, len(acts))
	for i, a := range acts {
		keys[i] = a.ActorKey
	}
	checkAttackedSessions(t, s2, keys, o)
}

// fatalProxy forwards PostgreSQL connections to target and, once armed,
// replaces the next ReadyForQuery that follows a data row with an
// ErrorResponse of severity FATAL (or nothing, when silent) and closes the
// connection: what a
// backend sends when the postmaster makes it quit (SQLSTATE 57P02, a crash
// of another backend; 57P01, a fast shutdown) after its transaction
// committed but before it said so. The server has committed; the client
// is told FATAL.
type fatalProxy struct {
	ln     net.Listener
	target string
	armed  atomic.Bool
	fired  atomic.Int64
	// silent: close the connection instead of sending FATAL.
	silent atomic.Bool
}

// newFatalProxy starts a proxy to dsn's server and returns it with a DSN
// that goes through it; it stops with the test.
func newFatalProxy(t *testing.T, dsn string) (*fatalProxy, string) {
	t.Helper()
	u, err := url.Parse(dsn)
	must(t, err, "parse DSN")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err, "Listen")
	p := &fatalProxy{ln: ln, target: u.Host}
	t.Cleanup(func() { _ = ln.Close() })
	go p.serve()
	u.Host = ln.Addr().String()
	// The proxy reads the server's bytes as protocol messages from the
	// first; the one-byte answer to an SSLRequest (sslmode prefer, a
	// DATABASE_URL's default) is not one, and the proxy would wait for the
	// rest of it until the test's deadline.
	q := u.Query()
	q.Set("sslmode", "disable")
	u.RawQuery = q.Encode()
	return p, u.String()
}

func (p *fatalProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.handle(c)
	}
}

// fatalAfterCommit is the ErrorResponse the proxy sends instead of a
// ReadyForQuery.
var fatalAfterCommit = func() []byte {
	var fields []byte
	for _, f := range []struct {
		code byte
		v    string
	}{{'S', "FATAL"}, {'V', "FATAL"}, {'C', "57P02"}, {'M', "terminating connection because of crash of another server process"}} {
		fields = append(append(append(fields, f.code), f.v...), 0)
	}
	fields = append(fields, 0)
	msg := []byte{'E', 0, 0, 0, 0}
	binary.BigEndian.PutUint32(msg[1:], uint32(4+len(fields)))
	return append(msg, fields...)
}()

func (p *fatalProxy) handle(c net.Conn) {
	defer c.Close()
	srv, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer srv.Close()
	go func() {
		_, _ = io.Copy(srv, c)
		_ = srv.Close()
	}()
	r := bufio.NewReader(srv)
	sawRow := false
	for {
		msg := make([]byte, 5)
		if _, err := io.ReadFull(r, msg); err != nil {
			return
		}
		body := make([]byte, int(binary.BigEndian.Uint32(msg[1:]))-4)
		if _, err := io.ReadFull(r, body); err != nil {
			return
		}
		switch msg[0] {
		case 'D':
			sawRow = true
		case 'Z':
			if sawRow && p.armed.CompareAndSwap(true, false) {
				p.fired.Add(1)
				if !p.silent.Load() {
					_, _ = c.Write(fatalAfterCommit)
				}
				return
			}
			sawRow = false
		}
		if _, err := c.Write(append(msg, body...)); err != nil {
			return
		}
	}
}

// TestGroupCommitFatalAfterCommitIsNotRerun: a grouped append whose batch
// committed but whose connection then reported FATAL (the postmaster
// making backends quit: a crash of another backend, an immediate or fast
// shutdown) must not run again on its own path: the batch may have
// committed, so the event would be there twice. The caller may get an
// error, but the event is there exactly once.
func TestGroupCommitFatalAfterCommitIsNotRerun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	p, proxied := newFatalProxy(t, dsn)
	s, err := postgres.Open(ctx, proxied)
	must(t, err, "Open")
	t.Cleanup(func() { _ = s.Close() })
	f := newFixtureOn(t, s)
	f.append("warm-up")

	p.armed.Store(true)
	_, created, err := s.AppendEvent(ctx, store.AppendEventParams{Key: f.key, Kind: abi.EventMessage,
		Payload: []byte(`{"message": "once"}`)})
	if p.fired.Load() != 1 {
		t.Fatalf("the proxy fired %d times, want once", p.fired.Load())
	}
	t.Logf("append after a FATAL: created %v, err %v", created, err)
	evs, err := s.ListEvents(ctx, store.ListEventsParams{Key: f.key, Limit: 10})
	must(t, err, "ListEvents")
	n := 0
	for _, e := range evs {
		if string(e.Payload) == `{"message": "once"}` {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("the append is there %d times, want once (its batch committed; it must not run again)", n)
	}
}

// TestFatalAfterCommitIsNotExplainedAsARefusal: an activation claim that
// carries its first turn's claim, and a commit that carries the next
// turn's claim, whose transaction committed but whose connection then
// reported FATAL (or closed), are not run again without the claim they carried — with
// the group commit and without. Run again, the claim found its own
// activation live and the commit its own turn done, and the caller was
// told a live activation exists or its turn was superseded when both were
// written; a connection failure's outcome is unknown to its caller, and
// is reported as such.
func TestFatalAfterCommitIsNotExplainedAsARefusal(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ grouped, silent bool }{{true, false}, {false, false}, {true, true}, {false, true}} {
		grouped := c.grouped
		t.Run(fmt.Sprintf("grouped=%v,closed=%v", c.grouped, c.silent), func(t *testing.T) {
			ctx := context.Background()
			p, proxied := newFatalProxy(t, pgtest.DSN(t))
			p.silent.Store(c.silent)
			var opts []postgres.Option
			if !grouped {
				opts = append(opts, postgres.WithoutGroupCommit())
			}
			s, err := postgres.Open(ctx, proxied, opts...)
			must(t, err, "Open")
			t.Cleanup(func() { _ = s.Close() })
			f := newFixtureOn(t, s)
			f.append("warm")
			d := f.next(f.claim(time.Hour))
			expect := &store.ExpectedBinding{Agent: d.Agent, Binding: "sha256:test"}
			first := func(key store.ActorKey) store.ClaimActivationParams {
				cp := store.ClaimActivationParams{Key: key, UID: uuid.NewString(), LeaseID: uuid.NewString(),
					HostID: "host", LeaseTTL: time.Hour}
				cp.First = &store.NextDeliveryParams{Activation: store.ActivationRef{UID: cp.UID, ActorKey: key,
					ActorEpoch: 1, LeaseID: cp.LeaseID}, DeliveryID: uuid.NewString(), MarkSent: true,
					ExpectDue: true, Expect: expect}
				return cp
			}

			// A claim with its first turn, told FATAL after its commit.
			f.key = f.session(f.key.AgentUID)
			f.append("one")
			p.armed.Store(true)
			_, err = s.ClaimActivation(ctx, first(f.key))
			if p.fired.Load() != 1 {
				t.Fatalf("the proxy fired %d times, want once", p.fired.Load())
			}
			if errors.Is(err, store.ErrActivationLive) {
				t.Errorf("a claim that committed was told: %v", err)
			}

			// A commit with the next turn's claim, told FATAL after its
			// commit.
			f.key = f.session(f.key.AgentUID)
			f.append("two")
			f.append("three")
			a, err := s.ClaimActivation(ctx, first(f.key))
			must(t, err, "ClaimActivation")
			if a.First == nil {
				t.Fatal("the claim took no first turn")
			}
			p.armed.Store(true)
			_, err = s.CommitTurn(ctx, store.CommitTurnParams{Ref: a.First.Delivery.TurnRef(), Outcome: abi.OutcomeOK,
				KeepState: true, Payloads: []string{string(a.First.Event.Payload)},
				Next: &store.NextDeliveryParams{Activation: a.Ref(), DeliveryID: uuid.NewString(), MarkSent: true,
					ExpectDue: true, Expect: expect}})
			if p.fired.Load() != 2 {
				t.Fatalf("the proxy fired %d times, want twice", p.fired.Load())
			}
			var fe *store.FenceError
			if errors.As(err, &fe) {
				t.Errorf("a commit that committed was told: %v", err)
			}
			turns, err := s.Transcript(ctx, store.TranscriptParams{Key: f.key, Limit: 10})
			must(t, err, "Transcript")
			if len(turns) != 1 {
				t.Fatalf("%d turns, want the one committed", len(turns))
			}
		})
	}
}

// TestGroupAttackHammerHasNoDeadlocks is TestLifecycleHammerHasNoDeadlocks
// with the turn loop on the group commit's paths: activation claims that
// carry their first turn, one-statement dispatches (with an expectation)
// and commits that carry their payloads, batched with the appends, while
// steers, cancels, redrives, sleeps, wakes, failures, alarm firings and
// destroys run on their own paths against the same sessions. PostgreSQL
// must never detect a deadlock, and every event must end consistent.
func TestGroupAttackHammerHasNoDeadlocks(t *testing.T) { lifecycleHammer(t, true) }
